"""A hosted judge's rate limits, backlogged (issue #37, "Measure"; docs/benchmarks.md, "A judge
with rate limits").

Real processes on 127.0.0.1: `genrm-trio sim-judge --rpm R` or `--tpm T` (a hosted API's limits:
token buckets of a minute, 429 beyond them, `x-ratelimit-*` headers on every reply and
`retry-after` on a 429) behind `genrm-trio serve`. `--groups` groups of `--size` rollouts are
POSTed to `/verify` at once, far more judge calls than the limit's first minute holds, so the
judge is backlogged. Per limit, three runs against a fresh judge:

- `unconfigured`: genrm-trio with no limits set, paced by the replies' headers and 429 holds;
- `configured`: genrm-trio with `judge.requests_per_minute` / `judge.tokens_per_minute` equal
  to the judge's;
- `verl`: a stand-in of verl's `rate_limited` reward manager (its algorithm, not its code):
  the same number of judge calls sent straight to the judge through token buckets of one
  second's worth of the limits (RPM: 1 a call; TPM: a fixed 2,000 tokens a call, whatever the
  call costs), `--verl-concurrency` at a time; a call that fails (a 429) is a reward of 0.0, a
  row lost, and is not retried.

Reported per run: throughput while backlogged as a share of the binding limit (the calls or
tokens the judge served from its first served call to its last, over what the limit allows in
that time: the minute's bucket it starts with plus its refill), 429 replies per 100 calls, rows
masked (genrm-trio) or lost (verl), and the run's duration. Goals (#37): share ≥ 90 %
unconfigured, ≤ 5 429s per 100 calls unconfigured and 0 configured, 0 rows masked.

    python benchmarks/judge_limits.py             # rpm=600, then tpm=600000; 100 groups of 16
    python benchmarks/judge_limits.py --limits rpm=60 --groups 10 --size 8 --latency-ms 50
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_suite  # benchmarks/ is not a package
from bench_common import post_verify

from genrm_trio.app import bench
from genrm_trio.app.top_frame import parse_metrics
from genrm_trio.domain.ratelimit import TokenBucket
from genrm_trio.judge.apis import judge_api
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing.procs import Proc

ROOT: Final = Path(__file__).resolve().parent.parent
DEFAULT_OUT: Final = ROOT / "benchmarks" / "results" / "judge-limits.json"
MODES: Final = ("unconfigured", "configured", "verl")
VERL_TOKENS_PER_CALL: Final = 2000  # verl's estimated_tokens_per_request default
PROMPT: Final = "Limits prompt {group}: explain the result step by step."


@dataclass(slots=True)
class Limit:
    kind: str  # "rpm" or "tpm"
    value: int

    @property
    def flag(self) -> list[str]:
        return [f"--{self.kind}", str(self.value)]

    @property
    def key(self) -> str:
        return "requests_per_minute" if self.kind == "rpm" else "tokens_per_minute"


@dataclass(slots=True)
class Result:
    limit: str
    mode: str
    calls_needed: int  # judge comparisons the workload needs
    served: int = 0  # judge calls the judge served (200; genrm-trio's start-up answer probe too)
    rate_limited: int = 0  # 429 replies
    served_tokens: int = 0  # what the served calls were charged (prompt + max_tokens)
    span_s: float = 0.0  # first served call to last, at the judge
    share_of_limit: float | None = None  # backlogged throughput / the binding limit's rate
    per_100_calls: float = 0.0  # 429s per 100 calls
    rows: int = 0
    rows_masked: int = 0  # genrm-trio: mask_sample; verl: calls lost to a 429 (reward 0.0)
    errors: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    throttled_seconds: float | None = None  # genrm-trio: genrm_trio_judge_throttled_seconds
    goals_met: bool = False


def _share(limit: Limit, served: int, tokens: int, span: float) -> float | None:
    """What the judge served from its first served call to its last, as a share of what its
    limit allows in that time: the first minute's bucket plus the refill (None: nothing served).
    Backlogged throughout, a client that uses its limit fully scores 100 %."""
    if not served:
        return None
    allowed = limit.value + span * limit.value / 60.0
    return (served if limit.kind == "rpm" else tokens) / allowed


async def _stats(client: httpx.AsyncClient, judge: Proc) -> dict[str, Any]:
    stats: dict[str, Any] = (await client.get(judge.url + "/stats", timeout=5.0)).json()
    return stats


def _finish(result: Result, limit: Limit, stats: dict[str, Any]) -> None:
    result.served = stats["calls"]
    result.rate_limited = stats["rate_limited"]
    result.served_tokens = stats["limited_tokens"]
    result.span_s = stats["limited_span_s"]
    result.share_of_limit = _share(limit, result.served, result.served_tokens, result.span_s)
    total = result.served + result.rate_limited
    result.per_100_calls = 100.0 * result.rate_limited / total if total else 0.0


async def drive_server(
    limit: Limit, mode: str, judge: Proc, server: Proc, groups: int, size: int, answer_chars: int
) -> Result:
    """The groups through genrm-trio, at once; the judge's and the server's counters after."""
    result = Result(f"{limit.kind}={limit.value}", mode, groups * size, rows=groups * size)
    bench.raise_fd_limit(result.rows + 64)
    pool = bench.HttpPool(server.url, 3600.0, {})
    run_id = time.monotonic_ns()
    start = trio.current_time()

    async def send(group: int, rollout: int) -> None:
        row = await post_verify(
            pool,
            result.errors,
            group=group,
            rollout=rollout,
            group_id=f"limits-{run_id}-{group}",
            prompt=PROMPT.format(group=group),
            answer_chars=answer_chars,
        )
        if row is not None and row.get("mask_sample"):
            result.rows_masked += 1

    try:
        async with trio.open_nursery() as nursery:
            for group in range(groups):
                for rollout in range(size):
                    nursery.start_soon(send, group, rollout)
    finally:
        await pool.aclose()
    result.duration_s = trio.current_time() - start
    async with httpx.AsyncClient() as client:
        _finish(result, limit, await _stats(client, judge))
        series = parse_metrics((await client.get(server.url + "/metrics")).text)
    result.throttled_seconds = series.total("genrm_trio_judge_throttled_seconds_total")
    return result


def verl_body(group: int, rollout: int, answer_chars: int, max_tokens: int) -> bytes:
    """The judge request genrm-trio would send for the circular pair (rollout, rollout + 1)."""
    call = JudgeCall(
        [{"role": "user", "content": PROMPT.format(group=group)}],
        bench.answer_text(group, rollout, answer_chars),
        bench.answer_text(group, rollout + 1, answer_chars),
        None,
        max_output_tokens=max_tokens,
    )
    params = {"input": [], "max_output_tokens": max_tokens}
    return json.dumps(judge_api("genrm_model", params).body(call)).encode()


async def drive_verl(
    limit: Limit,
    judge: Proc,
    groups: int,
    size: int,
    answer_chars: int,
    max_tokens: int,
    concurrency: int,
) -> Result:
    """verl's `rate_limited` algorithm against the judge: RPM and TPM buckets of one second's
    worth (`AsyncTokenBucket(rate, max_tokens=rate)`), a fixed 2,000 tokens a call, a
    semaphore; a failed call is a reward of 0.0 and is not retried."""
    result = Result(f"{limit.kind}={limit.value}", "verl", groups * size, rows=groups * size)
    now = trio.current_time()
    per_s = limit.value / 60.0
    bucket = TokenBucket(per_s, per_s, now)
    cost = 1 if limit.kind == "rpm" else VERL_TOKENS_PER_CALL
    lock = trio.Lock()
    slots = trio.Semaphore(concurrency)
    start = trio.current_time()

    async def acquire() -> None:
        async with lock:  # verl sleeps while holding its lock only for an oversized request
            while True:
                wait = bucket.wait(cost, trio.current_time())
                if wait <= 0:
                    bucket.take(cost, trio.current_time())
                    return
                await trio.sleep(wait)

    async def one(client: httpx.AsyncClient, group: int, rollout: int) -> None:
        body = verl_body(group, rollout, answer_chars, max_tokens)
        await acquire()
        async with slots:
            try:
                reply = await client.post(
                    judge.url + "/v1/responses",
                    content=body,
                    headers={"content-type": "application/json"},
                    timeout=600.0,
                )
            except httpx.HTTPError as exc:
                result.errors.append(f"g{group} r{rollout}: {type(exc).__name__}")
                result.rows_masked += 1
                return
        if reply.status_code != 200:
            result.rows_masked += 1  # verl: the score function raised, the reward is 0.0

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        async with trio.open_nursery() as nursery:
            for group in range(groups):
                for rollout in range(size):
                    nursery.start_soon(one, client, group, rollout)
        result.duration_s = trio.current_time() - start
        _finish(result, limit, await _stats(client, judge))
    return result


def _goals(result: Result) -> bool:
    share_ok = result.share_of_limit is not None and result.share_of_limit >= 0.9
    if result.mode == "unconfigured":
        return share_ok and result.per_100_calls <= 5.0 and result.rows_masked == 0
    if result.mode == "configured":
        return result.rate_limited == 0 and result.rows_masked == 0
    return share_ok and result.rows_masked == 0  # the peer, held to the same bar


def run_one(limit: Limit, mode: str, args: argparse.Namespace, log_dir: Path) -> Result:
    here = log_dir / f"{limit.kind}{limit.value}-{mode}"
    here.mkdir(parents=True, exist_ok=True)
    judge = run_suite.start_judge(
        here, "judge", [*limit.flag, "--latency-ms", str(args.latency_ms), "--seed", "1"]
    )
    try:
        if mode == "verl":
            result = trio.run(
                drive_verl,
                limit,
                judge,
                args.groups,
                args.size,
                args.answer_chars,
                args.max_output_tokens,
                args.verl_concurrency,
            )
        else:
            judge_keys: dict[str, Any] = {"api": "responses"}
            if mode == "configured":
                judge_keys[limit.key] = limit.value
            overrides = {
                "num_rollouts_per_prompt": args.size,
                "genrm_responses_create_params": {
                    "input": [],
                    "max_output_tokens": args.max_output_tokens,
                },
                "judge_request_timeout_s": 600.0,
                "cohort_evaluation_timeout_s": 3600.0,
                "judge": judge_keys,
            }
            server = run_suite.start_server(here, "server", judge.url + "/v1", overrides)
            try:
                result = trio.run(
                    drive_server,
                    limit,
                    mode,
                    judge,
                    server,
                    args.groups,
                    args.size,
                    args.answer_chars,
                )
            finally:
                server.stop()
    finally:
        judge.stop()
    result.goals_met = _goals(result)
    return result


def _percent(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def table(results: list[Result]) -> str:
    lines = [
        "limit        mode          share of limit  429s/100 calls  rows masked  duration s  goals"
    ]
    for r in results:
        lines.append(
            f"{r.limit:<12} {r.mode:<13} {_percent(r.share_of_limit):>14}  "
            f"{r.per_100_calls:>14.1f}  {r.rows_masked:>5}/{r.rows:<5}  {r.duration_s:>10.1f}  "
            f"{'met' if r.goals_met else 'NOT met'}"
        )
    return "\n".join(lines)


def _limit(text: str) -> Limit:
    kind, _, value = text.partition("=")
    if kind not in ("rpm", "tpm") or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected rpm=N or tpm=N, got {text!r}")
    return Limit(kind, int(value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--limits",
        type=_limit,
        nargs="+",
        default=[Limit("rpm", 600), Limit("tpm", 600000)],
        help="the judge's limit per run: rpm=N or tpm=N (default: rpm=600 tpm=600000)",
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--size", type=int, default=16, help="rollouts per group")
    parser.add_argument("--answer-chars", type=int, default=1000)
    parser.add_argument("--max-output-tokens", type=int, default=512)
    parser.add_argument("--latency-ms", type=float, default=200.0, help="per judge call")
    parser.add_argument("--verl-concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    log_dir = Path(tempfile.mkdtemp(prefix="genrm-judge-limits-"))
    results: list[Result] = []
    for limit in args.limits:
        for mode in args.modes:
            results.append(run_one(limit, mode, args, log_dir))
            done = results[-1]
            print(f"{done.limit} {mode}: done in {done.duration_s:.1f}s", file=sys.stderr)
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "judge_limits",
        "command": ["python", "benchmarks/judge_limits.py", *(argv or sys.argv[1:])],
        "commit": run_suite._git_head(),
        "logs": str(log_dir),
        "arguments": {k: v for k, v in vars(args).items() if k not in ("limits", "out")},
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    print(f"wrote {args.out}")
    return 0 if not any(r.errors for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
