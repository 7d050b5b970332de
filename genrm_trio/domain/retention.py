"""The retention rule for finished cohorts and group watermarks, one for memory and the store.

A terminal record (and a group's watermark) is kept for `cohort_result_ttl_s` after it was
stamped (a cohort's terminal time, a watermark's last update) and, of all those kept, only the
newest `max_terminal_cohorts` stay: past the cap the oldest go first. The registry applies it to
its heaps on the monotonic clock, the SQLite store to its rows on the wall clock
(docs/durable-state.md, "Retention"). Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, final

if TYPE_CHECKING:
    from genrm_trio.config import Settings

__all__ = ["Retention"]


@final
@dataclass(frozen=True, slots=True)
class Retention:
    ttl_s: float | None  # None: no time limit (the cap still bounds what is kept)
    cap: int

    @classmethod
    def of(cls, settings: Settings) -> Retention:
        return cls(settings.cohort_result_ttl_s, settings.max_terminal_cohorts)

    def horizon(self, now: float) -> float | None:
        """Records stamped at or before this time have expired; None when nothing expires."""
        return None if self.ttl_s is None else now - self.ttl_s

    def expired(self, stamped_at: float, now: float) -> bool:
        horizon = self.horizon(now)
        return horizon is not None and stamped_at <= horizon

    def excess(self, kept: int) -> int:
        """How many of the oldest of `kept` records go to get back to the cap."""
        return max(0, kept - self.cap)
