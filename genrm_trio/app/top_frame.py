"""`genrm-trio top`'s frames, without I/O: what one fetch of a server returned (`Snapshot` or
`FetchFailed`), the rates between snapshots (`Watcher`), and the rich renderable of one frame
(`frame`). `app/top.py` fetches and shows them; the tests feed them a live server's replies.

Rates are over the snapshots of the last `RATE_WINDOW_S` seconds of one server process: a
restart (a new `process_start_time_seconds`, or a counter that went down) starts them afresh.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from genrm_trio.judge.base import JudgeStalled
from genrm_trio.judge.prompt_check import PROMPT_FIX
from genrm_trio.metrics import MASKED_ALONE

__all__ = [
    "RATE_WINDOW_S",
    "FetchFailed",
    "Series",
    "Snapshot",
    "View",
    "Watcher",
    "frame",
    "histogram_quantile",
    "parse_metrics",
]

RATE_WINDOW_S: Final = 10.0
COHORT_ROWS: Final = 10
ERROR_CHARS: Final = 60  # a replica's last error, cut for the table

_TERMINAL = "genrm_trio_cohorts_terminal_total"
_ROLLOUTS = "genrm_trio_cohort_rollouts_total"
_MASKED = "genrm_trio_masked_rollouts_total"
_FAILED_COMPARISONS = "genrm_trio_failed_comparisons_total"
_CALLS = "genrm_trio_judge_calls_total"
_TOKENS_IN = "genrm_trio_judge_replica_input_tokens_total"
_TOKENS_OUT = "genrm_trio_judge_replica_output_tokens_total"
_ATTEMPT = "genrm_trio_judge_attempt_seconds"
_QUEUE_WAIT = "genrm_trio_judge_queue_wait_seconds"
_GROUP_LATENCY = "genrm_trio_group_latency_seconds"
_REWARD_LATENCY = "genrm_trio_reward_latency_seconds"
_EAGER = "genrm_trio_eager_comparisons_total"
_RATE_LIMITED = "genrm_trio_judge_rate_limited_total"
_THROTTLED = "genrm_trio_judge_throttled"
_COST = "genrm_trio_judge_cost_total"
# the start of a replica's `last_error` when its last failure was a stall (judge.replica_stall_s)
_STALL_ERROR: Final = f"{JudgeStalled.type_name}: "
_START = "process_start_time_seconds"
# counters whose decrease means the server restarted (when it exports no start time)
_RESET_WITNESSES: Final = (_TERMINAL, _CALLS, _ROLLOUTS)


# --- parsed /metrics ---------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Series:
    """The samples of one `/metrics` reply: sample name -> [(labels, value)]."""

    samples: Mapping[str, Sequence[tuple[Mapping[str, str], float]]]

    def total(self, name: str, **match: str) -> float | None:
        """The sum of `name`'s samples whose labels include `match`; None if there is none."""
        found = [
            value
            for labels, value in self.samples.get(name, ())
            if all(labels.get(k) == v for k, v in match.items())
        ]
        return math.fsum(found) if found else None

    def value(self, name: str, **match: str) -> float:
        """`total`, 0 when absent."""
        return self.total(name, **match) or 0.0

    def by(self, name: str, label: str) -> dict[str, float]:
        """`name` summed per value of `label`."""
        out: dict[str, float] = {}
        for labels, value in self.samples.get(name, ()):
            key = labels.get(label, "")
            out[key] = out.get(key, 0.0) + value
        return out

    def buckets(self, histogram: str) -> list[tuple[float, float]]:
        """Cumulative (upper bound, count) of a histogram, summed over its other labels."""
        return sorted(
            (float(le), count) for le, count in self.by(f"{histogram}_bucket", "le").items()
        )


