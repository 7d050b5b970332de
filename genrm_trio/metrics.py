"""Prometheus metrics, one registry per engine so that engines (and tests) never share counters.

The names are those of docs/http-api.md, "GET /metrics", and all start with `genrm_trio_`, besides
the standard `process_*` series of the process (CPU, memory, open files, start time). The label
values of the cohort, deadline, judge-outcome, retry-cause and masked-cause series are closed
sets, exported at 0 from the start, so that a query dividing or adding them (the dashboard's, the
alert rules') has a series before the first event of each kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, Protocol, final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    Summary,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

TERMINAL_STATE_LABELS: Final = ("scored", "partially_masked", "failed")
"""The `state` label of the terminal cohort series: `TerminalRecord.state`'s values (a test
keeps these three tuples equal to the engine's own sets)."""
ACTIVE_STATE_LABELS: Final = ("collecting", "judging")
"""The `state` label of `genrm_trio_active_cohorts`: `engine.machine.ACTIVE_STATES`."""
DEADLINE_LABELS: Final = ("collection", "evaluation", "compare")
"""The `deadline` label of `genrm_trio_deadline_failures_total`."""
JUDGE_OUTCOME_LABELS: Final = (
    "completed",
    "budget_exhausted",
    "unusable",
    "http_error",
    "transport_error",
    "timeout",
    "bad_json",
    "stalled",
    "context_overflow",
    "prompt_error",
)
"""The `outcome` label of `genrm_trio_judge_calls_total`: `ReplyStatus` and the attempt errors."""
RETRY_CAUSE_LABELS: Final = ("transport", "http", "timeout", "stall", "unusable", "parse", "budget")
"""The `cause` label of `genrm_trio_judge_retries_total` (bad JSON is never retried; a timeout
only on another replica of a fleet, a stall only in a fleet)."""
MASKED_ALONE: Final = "alone"
MASKED_WHOLE_GROUP: Final = "whole_group"
MASKED_CAUSE_LABELS: Final = (MASKED_ALONE, MASKED_WHOLE_GROUP)
"""The `cause` label of `genrm_trio_masked_rollouts_total`: a rollout masked alone (its failed
comparisons; the rest of its group scored), or one of a group whose every rollout was masked (a
judge-kind group failure). Summed, the rows answered with `mask_sample: true`."""
QUEUE_PRIORITY_LABELS: Final = ("complete", "collecting")
"""The `priority` label of `genrm_trio_judge_queue_wait_seconds`: `judge.queue.Priority`."""
PREFERRED_POSITION_LABELS: Final = ("first", "second", "tie")
"""The `preferred` label of `genrm_trio_judge_verdicts_total`: the answer a verdict's ranking
prefers as the judge was shown the pair (tie: 3.5)."""


