"""One cohort: its compact members, their waiters, and the state machine's callbacks.

A cohort is a model of the shared :data:`~genrm_trio.engine.machine.MACHINE`. It keeps only what
scoring and replay need (docs/differences.md, D22): per member the answer and reasoning texts,
the response digest, the rubric ids and the baseline digest; the request bodies stay with their
HTTP handlers.
Once terminal, the members are dropped and the :class:`~genrm_trio.domain.records.TerminalRecord`
is the only source of replies.

A waiter is a token in its member's list (counted, and removed when its request goes away);
every waiting request of a cohort waits on the cohort's one ``released`` event, after the release
has put its slot's outcome in the token, so a held request costs no event of its own.
Outcomes are decided when the cohort enters a terminal state; waiters are released later, by the
cohort's run task, after the durable store has committed the record.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol, assert_never, final

import trio
from transitions import EventData

from genrm_trio.domain.model import (
    FailureKind,
    GroupFailed,
    Masked,
    MemberOutcome,
    Rejection,
    RequestRejected,
    Scored,
    Unavailable,
)
from genrm_trio.domain.records import COMPRESS_FROM, MemberRecord, TerminalRecord, compressed
from genrm_trio.domain.text import ID_LOGGED_LIMIT, shown_id
from genrm_trio.engine import machine

if TYPE_CHECKING:
    from genrm_trio.engine.machine import State

__all__ = [
    "LEGACY_SUFFIX",
    "REASON_LIMIT",
    "Cohort",
    "CohortHost",
    "Member",
    "Waiter",
    "with_legacy_suffix",
]

LEGACY_SUFFIX: Final = (
    " This legacy group has failed; retry requires a fresh _ng_group_id shared by every member."
    " Reusing the task/prompt key could mix delayed answers with a replacement group."
)
REASON_LIMIT: Final = 2000  # failsafe rows keep the first 2000 characters


def with_legacy_suffix(message: str) -> str:
    """``message`` plus the legacy advice, cut so that the advice survives 2000 chars."""
    return message[: REASON_LIMIT - len(LEGACY_SUFFIX)] + LEGACY_SUFFIX


@final
class Waiter:
    """One attached request, a token in its member's waiter list.

    It waits on ``Cohort.released``; :meth:`Cohort.release` hands it its ``outcome`` first.
    """

    __slots__ = ("outcome",)

    def __init__(self) -> None:
        self.outcome: MemberOutcome | None = None


def _pack_texts(reasoning: str, answer: str) -> tuple[str, str] | bytes:
    """Long texts as one zlib blob (:func:`compressed`), short ones as they are."""
    if len(reasoning) + len(answer) < COMPRESS_FROM:  # too short in bytes too: skip encoding
        return reasoning, answer
    # surrogatepass: a JSON body may carry lone surrogates, and they must come back exactly
    head = reasoning.encode("utf-8", "surrogatepass")
    packed = compressed(b"%d:" % len(head) + head + answer.encode("utf-8", "surrogatepass"))
    return (reasoning, answer) if packed is None else packed


def _unpack_texts(packed: tuple[str, str] | bytes) -> tuple[str, str]:
    if type(packed) is tuple:
        return packed
    assert type(packed) is bytes
    data = zlib.decompress(packed)
    size, _, rest = data.partition(b":")
    cut = int(size)
    return (
        rest[:cut].decode("utf-8", "surrogatepass"),
        rest[cut:].decode("utf-8", "surrogatepass"),
    )


@final
class Member:
    """One rollout slot, compacted to what scoring and replay need.

    Long reasoning and answer texts wait for the group zlib-compressed: a reasoning model's trace
    is tens of kilobytes, and up to `server.max_active_cohorts` groups of them wait in memory.
    They are read once, when the cohort is judged (:meth:`texts`).
    """

    __slots__ = (
        "_texts",
        "baseline_digest",
        "index",
        "response_digest",
        "rubric_ids",
        "waiters",
    )

    def __init__(
        self,
        *,
        index: int,
        response_digest: str,
        answer_text: str,
        reasoning_text: str,
        rubric_ids: tuple[int, ...] | None,
        baseline_digest: str | None,
    ) -> None:
        self.index = index
        self.response_digest = response_digest
        self._texts = _pack_texts(reasoning_text, answer_text)
        self.rubric_ids = rubric_ids
        self.baseline_digest = baseline_digest
        self.waiters: list[Waiter] = []

    def texts(self) -> tuple[str, str]:
        """(reasoning text, answer text), exactly as given."""
        return _unpack_texts(self._texts)


class CohortHost(Protocol):
    """The registry side of a cohort's state changes."""

    def cohort_state_changed(self, cohort: Cohort, source: str, dest: str) -> None: ...

    def cohort_terminal(self, cohort: Cohort) -> None: ...


