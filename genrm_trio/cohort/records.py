"""Plain records of cohort state: what the durable store commits and a checkpoint exports.

A :class:`TerminalRecord` is built once, when a cohort reaches a terminal state, and is the only
thing a replay reads afterwards: the same record serves the in-memory registry, the durable
store (SPEC §17.11) and checkpoint v1 (§17.12). Records hold no timestamps; the store stamps
wall-clock times itself and the registry keeps monotonic ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, final

from genrm_trio.model import FailureKind, JSONValue

__all__ = [
    "CohortStore",
    "MemberRecord",
    "OpenRecord",
    "TerminalRecord",
    "WatermarkRecord",
]


@final
@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member of a completed cohort: exactly one of ``result`` or ``masked_alone``."""

    response_digest: str
    result: Mapping[str, JSONValue] | None = None  # every non-echo key of its success row
    masked_alone: bool = False
    failure_reason: str | None = None  # the §9.7 member reason when masked_alone

    def __post_init__(self) -> None:
        if (self.result is None) == (not self.masked_alone):
            raise ValueError("a member record holds exactly one of result or masked_alone")
        if self.masked_alone and not self.failure_reason:
            raise ValueError("a masked member record needs its failure_reason")


@final
@dataclass(frozen=True, slots=True)
class TerminalRecord:
    """A cohort's end: per-member outcomes for ``completed``, the failure for ``failed``.

    Failed cohorts carry no members: their failure answers every later request of the key.
    """

    key: str
    group_id: str | None
    group_attempt: int
    legacy: bool
    prompt_digest: str
    phase: Literal["completed", "failed"]
    failure: str | None = None
    failure_kind: FailureKind | None = None
    members: Mapping[int, MemberRecord] = field(default_factory=dict)

    @property
    def masked(self) -> int:
        """How many members were masked alone."""
        return sum(1 for m in self.members.values() if m.masked_alone)

    @property
    def state(self) -> Literal["scored", "partially_masked", "failed"]:
        """The internal state machine name of this outcome."""
        if self.phase == "failed":
            return "failed"
        return "partially_masked" if self.masked else "scored"

    @property
    def retained(self) -> bool:
        """Whether the registry keeps this record for replay (SPEC §8.7, D33).

        A completed legacy cohort without masked members is deleted at publish; a store should
        then drop its ``open`` record and keep nothing.
        """
        return not (self.legacy and self.phase == "completed" and not self.masked)


@final
@dataclass(frozen=True, slots=True)
class OpenRecord:
    """Commit point 2 of SPEC §17.11: a cohort was created."""

    key: str
    group_id: str | None
    group_attempt: int
    legacy: bool
    prompt_digest: str


@final
@dataclass(frozen=True, slots=True)
class WatermarkRecord:
    """Commit point 1 of SPEC §17.11: the newest attempt of an explicit group."""

    group_id: str
    latest_attempt: int
    prompt_digest: str


class CohortStore(Protocol):
    """Durable state hooks, awaited at the three commit points of SPEC §17.11.

    The engine shields each call from cancellation and holds its registry lock around the first
    two, so a store sees the same order as the registry. ``commit_terminal`` replaces the
    cohort's ``open`` record in one transaction and completes before any waiter is released.
    An exception from a hook is a bug (the request that hit it gets a 500; a terminal commit
    failure is logged and the waiters are still released so that no request hangs).
    """

    async def commit_watermark(self, record: WatermarkRecord) -> None: ...

    async def commit_open(self, record: OpenRecord) -> None: ...

    async def commit_terminal(self, record: TerminalRecord) -> None: ...