class ReplicaCounters(Protocol):
    """What the per-replica series read of one judge replica (`judge.base.ReplicaStats` is
    one); a protocol, so that metrics, which every layer imports, imports none of them."""

    @property
    def replica(self) -> str: ...
    @property
    def calls(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def ejections(self) -> int: ...
    @property
    def stalls(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def ejected(self) -> bool: ...
    @property
    def latency_count(self) -> int: ...
    @property
    def latency_sum_s(self) -> float: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def reasoning_tokens(self) -> int: ...
    @property
    def prompts_unread(self) -> int: ...
    @property
    def context_overflows(self) -> int: ...


class JudgeReachability(Protocol):
    """What the outage series read of the judge (`judge.fleet.JudgeFleet`)."""

    def unreachable_for(self) -> float | None: ...
    def unreachable_seconds(self) -> float: ...


@final
class _ReachabilityCollector(Collector):
    """Whether the judge can be reached, read at scrape time; 0 without a judge that says."""

    def __init__(self) -> None:
        self.source: JudgeReachability | None = None

    def collect(self) -> Iterator[Metric]:
        source = self.source
        down = source is not None and source.unreachable_for() is not None
        seconds = 0.0 if source is None else source.unreachable_seconds()
        yield GaugeMetricFamily(
            "genrm_trio_judge_unreachable",
            "1 while no judge replica can be reached (comparisons wait for one), else 0",
            value=1.0 if down else 0.0,
        )
        yield CounterMetricFamily(
            "genrm_trio_judge_unreachable_seconds",
            "Seconds during which no judge replica could be reached",
            value=seconds,
        )


@final
class _ReplicaCollector(Collector):
    """The per-replica series of a judge fleet, read from its counters at scrape time."""

    def __init__(self) -> None:
        self.source: Callable[[], Sequence[ReplicaCounters]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        stats = self.source()
        calls = CounterMetricFamily(
            "genrm_trio_judge_replica_calls",
            "Judge attempts started, per fleet replica",
            labels=["replica"],
        )
        failures = CounterMetricFamily(
            "genrm_trio_judge_replica_failures",
            "Judge attempts that failed retryably (transport error, 408, 5xx), per replica",
            labels=["replica"],
        )
        ejections = CounterMetricFamily(
            "genrm_trio_judge_replica_ejections",
            "Times a replica was taken out (consecutive failed attempts, or a stall)",
            labels=["replica"],
        )
        stalls = CounterMetricFamily(
            "genrm_trio_judge_replica_stalls",
            "Times a replica was taken out as stalled (judge.replica_stall_s)",
            labels=["replica"],
        )
        in_flight = GaugeMetricFamily(
            "genrm_trio_judge_replica_inflight",
            "Judge attempts in flight, per replica",
            labels=["replica"],
        )
        ejected = GaugeMetricFamily(
            "genrm_trio_judge_replica_ejected",
            "1 while a replica is ejected (receives trial attempts only), else 0",
            labels=["replica"],
        )
        latency = SummaryMetricFamily(
            "genrm_trio_judge_replica_attempt_seconds",
            "Duration of finished judge attempts, per replica",
            labels=["replica"],
        )
        input_tokens = CounterMetricFamily(
            "genrm_trio_judge_replica_input_tokens",
            "Prompt (input) tokens the judge reported, per replica",
            labels=["replica"],
        )
        output_tokens = CounterMetricFamily(
            "genrm_trio_judge_replica_output_tokens",
            "Output tokens the judge reported (reasoning included), per replica",
            labels=["replica"],
        )
        reasoning_tokens = CounterMetricFamily(
            "genrm_trio_judge_replica_reasoning_tokens",
            "Of the output tokens, reasoning tokens, where the judge's API reports them",
            labels=["replica"],
        )
        unread = CounterMetricFamily(
            "genrm_trio_judge_replica_answers_unread_prompts",
            "Prompts whose comparisons' prompt tokens showed that the judge does not read the "
            "answers (judge.api pointed the wrong way), per replica",
            labels=["replica"],
        )
        overflows = CounterMetricFamily(
            "genrm_trio_judge_replica_context_overflows",
            "Judge attempts the replica refused for its context window (each resent once with a "
            "budget that fits, or the comparison failed: context_overflow)",
            labels=["replica"],
        )
        for s in stats:
            label = [s.replica]
            overflows.add_metric(label, s.context_overflows)
            input_tokens.add_metric(label, s.input_tokens)
            output_tokens.add_metric(label, s.output_tokens)
            reasoning_tokens.add_metric(label, s.reasoning_tokens)
            unread.add_metric(label, s.prompts_unread)
            calls.add_metric(label, s.calls)
            failures.add_metric(label, s.failures)
            ejections.add_metric(label, s.ejections)
            stalls.add_metric(label, s.stalls)
            in_flight.add_metric(label, s.in_flight)
            ejected.add_metric(label, 1.0 if s.ejected else 0.0)
            latency.add_metric(label, s.latency_count, s.latency_sum_s)
        yield from (calls, failures, ejections, stalls, in_flight, ejected, latency)
        yield from (input_tokens, output_tokens, reasoning_tokens, unread, overflows)


@final
class Metrics:
    """Every counter the engine, the judge client and the HTTP layer update."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # registered in this order, which is the order of /metrics
        self._add_judge_call_metrics(r)
        self._add_judge_wait_metrics(r)
        self.judge_cost = Counter(
            "genrm_trio_judge_cost",
            "What the judge's reported usage cost at judge.price_per_million_input_tokens and "
            "judge.price_per_million_output_tokens (0 without prices)",
            registry=r,
        )
        self._add_cohort_metrics(r)
        self._add_judge_quality_metrics(r)
        self._add_failure_metrics(r)
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ... (Linux)
        ProcessCollector(registry=r)
        self._replicas = _ReplicaCollector()
        r.register(self._replicas)
        self._reachability = _ReachabilityCollector()
        r.register(self._reachability)

    def _add_judge_call_metrics(self, r: CollectorRegistry) -> None:
        """Judge attempts: outcomes, durations, retries, escalated budgets, comparisons."""
        self.judge_calls = Counter(
            "genrm_trio_judge_calls",
            "Judge attempts by outcome (completed, budget_exhausted, unusable, http_error, "
            "transport_error, timeout, bad_json, stalled)",
            ["outcome"],
            registry=r,
        )
        self.judge_attempt_seconds = Histogram(
            "genrm_trio_judge_attempt_seconds",
            "Duration of one judge attempt",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.judge_retries = Counter(
            "genrm_trio_judge_retries",
            "Judge retries by cause (transport, http, timeout, stall, unusable, parse, budget)",
            ["cause"],
            registry=r,
        )
        self.judge_budget_escalations = Counter(
            "genrm_trio_judge_budget_escalations",
            "Judge attempts started with an escalated output budget (judge.budget_escalation)",
            registry=r,
        )
        self.judge_comparisons = Counter(
            "genrm_trio_judge_comparisons",
            "Comparisons the judge finished (a verdict, the default fallback, or a judge error): "
            "the denominator of judge tokens per comparison",
            registry=r,
        )
        for outcome in JUDGE_OUTCOME_LABELS:
            self.judge_calls.labels(outcome)
        for cause in RETRY_CAUSE_LABELS:
            self.judge_retries.labels(cause)

    def _add_judge_wait_metrics(self, r: CollectorRegistry) -> None:
        """Judge calls in flight, queued for a slot, and held by the judge's rate limit."""
        self.judge_inflight = Gauge(
            "genrm_trio_judge_inflight", "Judge attempts in flight", registry=r
        )
        self.judge_queued = Gauge(
            "genrm_trio_judge_queued",
            "Judge attempts waiting for a judge.max_concurrency slot",
            registry=r,
        )
        self.judge_queue_wait_seconds = Histogram(
            "genrm_trio_judge_queue_wait_seconds",
            "Time spent waiting for a judge.max_concurrency slot, by the priority class that got "
            "the slot (complete: the group's members are all in; collecting: an eager comparison)",
            ["priority"],
            buckets=(0.0, 0.001, 0.01, 0.1, 1, 10, 60, 600),
            registry=r,
        )
        self.judge_throttled = Gauge(
            "genrm_trio_judge_throttled",
            "Judge calls waiting for the judge's rate limit (a 429's hold, the configured or "
            "announced requests and tokens per minute)",
            registry=r,
        )
        self.judge_rate_limited = Counter(
            "genrm_trio_judge_rate_limited",
            "Judge replies of HTTP 429 (each holds its replica; no attempt, no failure)",
            registry=r,
        )
        self.judge_throttled_seconds = Counter(
            "genrm_trio_judge_throttled_seconds",
            "Seconds judge calls waited for the judge's rate limit, summed over the calls",
            registry=r,
        )
        for priority in QUEUE_PRIORITY_LABELS:
            self.judge_queue_wait_seconds.labels(priority)

    def _add_cohort_metrics(self, r: CollectorRegistry) -> None:
        """Cohorts: their states, their latencies and their masked rollouts."""
        self.eager_comparisons = Counter(
            "genrm_trio_eager_comparisons",
            "Comparisons started before their group was complete (eager_comparisons)",
            registry=r,
        )
        self.reward_latency_seconds = Histogram(
            "genrm_trio_reward_latency_seconds",
            "From a group's last member in to its rewards published (scored groups)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.cohorts_terminal = Counter(
            "genrm_trio_cohorts_terminal",
            "Cohorts that reached a terminal state (scored, partially_masked, failed)",
            ["state"],
            registry=r,
        )
        self.active_cohorts = Gauge(
            "genrm_trio_active_cohorts",
            "Cohorts collecting or judging",
            ["state"],
            registry=r,
        )
        self.cohort_rollouts = Counter(
            "genrm_trio_cohort_rollouts",
            "Rollouts (members present) of cohorts that reached a terminal state, by that state",
            ["state"],
            registry=r,
        )
        self.group_latency_seconds = Histogram(
            "genrm_trio_group_latency_seconds",
            "Time from a group's first member arriving to its rewards being published, for "
            "groups that completed (scored or partially masked)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=r,
        )
        self.masked_rollouts = Counter(
            "genrm_trio_masked_rollouts",
            "Rollouts answered with mask_sample: true, by cause (alone: masked after its failed "
            "comparisons, the rest of its group scored; whole_group: in a group whose every "
            "rollout was masked)",
            ["cause"],
            registry=r,
        )
        for state in TERMINAL_STATE_LABELS:
            self.cohorts_terminal.labels(state)
            self.cohort_rollouts.labels(state)
        for state in ACTIVE_STATE_LABELS:
            self.active_cohorts.labels(state)
        for cause in MASKED_CAUSE_LABELS:
            self.masked_rollouts.labels(cause)

    def _add_judge_quality_metrics(self, r: CollectorRegistry) -> None:
        """The judge on live traffic (docs/operations.md): what `genrm-trio calibrate` measures."""
        self.judge_verdicts = Counter(
            "genrm_trio_judge_verdicts",
            "Parsed overall verdicts of scored groups' comparisons by the answer their ranking "
            "prefers as shown (first, second, tie): the judge's position bias over any window",
            ["preferred"],
            registry=r,
        )
        self.group_position_disagreement = Summary(
            "genrm_trio_group_position_disagreement_rate",
            "Per scored group with pairs judged in both orders (position_balance: alternate), "
            "the share of those pairs whose two orders disagree",
            registry=r,
        )
        self.group_preference_cycles = Summary(
            "genrm_trio_group_preference_cycle_rate",
            "Per scored bradley_terry group with a decided triangle, the share of its decided "
            "triangles that are cyclic",
            registry=r,
        )
        for position in PREFERRED_POSITION_LABELS:
            self.judge_verdicts.labels(position)

    def _add_failure_metrics(self, r: CollectorRegistry) -> None:
        """Comparisons ended by a judge error, groups and /compare calls ended by a deadline."""
        self.failed_comparisons = Counter(
            "genrm_trio_failed_comparisons", "Comparisons that ended in a judge error", registry=r
        )
        self.deadline_failures = Counter(
            "genrm_trio_deadline_failures",
            "Groups or /compare calls ended by a deadline (collection, evaluation, compare)",
            ["deadline"],
            registry=r,
        )
        for deadline in DEADLINE_LABELS:
            self.deadline_failures.labels(deadline)

    def watch_replicas(self, source: Callable[[], Sequence[ReplicaCounters]] | None) -> None:
        """Expose a judge fleet's per-replica counters (label `replica`); None stops it."""
        self._replicas.source = source

    def watch_judge(self, source: JudgeReachability | None) -> None:
        """Expose whether the judge can be reached (`genrm_trio_judge_unreachable`, and its
        seconds); None stops it (both read 0)."""
        self._reachability.source = source

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