@final
class Cohort:
    """One `/verify` cohort. Identity equality: never ``==`` by content."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(
        self,
        *,
        key: str,
        group_id: str | None,
        group_attempt: int,
        prompt_digest: str,
        size: int,
        history: Sequence[Mapping[str, str]],
        principle: str | None,
        baseline: str | None,
        baseline_digest: str | None,
        rubric_ids: tuple[int, ...] | None,
        created_at: float,
        collect_deadline: float,
        host: CohortHost,
        state: State = "collecting",
        record: TerminalRecord | None = None,
    ) -> None:
        self.key = key
        self.group_id = group_id
        self.group_attempt = group_attempt
        self.prompt_digest = prompt_digest
        self.size = size
        self.history = [dict(item) for item in history]
        self.principle = principle  # the request principle (None or text), from the first member
        self.baseline = baseline
        self.baseline_digest = baseline_digest
        self.rubric_ids = rubric_ids
        self.created_at = created_at
        self.collect_deadline = collect_deadline
        self.eval_deadline: float | None = None
        self.complete_at: float | None = None  # when the last member arrived (`judging`)
        self.terminal_at: float | None = None
        self.state: str = state
        self.members: dict[int, Member] = {}
        self.record = record
        self.scope = trio.CancelScope()  # the run task's scope: cancelled when terminal
        self.full = trio.Event()  # set on entering `judging`
        self.arrival = trio.Event()  # set when a member is added; the run task renews it
        self.released = trio.Event()  # set once the terminal record is committed and waiters woken
        self.comparisons_total = 0
        self.comparisons_done = 0
        self.comparisons_failed = 0
        self._host = host
        # the 503 reason of a failure, which the terminal record does not keep (a restored
        # failure is a failed group)
        self.unavailable: Unavailable = "group_failed"
        if record is not None:
            self.released.set()

    def __repr__(self) -> str:
        key = shown_id(self.key, ID_LOGGED_LIMIT)
        return f"<Cohort key={key} state={self.state} members={len(self.members)}>"

    @property
    def legacy(self) -> bool:
        return self.group_id is None

    @property
    def terminal(self) -> bool:
        return machine.is_terminal(self.state)

    @property
    def waiter_count(self) -> int:
        return sum(len(m.waiters) for m in self.members.values())

    def add_member(self, member: Member) -> None:
        """Register a new member and wake the run task (it may start the member's comparisons)."""
        self.members[member.index] = member
        self.arrival.set()

    def fail(
        self, kind: FailureKind, message: str, *, reason: Unavailable = "group_failed"
    ) -> bool:
        """collecting | judging → failed with this failure; False once terminal (a no-op)."""
        return machine.fail(self, failure=GroupFailed(kind, message, reason))

    # --- the replay/conflict matrix (docs/architecture.md, "Keys, digests and replay") --------

    def attach(self, member: Member, digest: str) -> Waiter | MemberOutcome:
        """One request for slot ``member.index`` with prompt digest ``digest``: a waiter on this
        cohort, or the outcome it replays. Raises RequestRejected (conflict) for a different
        prompt, a different response in a taken slot, or a new slot once the group is complete.
        Synchronous (the engine's registry section)."""
        index = member.index
        if self.prompt_digest != digest:
            raise self._conflict("received inconsistent prompt or principle content")
        state = self.state
        if state == "failed":
            return self.failure_outcome()
        if self.terminal:
            assert self.record is not None
            record = self.record.members.get(index)
            if record is None:
                raise self._cannot_add(index)
            if not record.masked_alone and record.response_digest != member.response_digest:
                raise self._conflict(f"already has a different response for rollout_index={index}")
            return self.outcome_of(record)
        present = self.members.get(index)
        waiter = Waiter()
        if present is not None:
            if present.response_digest != member.response_digest:
                raise self._conflict(f"already has a different response for rollout_index={index}")
            present.waiters.append(waiter)
            return waiter
        if state != "collecting":
            raise self._cannot_add(index)
        member.waiters.append(waiter)
        self.add_member(member)
        machine.start_judging(self)  # guarded by is_full: a no-op until all N are present
        return waiter

    def _conflict(self, what: str) -> RequestRejected:
        """A 409 of `attach`: "GenRM cohort <key> <what>"."""
        return RequestRejected(Rejection.CONFLICT, f"GenRM cohort {shown_id(self.key)} {what}")

    def _cannot_add(self, index: int) -> RequestRejected:
        """A new slot once the group is complete (or terminal)."""
        return self._conflict(
            f"is already {machine.wire_phase(self.state)}; rollout_index={index} cannot be added"
        )

    # --- state machine callbacks (named in machine.STATES / TRANSITIONS) ----------------------

    def is_full(self, event: EventData) -> bool:
        return len(self.members) == self.size

    def has_masked_members(self, event: EventData) -> bool:
        outcomes: Mapping[int, MemberOutcome] = event.kwargs["outcomes"]
        return any(isinstance(o, Masked) for o in outcomes.values())

    def on_enter_judging(self, event: EventData) -> None:
        self.complete_at = trio.current_time()
        self.full.set()

    def on_enter_terminal(self, event: EventData) -> None:
        failure: GroupFailed | None = event.kwargs.get("failure")
        if failure is not None:
            self.record = TerminalRecord(
                key=self.key,
                group_id=self.group_id,
                group_attempt=self.group_attempt,
                legacy=self.legacy,
                prompt_digest=self.prompt_digest,
                phase="failed",
                failure=failure.message,
                failure_kind=failure.kind,
            )
            self.unavailable = failure.reason
        else:
            outcomes: Mapping[int, Scored | Masked] = event.kwargs["outcomes"]
            members: dict[int, MemberRecord] = {}
            for index in sorted(outcomes):
                outcome = outcomes[index]
                digest = self.members[index].response_digest
                if isinstance(outcome, Scored):
                    members[index] = MemberRecord(digest, result=outcome.result)
                else:
                    members[index] = MemberRecord(
                        digest, masked_alone=True, failure_reason=outcome.reason
                    )
            self.record = TerminalRecord(
                key=self.key,
                group_id=self.group_id,
                group_attempt=self.group_attempt,
                legacy=self.legacy,
                prompt_digest=self.prompt_digest,
                phase="completed",
                members=members,
            )
        self.terminal_at = trio.current_time()
        self.scope.cancel()  # wakes the run task (timer or evaluation) to finalize
        self._host.cohort_terminal(self)

    def on_state_changed(self, event: EventData) -> None:
        assert event.transition is not None
        if event.transition.dest is None:  # an internal transition: the state did not change
            return
        self._host.cohort_state_changed(self, event.transition.source, str(event.transition.dest))

    # --- replies ----------------------------------------------------------------------------

    def failure_outcome(self) -> GroupFailed:
        """The recorded failure as a reply (legacy advice appended; docs/architecture.md)."""
        assert self.record is not None and self.record.phase == "failed"
        message = self.record.failure or "GenRM cohort evaluation failed"
        if self.legacy:
            message = with_legacy_suffix(message)
        return GroupFailed(self.record.failure_kind or "cohort", message, self.unavailable)

    def member_outcome(self, index: int) -> MemberOutcome:
        """The terminal outcome of slot ``index`` (requires a terminal record)."""
        record = self.record
        assert record is not None
        match record.phase:  # exhaustive: mypy fails here until a new phase has its case
            case "failed":
                return self.failure_outcome()
            case "completed":
                return self.outcome_of(record.members[index])
            case _:
                assert_never(record.phase)

    def outcome_of(self, member: MemberRecord) -> MemberOutcome:
        """The reply of one member record of this (completed) cohort."""
        if member.masked_alone:
            assert member.failure_reason is not None
            reason = member.failure_reason
            return Masked(with_legacy_suffix(reason) if self.legacy else reason)
        assert member.result is not None
        return Scored(member.result)

    def release(self) -> int:
        """Hand every waiter its outcome, drop the members, wake the waiters, then compact the
        record for retention (the waiters never read it again).

        Returns the number of waiters woken.
        """
        assert self.record is not None
        woken = 0
        for index, member in self.members.items():
            if member.waiters:
                outcome = self.member_outcome(index)
                for waiter in member.waiters:
                    waiter.outcome = outcome
                woken += len(member.waiters)
                member.waiters.clear()
        self.members.clear()
        self.history = []
        self.released.set()
        self.record = self.record.compacted()
        return woken
