"""Plain records of cohort state: what the durable store commits and a checkpoint exports.

A :class:`TerminalRecord` is built once, when a cohort reaches a terminal state, and is the only
thing a replay reads afterwards: the same record serves the in-memory registry, the durable
store (SPEC §17.11) and checkpoint v1 (§17.12). Records hold no timestamps; the store stamps
wall-clock times itself and the registry keeps monotonic ones.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Literal, Protocol, final, runtime_checkable

import trio

from genrm_trio.model import FailureKind, JSONValue

__all__ = [
    "CohortStore",
    "Commit",
    "CommitsBySubmit",
    "MemberRecord",
    "OpenRecord",
    "PackedResult",
    "QueuedCohortStore",
    "SerialCommits",
    "TerminalRecord",
    "WatermarkRecord",
    "compact_json",
    "queued",
    "result_dict",
    "result_json",
]


_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def compact_json(value: object) -> str:
    """The project's one JSON text form (replies, packed results, the store): compact, ASCII
    (lone surrogates as ``\\uXXXX``). Raises ValueError for NaN and infinities."""
    return _ENCODER.encode(value)


_COMPRESS_FROM: Final = 512  # bytes of JSON; smaller results are kept as plain JSON


@final
class PackedResult(Mapping[str, JSONValue]):
    """A scored member's result row, held for replay as its compact JSON text (zlib-compressed
    when that pays).

    Retained records are most of a long run's memory (the shipped cap keeps 4,096 cohorts, and
    every member's result carries its answer and reasoning texts): as a dict of ~20 keys with
    its floats and strings a member took ~2.2 KB with 1,000-character answers, as packed JSON
    ~0.8 KB. Reading it decodes the JSON again (``unpack()`` once, not per key); ``json_text()``
    gives the JSON as stored, for writers that splice it without decoding. Equality is that of
    the decoded mappings. A result JSON cannot hold (NaN) stays a plain dict, so that the
    store's own check reports it.
    """

    __slots__ = ("_compressed", "_data")

    def __init__(self, result: Mapping[str, JSONValue]) -> None:
        text = compact_json(dict(result)).encode("ascii")
        packed = zlib.compress(text, 1) if len(text) >= _COMPRESS_FROM else text
        self._compressed = len(packed) < len(text)
        self._data = packed if self._compressed else text

    @staticmethod
    def of(result: Mapping[str, JSONValue]) -> Mapping[str, JSONValue]:
        """``result`` packed, or as it is when it is packed already or not JSON."""
        if type(result) is PackedResult:
            return result
        try:
            return PackedResult(result)
        except (TypeError, ValueError):
            return result

    def json_text(self) -> str:
        """The compact ASCII JSON object this result was packed from."""
        data = zlib.decompress(self._data) if self._compressed else self._data
        return data.decode("ascii")

    def unpack(self) -> dict[str, Any]:
        """A fresh dict of the result (floats, ints and strings exactly as packed)."""
        value: dict[str, Any] = json.loads(self.json_text())
        return value

    def __getitem__(self, key: str) -> JSONValue:
        return self.unpack()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.unpack())

    def __len__(self) -> int:
        return len(self.unpack())

    def __eq__(self, other: object) -> bool:
        if type(other) is PackedResult and self._data == other._data:
            return True
        if isinstance(other, Mapping):
            return self.unpack() == (other.unpack() if type(other) is PackedResult else other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedResult({self.unpack()!r})"


def result_dict(result: Mapping[str, JSONValue]) -> dict[str, Any]:
    """A plain dict of a result mapping (one decode for a :class:`PackedResult`)."""
    return result.unpack() if type(result) is PackedResult else dict(result)


def result_json(result: Mapping[str, JSONValue]) -> str:
    """A result mapping as :func:`compact_json` text (as stored, for a :class:`PackedResult`)."""
    return result.json_text() if type(result) is PackedResult else compact_json(dict(result))


@final
@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member of a completed cohort: exactly one of ``result`` or ``masked_alone``.

    ``result`` is kept as a :class:`PackedResult` whatever mapping it was given.
    """

    response_digest: str
    result: Mapping[str, JSONValue] | None = None  # every non-echo key of its success row
    masked_alone: bool = False
    failure_reason: str | None = None  # the §9.7 member reason when masked_alone

    def __post_init__(self) -> None:
        if (self.result is None) == (not self.masked_alone):
            raise ValueError("a member record holds exactly one of result or masked_alone")
        if self.masked_alone and not self.failure_reason:
            raise ValueError("a masked member record needs its failure_reason")
        if self.result is not None:
            object.__setattr__(self, "result", PackedResult.of(self.result))


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
    """Durable state hooks, one per commit point of SPEC §17.11 (the simple form).

    Each hook returns once its record is committed. A store with only these hooks is driven
    through :class:`SerialCommits`, which runs them one at a time in submission order; a store
    that can queue commits itself implements :class:`QueuedCohortStore` as well.
    ``commit_terminal`` replaces the cohort's ``open`` record in one transaction. An exception
    from a hook is a bug (the request that hit it gets a 500; a terminal commit failure is
    logged and the waiters are still released so that no request hangs).
    """

    async def commit_watermark(self, record: WatermarkRecord) -> None: ...

    async def commit_open(self, record: OpenRecord) -> None: ...

    async def commit_terminal(self, record: TerminalRecord) -> None: ...


