"""The bench run: closed- or open-loop groups against one server, measured into a report.

Closed loop: G workers each run one group at a time (N concurrent `/verify` requests, or one
`/compare` of N answers). Open loop: groups start at a fixed arrival rate whatever the server's
latency. Judge calls are read from genrm-trio's `/metrics` when it has them, or from the
simulated judge's `/stats`; the server's CPU and RSS from /proc (`procfs`).
"""

from __future__ import annotations

import json
import math
import re
import resource
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Final, Literal, final

import httpx
import trio

from genrm_trio.app.bench import procfs
from genrm_trio.app.bench.client import HttpPool
from genrm_trio.app.bench.payloads import answer_text, policy_response, verify_body
from genrm_trio.app.top_frame import parse_metrics
from genrm_trio.domain.scoring import percentile

__all__ = [
    "GROUP_SIZE_POLL_S",
    "BenchConfig",
    "BenchError",
    "BenchReport",
    "Mode",
    "no_group_hint",
    "nothing_judged",
    "raise_fd_limit",
    "rollouts_mismatch",
    "run_bench",
]

Mode = Literal["verify", "compare"]


@final
@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str
    mode: Mode = "verify"
    groups: int = 64  # total groups to run
    concurrency: int = 16  # G: groups in flight (closed loop)
    rollouts: int = 16  # N
    answer_chars: int = 1000
    rate: float | None = None  # open loop: groups started per second
    timeout_s: float = 600.0  # per request
    server_pid: int | None = None
    judge_stats_url: str | None = None  # the simulated judge's /stats, when not using /metrics
    api_key: str | None = None


@final
@dataclass(slots=True)
class _Tally:
    group_latencies: list[float] = field(default_factory=list)
    request_latencies: list[float] = field(default_factory=list)
    rollouts: int = 0
    masked: int = 0
    failed_groups: int = 0  # a group with any non-200 reply
    errors: dict[str, int] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)  # group ids of the /verify groups running
    server_rollouts: int | None = None  # the server's N, once a 422 told it
    news: trio.Event = field(default_factory=trio.Event)  # a group completed, or N was learned
    mismatch: int | None = None  # the server's N, when it differs from --rollouts: the run stops

    def error(self, text: str) -> None:
        self.errors[text] = self.errors.get(text, 0) + 1


@final
@dataclass(frozen=True, slots=True)
class BenchReport:
    mode: str
    groups: int
    rollouts_per_group: int
    concurrency: int
    rate: float | None
    wall_s: float
    groups_per_s: float
    group_p50_ms: float | None
    group_p95_ms: float | None
    group_p99_ms: float | None
    request_p50_ms: float | None
    masked_fraction: float
    failed_groups: int
    judge_calls_per_group: float | None
    server_cpu_s: float | None
    server_cpu_ms_per_group: float | None
    server_rss_idle_mb: float | None
    server_rss_peak_mb: float | None
    errors: dict[str, int]

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def _percentile(values: Sequence[float], q: float) -> float | None:
    """The domain's percentile (docs/scoring.md), None without values."""
    return percentile(values, q) if values else None


_TRANSPORT_ERRORS = (httpx.RequestError, trio.TooSlowError)


