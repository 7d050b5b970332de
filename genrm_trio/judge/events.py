"""A comparator's attempt events: the one count behind its `statistics()` and its Prometheus
series.

Each event moves the Prometheus series and the count the statistics snapshot reads, in one
place, so the two cannot drift apart. What each counts (docs/operations.md, the metrics table):

- `calls` (`ComparatorStatistics.calls`): attempts started, in flight and cancelled ones
  included. A call whose connection could not be opened while the judge is watched is no attempt
  (`not_sent`: it is sent again once a replica can be reached) and is taken back; it is counted in
  `unreached` instead;
- `genrm_trio_judge_calls_total{outcome}`: attempts that ended with that outcome (a reply's
  status, or the failure's kind); a not-sent call has none, nor has an attempt cancelled from
  outside (the group's deadline, a disconnect);
- `genrm_trio_judge_attempt_seconds`: every attempt started, however it ended (not-sent calls
  too: the time they took);
- `retries` and `genrm_trio_judge_retries_total{cause}`: attempts that failed and were followed by
  another attempt of the same comparison;
- `escalations` and `genrm_trio_judge_budget_escalations_total`: attempts started with an
  escalated output budget;
- `comparisons`, `fallbacks`, `failures` and `genrm_trio_judge_comparisons_total` (their sum):
  comparisons that ended with a verdict or the default fallback (`comparisons`, of which
  `fallbacks`), or a `JudgeError` (`failures`).
"""

from __future__ import annotations

from typing import Literal, assert_never, final

from genrm_trio.metrics import JUDGE_OUTCOME_LABELS, RETRY_CAUSE_LABELS, Metrics

__all__ = ["AttemptEvents", "ComparisonEnd"]

ComparisonEnd = Literal["verdict", "fallback", "failed"]
"""How a comparison ended: a parsed verdict, the default-score fallback, or a `JudgeError`."""


@final
class AttemptEvents:
    """The attempt events of one comparator (module docstring)."""

    __slots__ = (
        "_attempt_seconds",
        "_comparisons",
        "_escalated",
        "_outcomes",
        "_retried",
        "calls",
        "comparisons",
        "escalations",
        "failures",
        "fallbacks",
        "retries",
        "unreached",
    )

    def __init__(self, metrics: Metrics) -> None:
        # the labelled children, bound once: an event costs no label lookup
        self._outcomes = {o: metrics.judge_calls.labels(outcome=o) for o in JUDGE_OUTCOME_LABELS}
        self._retried = {c: metrics.judge_retries.labels(cause=c) for c in RETRY_CAUSE_LABELS}
        self._attempt_seconds = metrics.judge_attempt_seconds
        self._escalated = metrics.judge_budget_escalations
        self._comparisons = metrics.judge_comparisons
        self.calls = 0
        self.unreached = 0
        self.retries = 0
        self.escalations = 0
        self.comparisons = 0
        self.fallbacks = 0
        self.failures = 0

    def started(self) -> None:
        """An attempt started (it holds its slot)."""
        self.calls += 1

    def ended(self, outcome: str | None, seconds: float) -> None:
        """An attempt ended after `seconds`: with `outcome` (a `JUDGE_OUTCOME_LABELS` value), or
        None when it was cancelled from outside."""
        if outcome is not None:
            self._outcomes[outcome].inc()
        self._attempt_seconds.observe(seconds)

    def not_sent(self, seconds: float) -> None:
        """The attempt's connection could not be opened and the judge is watched: no attempt."""
        self.calls -= 1
        self.unreached += 1
        self._attempt_seconds.observe(seconds)

    def retried(self, cause: str) -> None:
        """A failed attempt is followed by another (`cause`: a `RETRY_CAUSE_LABELS` value)."""
        self.retries += 1
        self._retried[cause].inc()

    def escalated(self) -> None:
        """An attempt starts with an escalated output budget."""
        self.escalations += 1
        self._escalated.inc()

    def comparison_ended(self, end: ComparisonEnd) -> None:
        self._comparisons.inc()
        match end:
            case "verdict":
                self.comparisons += 1
            case "fallback":
                self.comparisons += 1
                self.fallbacks += 1
            case "failed":
                self.failures += 1
            case _:
                assert_never(end)