class Commit(Protocol):
    """A queued commit. ``wait()`` returns once it is committed (raising what it failed with);
    it is shielded from cancellation, and any number of tasks may wait, any number of times."""

    async def wait(self) -> None: ...


@runtime_checkable
class QueuedCohortStore(CohortStore, Protocol):
    """A store that queues commits synchronously: the engine's fast path.

    Contract of the ``submit_*`` methods: they never await; the commit is queued when the call
    returns, and the store applies queued commits **in submission order** (later ones may share
    a transaction with earlier ones, never precede them). The engine submits the watermark and
    ``open`` records while it holds its registry lock, so the store sees them in registry order,
    then releases the lock and waits for the returned :class:`Commit` before it attaches the
    request; a cohort's terminal record is submitted after its ``open`` record, so FIFO order
    makes every prefix of the store's history consistent. The engine waits for every commit it
    submits (a store may rely on a waiter to drive its queue). A ``submit_*`` call may raise
    (say, the store is closed): that is the request's error, like a failed commit.
    ``commit_many`` applies terminal records and watermarks in one transaction (a checkpoint
    restore, SPEC §17.12), in order after everything submitted before it.
    """

    def submit_watermark(self, record: WatermarkRecord) -> Commit: ...

    def submit_open(self, record: OpenRecord) -> Commit: ...

    def submit_terminal(self, record: TerminalRecord) -> Commit: ...

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None: ...


@final
class _SerialCommit:
    """One hook call of :class:`SerialCommits`: runs once, after its predecessor finished."""

    __slots__ = ("_call", "_done", "_error", "_previous", "_started")

    def __init__(self, call: Callable[[], Awaitable[None]], previous: _SerialCommit | None) -> None:
        self._call: Callable[[], Awaitable[None]] | None = call
        self._previous = previous
        self._started = False
        self._done = trio.Event()
        self._error: Exception | None = None

    async def wait(self) -> None:
        with trio.CancelScope(shield=True):
            if self._started:
                await self._done.wait()
            else:
                self._started = True
                previous, self._previous = self._previous, None
                if previous is not None:
                    await previous._finished()
                call, self._call = self._call, None
                assert call is not None
                try:
                    await call()
                except Exception as exc:
                    self._error = exc
                finally:
                    self._done.set()
        if self._error is not None:
            raise self._error

    async def _finished(self) -> None:
        """Run it if nobody has yet (a predecessor nobody waits for), then wait for it."""
        if not self._started:
            with suppress(Exception):
                await self.wait()
        await self._done.wait()


class CommitsBySubmit:
    """The plain :class:`CohortStore` hooks of a :class:`QueuedCohortStore`: submit, then wait."""

    def submit_watermark(self, record: WatermarkRecord) -> Commit:
        raise NotImplementedError

    def submit_open(self, record: OpenRecord) -> Commit:
        raise NotImplementedError

    def submit_terminal(self, record: TerminalRecord) -> Commit:
        raise NotImplementedError

    async def commit_watermark(self, record: WatermarkRecord) -> None:
        await self.submit_watermark(record).wait()

    async def commit_open(self, record: OpenRecord) -> None:
        await self.submit_open(record).wait()

    async def commit_terminal(self, record: TerminalRecord) -> None:
        await self.submit_terminal(record).wait()


@final
class SerialCommits(CommitsBySubmit):
    """A :class:`QueuedCohortStore` over the plain async hooks of a :class:`CohortStore`.

    ``submit_*`` chains the hook call after the previous one; it runs when first waited for, so
    hooks run one at a time, in submission order. Meant for simple and test stores; it has no
    group commit and no ``commit_many`` of its own (it delegates when the inner store has one).
    """

    def __init__(self, inner: CohortStore) -> None:
        self.inner = inner
        self._last: _SerialCommit | None = None

    def _chain(self, call: Callable[[], Awaitable[None]]) -> Commit:
        self._last = commit = _SerialCommit(call, self._last)
        return commit

    def submit_watermark(self, record: WatermarkRecord) -> Commit:
        return self._chain(partial(self.inner.commit_watermark, record))

    def submit_open(self, record: OpenRecord) -> Commit:
        return self._chain(partial(self.inner.commit_open, record))

    def submit_terminal(self, record: TerminalRecord) -> Commit:
        return self._chain(partial(self.inner.commit_terminal, record))

    async def commit_many(
        self, records: Sequence[TerminalRecord], watermarks: Sequence[WatermarkRecord] = ()
    ) -> None:
        many = getattr(self.inner, "commit_many", None)
        if many is not None:
            await self._chain(partial(many, records, watermarks)).wait()
            return
        for record in records:
            await self.commit_terminal(record)
        for mark in watermarks:
            await self.commit_watermark(mark)


def queued(store: CohortStore) -> QueuedCohortStore:
    """``store`` itself when it queues commits, else :class:`SerialCommits` around it."""
    if isinstance(store, QueuedCohortStore):
        return store
    return SerialCommits(store)