def parse_metrics(text: str) -> Series:
    """Prometheus text exposition -> Series (prometheus_client's parser; ValueError if bad)."""
    samples: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return Series(samples)


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over cumulative buckets (linear within a bucket); None
    without observations. A rank in the +Inf bucket answers the highest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _bucket_deltas(
    now: Sequence[tuple[float, float]], then: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    before = dict(then)
    return [(le, count - before.get(le, 0.0)) for le, count in now]


# --- fetch results -----------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Snapshot:
    """One successful fetch: `/metrics`, `/cohorts`, `/judge/replicas` at monotonic `at`."""

    at: float
    series: Series
    cohorts: Sequence[Mapping[str, Any]]
    replicas: Sequence[Mapping[str, Any]]


@final
@dataclass(frozen=True, slots=True)
class FetchFailed:
    """A fetch that got no usable answer: the server is down, restarting, or refused it."""

    at: float
    reason: str


# --- the view over time ------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class View:
    """What one frame shows."""

    url: str
    wall: float  # unix time of the frame
    latest: Snapshot | None  # the newest snapshot (stale when `failure` is set)
    baseline: Snapshot | None  # the oldest snapshot of the rate window (same process)
    failure: FetchFailed | None  # set while the server does not answer
    down_since: float | None  # monotonic time of the first failure in a row
    restarted_at: float | None  # unix time a restart was noticed


def _start_time(snapshot: Snapshot) -> float | None:
    return snapshot.series.total(_START)


def _restarted(before: Snapshot, after: Snapshot) -> bool:
    start_before, start_after = _start_time(before), _start_time(after)
    if start_before is not None and start_after is not None:
        return start_before != start_after
    return any(after.series.value(n) < before.series.value(n) for n in _RESET_WITNESSES)


@final
class Watcher:
    """Keeps the rate window across fetches; `update` turns each fetch into a `View`."""

    def __init__(self, url: str, window_s: float = RATE_WINDOW_S) -> None:
        self.url = url
        self.window_s = window_s
        self._window: deque[Snapshot] = deque()
        self._down_since: float | None = None
        self._restarted_at: float | None = None

    def update(self, result: Snapshot | FetchFailed, wall: float) -> View:
        """The view after `result`, fetched at unix time `wall`."""
        if isinstance(result, FetchFailed):
            if self._down_since is None:
                self._down_since = result.at
            latest = self._window[-1] if self._window else None
            return View(self.url, wall, latest, None, result, self._down_since, self._restarted_at)
        self._down_since = None
        if self._window and _restarted(self._window[-1], result):
            self._window.clear()
            self._restarted_at = wall
        self._window.append(result)
        # keep the newest snapshot at least window_s old as the baseline
        while len(self._window) > 2 and result.at - self._window[1].at >= self.window_s:
            self._window.popleft()
        baseline = self._window[0] if len(self._window) > 1 else None
        return View(self.url, wall, result, baseline, None, None, self._restarted_at)


# --- formatting --------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _latency(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}/s"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _count(value: float) -> str:
    return f"{value:.0f}"


def _money(value: float | None, per: str) -> str:
    """A cost (in the currency of judge.price_per_million_*) per minute or per group."""
    return "—" if value is None else f"{value:.4g}/{per}"


def _masked(
    total: float | None, alone: float | None, shown: Callable[[float], str], what: str = ""
) -> str:
    """Masked rollouts (every row answered `mask_sample: true`) and their split by cause."""
    if total is None or alone is None:
        return "—"
    head = f"{shown(total)} {what}" if what else shown(total)
    return f"{head} ({shown(alone)} alone, {shown(total - alone)} in whole groups)"


@final
class _Window:
    """Rates and quantiles between the baseline and the latest snapshot."""

    def __init__(self, latest: Snapshot, baseline: Snapshot | None) -> None:
        self.latest = latest
        self.baseline = baseline
        self.span = latest.at - baseline.at if baseline is not None else 0.0

    def delta(self, name: str, **match: str) -> float | None:
        if self.baseline is None or self.span <= 0:
            return None
        return self.latest.series.value(name, **match) - self.baseline.series.value(name, **match)

    def rate(self, name: str, **match: str) -> float | None:
        delta = self.delta(name, **match)
        return None if delta is None else delta / self.span

    def quantile(self, q: float, histogram: str) -> float | None:
        now = self.latest.series.buckets(histogram)
        if self.baseline is None:
            return histogram_quantile(q, now)  # since the start, until there is a window
        return histogram_quantile(q, _bucket_deltas(now, self.baseline.series.buckets(histogram)))


def _header(view: View) -> Text:
    text = Text()
    text.append("genrm-trio top ", style="bold")
    text.append(view.url)
    text.append("  " + time.strftime("%H:%M:%S", time.localtime(view.wall)))
    latest = view.latest
    if view.failure is not None:
        down = view.failure.at - (view.down_since or view.failure.at)
        text.append(f"\nDOWN for {_duration(down)}: ", style="bold red")
        text.append(view.failure.reason, style="red")
        if latest is not None:
            text.append("\n(the figures below are the last ones seen)", style="dim")
        return text
    text.append("  ● serving", style="bold green")
    start = _start_time(latest) if latest is not None else None
    if start is not None:
        text.append(f"  up {_duration(view.wall - start)}")
    if view.restarted_at is not None and view.wall - view.restarted_at < 60:
        text.append(
            f"\nrestarted {_duration(view.wall - view.restarted_at)} ago: rates start afresh",
            style="bold yellow",
        )
    return text


def _pair(window: _Window, histogram: str) -> str:
    return (
        f"{_latency(window.quantile(0.5, histogram))} / "
        f"{_latency(window.quantile(0.95, histogram))}"
    )


def _summary(window: _Window, *, down: bool) -> RenderableType:
    s = window.latest.series
    if down:  # the figures of the last answer, which had no window of its own
        span = "the last ones seen: latencies since its start, no rates"
    elif window.baseline is not None:
        span = f"last {window.span:.0f}s"
    else:
        span = "first look: latencies since the start; rates need a second sample"
    table = Table(title=f"Rates and latencies ({span})", show_header=False, box=None)
    for style in ("bold", "", "bold", ""):
        table.add_column(style=style, no_wrap=True)
    scored = failed = None
    if window.baseline is not None:
        failed = window.rate(_TERMINAL, state="failed")
        scored = (window.rate(_TERMINAL, state="scored") or 0.0) + (
            window.rate(_TERMINAL, state="partially_masked") or 0.0
        )
    rollouts = window.delta(_ROLLOUTS)
    lost = None
    if rollouts:
        # a failed group's rollouts count once: masked with it or answered 503
        alone = window.delta(_MASKED, cause=MASKED_ALONE) or 0.0
        lost = (alone + (window.delta(_ROLLOUTS, state="failed") or 0.0)) / rollouts
    active = s.by("genrm_trio_active_cohorts", "state")
    cpu = window.rate("process_cpu_seconds_total")
    memory = s.total("process_resident_memory_bytes")
    table.add_row("groups scored", _rate(scored), "groups failed", _rate(failed))
    table.add_row(
        "masked rollouts",
        _masked(window.rate(_MASKED), window.rate(_MASKED, cause=MASKED_ALONE), _rate),
        "failed comparisons",
        _rate(window.rate(_FAILED_COMPARISONS)),
    )
    table.add_row("without a reward", _percent(lost), "judge attempts", _rate(window.rate(_CALLS)))
    table.add_row(
        "judge p50 / p95", _pair(window, _ATTEMPT), "group p50 / p95", _pair(window, _GROUP_LATENCY)
    )
    table.add_row(  # what the trainer waits for once a group is generated
        "reward p50 / p95",
        _pair(window, _REWARD_LATENCY),
        "eager comparisons",
        _rate(window.rate(_EAGER)),
    )
    table.add_row(
        "judge tokens in",
        _rate(window.rate(_TOKENS_IN)),
        "judge tokens out",
        _rate(window.rate(_TOKENS_OUT)),
    )
    table.add_row(
        "judge in flight",
        _count(s.value("genrm_trio_judge_inflight")),
        "judge queued",
        _count(s.value("genrm_trio_judge_queued")),
    )
    cost = window.delta(_COST)
    groups = window.delta(_TERMINAL)
    table.add_row(  # a hosted judge's limits (docs/operations.md, "A hosted judge API")
        "judge throttled",
        _count(s.value(_THROTTLED)),
        "judge 429s",
        _rate(window.rate(_RATE_LIMITED)),
    )
    table.add_row(
        "judge cost",
        _money(None if cost is None else 60.0 * cost / window.span, "min"),
        "cost per group",
        _money(None if cost is None or not groups else cost / groups, "group"),
    )
    table.add_row(
        "queue wait p95",
        _latency(window.quantile(0.95, _QUEUE_WAIT)),
        "active cohorts",
        f"{_count(active.get('collecting', 0.0))} collecting, "
        f"{_count(active.get('judging', 0.0))} judging",
    )
    table.add_row(
        "process CPU",
        _percent(cpu),
        "resident memory",
        "—" if memory is None else f"{memory / 2**20:.0f} MiB",
    )
    deadlines = s.by("genrm_trio_deadline_failures_total", "deadline")
    since = Text("since the start: ", style="dim")
    masked = _masked(
        s.value(_MASKED), s.value(_MASKED, cause=MASKED_ALONE), _count, "masked rollouts"
    )
    since.append(f"{masked}, deadline failures ")
    since.append(", ".join(f"{name} {_count(n)}" for name, n in sorted(deadlines.items())) or "0")
    return Group(table, since)


def _replicas(replicas: Sequence[Mapping[str, Any]]) -> RenderableType:
    if not replicas:
        return Text("Judge: simulated (no base URL), so no per-replica figures", style="dim")
    table = Table(title="Judge replicas", expand=False)
    columns = ("replica", "health", "in flight", "calls", "failures", "stalls", "mean latency")
    for name in columns:  # the last error wraps first when the terminal is narrow
        key = name in ("replica", "health")
        table.add_column(name, justify="left" if key else "right", no_wrap=key)
    table.add_column("last error", overflow="ellipsis", max_width=ERROR_CHARS)
    for r in replicas:
        last_error = str(r.get("last_error") or "")
        stalls = r.get("stalls")
        if r.get("ejected"):
            # out after a stall (its last failure one) or after failed attempts in a row
            word = "STALLED" if last_error.startswith(_STALL_ERROR) else "EJECTED"
            back = r.get("back_in_s")
            health = Text(
                word + (f", trial in {_duration(back)}" if isinstance(back, float | int) else ""),
                style="bold red",
            )
        elif r.get("consecutive_failures"):
            health = Text(f"failing ({r['consecutive_failures']} in a row)", style="yellow")
        else:
            health = Text("ok", style="green")
        mean = r.get("latency_mean_s")
        # the server's strings as Text, never as Rich markup ("[…]" in an error is shown)
        table.add_row(
            Text(str(r.get("replica", "?"))),
            health,
            str(r.get("in_flight", "")),
            str(r.get("calls", "")),
            str(r.get("failures", "")),
            Text(str(stalls), style="yellow") if stalls else str(r.get("stalls", "")),
            _latency(mean if isinstance(mean, float | int) else None),
            Text(last_error[:ERROR_CHARS]),
        )
    # the worst a reward server can do: verdicts about answers the judge never read, or no
    # verdicts at all from a judge that refuses (or ignores) the GenRM roles
    warnings = [
        Text(
            f"THE JUDGE DOES NOT READ THE ANSWERS ({r.get('replica', '?')}): "
            f"{r['answers_unread']}; check judge.api (GET /readyz says how to fix it)",
            style="bold red",
        )
        for r in replicas
        if r.get("answers_unread")
    ] + [
        Text(
            f"THE JUDGE DOES NOT TAKE THE GENRM ROLES ({r.get('replica', '?')}): "
            f"{r['roles_refused']}; {PROMPT_FIX}",
            style="bold red",
        )
        for r in replicas
        if r.get("roles_refused")
    ]
    return Group(table, *warnings) if warnings else table


def _cohorts(cohorts: Sequence[Mapping[str, Any]], rows: int) -> RenderableType:
    if not cohorts:
        return Text("No active cohorts", style="dim")
    shown = list(cohorts[:rows])  # /cohorts lists the oldest first
    table = Table(title=f"Oldest active cohorts ({len(shown)} of {len(cohorts)})")
    for name in ("group", "attempt", "state", "age", "members", "comparisons", "deadline in"):
        table.add_column(name, justify="left" if name in ("group", "state") else "right")
    for c in shown:
        group = c.get("group_id")
        done, total, failed = (
            c.get("comparisons_done", 0),
            c.get("comparisons_total", 0),
            c.get("comparisons_failed", 0),
        )
        state = str(c.get("state", "?"))
        age = c.get("age_s")
        left = c.get("deadline_s_left")
        table.add_row(
            Text(str(group if group is not None else c.get("key", "?"))[:40]),
            str(c.get("group_attempt", "")),
            Text(state, style="cyan" if state == "judging" else "magenta"),
            _duration(float(age)) if isinstance(age, float | int) else "—",
            f"{c.get('members_present', '?')}/{c.get('members_expected', '?')}",
            f"{done}/{total}" + (f" ({failed} failed)" if failed else "") if total else "—",
            Text(f"{c.get('deadline', '')} {_duration(float(left))}")
            if isinstance(left, float | int)
            else "—",
        )
    return table


def frame(view: View, *, cohort_rows: int = COHORT_ROWS) -> RenderableType:
    """One frame of `genrm-trio top`."""
    parts: list[RenderableType] = [_header(view)]
    latest = view.latest
    if latest is not None:
        window = _Window(latest, view.baseline)
        parts += [
            Text(""),
            _summary(window, down=view.failure is not None),
            Text(""),
            _replicas(latest.replicas),
            Text(""),
            _cohorts(latest.cohorts, cohort_rows),
        ]
    return Group(*parts)