def raise_fd_limit(needed: int) -> None:
    """One connection per request in flight: lift the soft open-file limit when it is short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


async def _judge_calls(cfg: BenchConfig, client: httpx.AsyncClient) -> float | None:
    """Judge calls so far: genrm-trio's Prometheus counter, else the simulated judge's /stats."""
    try:
        if cfg.judge_stats_url is not None:
            reply = await client.get(cfg.judge_stats_url)
            return float(reply.json()["calls"])
        reply = await client.get(cfg.url.rstrip("/") + "/metrics")
        if reply.status_code != 200:
            return None
        # every outcome's sample is exported from the start (at 0): None means not genrm-trio
        return parse_metrics(reply.text).total("genrm_trio_judge_calls_total")
    except (httpx.HTTPError, ValueError, KeyError):
        return None


async def _run_verify_group(pool: HttpPool, cfg: BenchConfig, group: int, tally: _Tally) -> None:
    group_id = f"bench-{uuid.uuid4().hex}"
    prompt = f"Bench prompt {group}: explain the result step by step."
    bodies = [
        json.dumps(
            verify_body(
                task=group,
                rollout=r,
                group_id=group_id,
                attempt=0,
                prompt=prompt,
                answer=answer_text(group, r, cfg.answer_chars),
            )
        ).encode()
        for r in range(cfg.rollouts)
    ]
    failed = False
    start = time.perf_counter()

    async def one(body: bytes) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            status, reply = await pool.post("/verify", body)
        except _TRANSPORT_ERRORS as exc:
            failed = True
            tally.error(type(exc).__name__)
            return
        tally.request_latencies.append(time.perf_counter() - t0)
        if status != 200:
            failed = True
            tally.error(f"HTTP {status}")
            if status == 422 and (size := _index_range(reply)) is not None:
                tally.server_rollouts = size
                tally.news.set()
            return
        tally.rollouts += 1
        if json.loads(reply).get("mask_sample"):
            tally.masked += 1

    tally.in_flight.add(group_id)
    try:
        async with trio.open_nursery() as nursery:
            for body in bodies:
                nursery.start_soon(one, body)
    finally:
        tally.in_flight.discard(group_id)
    tally.group_latencies.append(time.perf_counter() - start)
    if failed:
        tally.failed_groups += 1
    else:
        tally.news.set()


async def _run_compare_group(pool: HttpPool, cfg: BenchConfig, group: int, tally: _Tally) -> None:
    body = {
        "conversation_history": [
            {"role": "user", "content": f"Bench prompt {group}: explain the result."}
        ],
        "response_objs": [
            policy_response(answer_text(group, r, cfg.answer_chars)) for r in range(cfg.rollouts)
        ],
    }
    content = json.dumps(body).encode()
    start = time.perf_counter()
    try:
        status, _ = await pool.post("/compare", content)
    except _TRANSPORT_ERRORS as exc:
        tally.error(type(exc).__name__)
        tally.failed_groups += 1
        return
    latency = time.perf_counter() - start
    tally.group_latencies.append(latency)
    tally.request_latencies.append(latency)
    if status != 200:
        tally.failed_groups += 1
        tally.error(f"HTTP {status}")
        return
    tally.rollouts += cfg.rollouts


class BenchError(Exception):
    """A run that cannot measure anything, stopped early with the reason (one line)."""


GROUP_SIZE_POLL_S: Final = 1.0
"""Until the first /verify group completes, how often `/cohorts` is read for the server's N."""

_INDEX_RANGE: Final = re.compile(r"_ng_rollout_index must be in \[0, (\d+)\)")


def _index_range(reply: bytes) -> int | None:
    """The server's N from a 422 `_ng_rollout_index must be in [0, N); got i` reply."""
    try:
        detail = json.loads(reply).get("detail")
    except (ValueError, AttributeError):
        return None
    match = _INDEX_RANGE.match(detail) if isinstance(detail, str) else None
    return int(match.group(1)) if match is not None else None


async def _cohorts_group_size(
    client: httpx.AsyncClient, url: str, ours: set[str]
) -> tuple[bool, int | None]:
    """(whether the server has a readable `/cohorts`, the `members_expected` of one of ours)."""
    try:
        reply = await client.get(url.rstrip("/") + "/cohorts")
        views = reply.json() if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return False, None
    if not isinstance(views, list):
        return False, None  # the reference server, or a token bench was not given
    for view in views:
        if isinstance(view, dict) and view.get("group_id") in ours:
            expected = view.get("members_expected")
            if isinstance(expected, int) and not isinstance(expected, bool):
                return True, expected
    return True, None


def rollouts_mismatch(expected: int, rollouts: int) -> str:
    """Why a run whose --rollouts differs from the server's num_rollouts_per_prompt stopped."""
    if expected > rollouts:
        why = (
            f"no group can complete (each cohort waits for {expected} members until the "
            "server's cohort_collection_timeout_s)"
        )
    else:
        why = f"the server rejects _ng_rollout_index {expected} and above with 422"
    return (
        f"the server expects {expected} rollouts per group (its num_rollouts_per_prompt) but "
        f"--rollouts is {rollouts}: {why}; run bench with --rollouts {expected}"
    )


def nothing_judged(groups: int, rollouts: int) -> str:
    """Why a /verify run whose groups were all answered without a single judge call failed."""
    return (
        f"the server judged nothing: {groups} groups of {rollouts} /verify requests were "
        "answered with 0 judge calls; its num_rollouts_per_prompt is probably 1 (every /verify "
        f"is answered at once with default_score): start it with --num-rollouts-per-prompt "
        f"{rollouts}"
    )


def no_group_hint(report: BenchReport) -> str | None:
    """A hint for a /verify run in which no group completed and requests timed out."""
    if report.mode != "verify" or report.groups > report.failed_groups:
        return None
    if "TooSlowError" not in report.errors:
        return None
    return (
        "no group completed; does the server's num_rollouts_per_prompt match "
        f"--rollouts {report.rollouts_per_group}?"
    )


@final
class _Rss:
    """The server's resident memory in MB: idle before the run, the peak sampled during it."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.idle = procfs.rss_mb(pid) if pid else None
        self.peak = self.idle

    async def sample(self) -> None:
        """Sample every 0.2 s until cancelled."""
        while self.pid:
            rss = procfs.rss_mb(self.pid)
            if rss is not None:
                self.peak = max(self.peak or 0.0, rss)
            await trio.sleep(0.2)


async def _watch_group_size(
    probe: httpx.AsyncClient, cfg: BenchConfig, tally: _Tally, run_scope: trio.CancelScope
) -> None:
    """Until a group completes, learn the server's group size from a 422 or its `/cohorts`; when
    it differs from `cfg.rollouts`, note it in the tally and stop the run."""
    readable = True  # the server has a /cohorts bench can read
    while True:
        with trio.move_on_after(GROUP_SIZE_POLL_S if readable else math.inf):
            await tally.news.wait()
        expected: int | None = None
        if tally.news.is_set():
            expected = tally.server_rollouts
            if expected is None:
                return  # a group completed: the sizes match (or the server never groups)
        elif tally.in_flight:
            readable, expected = await _cohorts_group_size(probe, cfg.url, tally.in_flight)
        if expected is not None and expected != cfg.rollouts:
            tally.mismatch = expected
            run_scope.cancel()
            return
        if tally.news.is_set():
            return


async def _run_groups(
    pool: HttpPool, cfg: BenchConfig, tally: _Tally, on_group_done: Callable[[], None] | None
) -> None:
    """Every group of the run: closed loop (`cfg.concurrency` workers) or open loop (`cfg.rate`
    groups started per second)."""
    run_group = _run_verify_group if cfg.mode == "verify" else _run_compare_group
    next_group = 0

    async def finish(group: int) -> None:
        await run_group(pool, cfg, group, tally)
        if on_group_done is not None:
            on_group_done()

    async def closed_worker() -> None:
        nonlocal next_group
        while next_group < cfg.groups:
            group = next_group
            next_group += 1
            await finish(group)

    async with trio.open_nursery() as nursery:
        if cfg.rate is None:
            for _ in range(min(cfg.concurrency, cfg.groups)):
                nursery.start_soon(closed_worker)
        else:
            interval = 1.0 / cfg.rate
            origin = trio.current_time()
            for group in range(cfg.groups):
                nursery.start_soon(finish, group)
                await trio.sleep_until(origin + (group + 1) * interval)


def _round_ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _report(
    cfg: BenchConfig, tally: _Tally, wall: float, judged: float | None, cpu: float | None, rss: _Rss
) -> BenchReport:
    """The report of a finished run: `judged` judge calls and `cpu` server CPU seconds in it."""
    done = len(tally.group_latencies)
    calls = None if judged is None or done == 0 else judged / done
    return BenchReport(
        mode=cfg.mode,
        groups=done,
        rollouts_per_group=cfg.rollouts,
        concurrency=cfg.concurrency,
        rate=cfg.rate,
        wall_s=round(wall, 3),
        groups_per_s=round(done / wall, 2) if wall > 0 else 0.0,
        group_p50_ms=_round_ms(_percentile(tally.group_latencies, 0.5)),
        group_p95_ms=_round_ms(_percentile(tally.group_latencies, 0.95)),
        group_p99_ms=_round_ms(_percentile(tally.group_latencies, 0.99)),
        request_p50_ms=_round_ms(_percentile(tally.request_latencies, 0.5)),
        masked_fraction=round(tally.masked / tally.rollouts, 4) if tally.rollouts else 0.0,
        failed_groups=tally.failed_groups,
        judge_calls_per_group=None if calls is None else round(calls, 2),
        server_cpu_s=None if cpu is None else round(cpu, 3),
        server_cpu_ms_per_group=None if cpu is None or done == 0 else round(cpu * 1000 / done, 2),
        server_rss_idle_mb=None if rss.idle is None else round(rss.idle, 1),
        server_rss_peak_mb=None if rss.peak is None else round(rss.peak, 1),
        errors=dict(tally.errors),
    )


async def run_bench(
    cfg: BenchConfig, *, on_group_done: Callable[[], None] | None = None
) -> BenchReport:
    """Run the configured load against `cfg.url` and return the measured report.

    In verify mode, until the first group completes, the server's group size is learned from
    its `/cohorts` (`members_expected` of one of the running groups) or from a 422 naming the
    valid `_ng_rollout_index` range; when it differs from `cfg.rollouts` the run stops at once
    with BenchError. Against a server that tells neither (the reference server), a run whose
    groups all time out ends normally; `no_group_hint` then names the likely cause. A /verify
    run of groups of N > 1 whose rows came back without a single judge call (a server at
    num_rollouts_per_prompt 1) ends with BenchError too.
    """
    headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    per_group = cfg.rollouts if cfg.mode == "verify" else 1
    in_flight = per_group * (cfg.groups if cfg.rate is not None else cfg.concurrency)
    raise_fd_limit(in_flight + 64)
    pool = HttpPool(cfg.url, cfg.timeout_s, headers)
    tally = _Tally()
    rss = _Rss(cfg.server_pid)
    async with httpx.AsyncClient(timeout=10.0, headers=headers) as probe:
        calls_before = await _judge_calls(cfg, probe)
        cpu_before = procfs.cpu_s(cfg.server_pid) if cfg.server_pid else None
        start = time.perf_counter()
        with trio.CancelScope() as run_scope:
            async with trio.open_nursery() as outer:
                outer.start_soon(rss.sample)
                if cfg.mode == "verify":
                    outer.start_soon(_watch_group_size, probe, cfg, tally, run_scope)
                await _run_groups(pool, cfg, tally, on_group_done)
                outer.cancel_scope.cancel()  # the RSS sampling, the group-size watch if still on
        if tally.mismatch is not None:
            await pool.aclose()
            raise BenchError(rollouts_mismatch(tally.mismatch, cfg.rollouts))
        wall = time.perf_counter() - start
        cpu_after = procfs.cpu_s(cfg.server_pid) if cfg.server_pid else None
        calls_after = await _judge_calls(cfg, probe)
    await pool.aclose()
    judged = None if calls_before is None or calls_after is None else calls_after - calls_before
    if cfg.mode == "verify" and cfg.rollouts > 1 and tally.rollouts and judged == 0:
        # groups of N > 1 are never scored without comparisons: the server did not group them
        raise BenchError(nothing_judged(len(tally.group_latencies), cfg.rollouts))
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return _report(cfg, tally, wall, judged, cpu, rss)
