"""`genrm-trio bench` on the command line: its flags, the report table and the JSON output."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from dataclasses import asdict
from typing import Final

import trio
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from genrm_trio.app.arguments import DEFAULT_SERVER_URL, positive, positive_int
from genrm_trio.app.bench.runner import (
    BenchConfig,
    BenchError,
    BenchReport,
    no_group_hint,
    run_bench,
)

__all__ = ["BENCH_DESCRIPTION", "add_bench_arguments", "run_bench_command"]


BENCH_DESCRIPTION: Final = (
    "Load generator: run --groups groups against a running server, --concurrency at a time "
    "(closed loop) or --rate per second (open loop), and report throughput, group and request "
    "latency percentiles, the masked fraction and judge calls per group. verify mode sends N "
    "concurrent /verify requests per group, shaped like NeMo Gym's simple agent; compare mode "
    "one /compare of N answers. --rollouts must equal the server's num_rollouts_per_prompt in "
    "verify mode (bench stops early and says so when the server tells a different N, and fails "
    "when groups of N > 1 were answered without judging). Exit 0 when every group got answers."
)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The `genrm-trio bench` flags."""
    parser.add_argument("--url", default=DEFAULT_SERVER_URL, metavar="URL", help="server base URL")
    parser.add_argument(
        "--mode",
        choices=["verify", "compare"],
        default="verify",
        help="verify: N /verify requests per group; compare: one /compare of N answers",
    )
    parser.add_argument(
        "--groups", metavar="N", type=positive_int, default=64, help="total groups to run"
    )
    parser.add_argument(
        "--concurrency",
        "-G",
        metavar="N",
        type=positive_int,
        default=16,
        help="groups in flight (closed loop)",
    )
    parser.add_argument(
        "--rollouts",
        "-N",
        metavar="N",
        type=positive_int,
        default=16,
        help="rollouts per group; in verify mode the server's num_rollouts_per_prompt",
    )
    parser.add_argument(
        "--answer-chars", metavar="N", type=positive_int, default=1000, help="characters per answer"
    )
    parser.add_argument(
        "--rate",
        metavar="RATE",
        type=positive,
        default=None,
        help="open loop: groups per second (default: closed loop, --concurrency at a time)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive,
        default=600.0,
        help="per-request timeout",
    )
    parser.add_argument(
        "--server-pid", metavar="PID", type=int, default=None, help="measure its CPU and RSS"
    )
    parser.add_argument(
        "--judge-stats-url", metavar="URL", default=None, help="simulated judge's /stats URL"
    )
    parser.add_argument(
        "--api-key-env", metavar="VAR", default=None, help="variable holding a bearer token"
    )
    parser.add_argument(
        "--json", dest="json_path", metavar="FILE", default=None, help="also write JSON here"
    )
    parser.add_argument(
        "--label", metavar="NAME", default=None, help="a name for this run in the output"
    )


def _render(report: BenchReport, label: str | None) -> Table:
    table = Table(title=f"genrm-trio bench{f' — {label}' if label else ''}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in asdict(report).items():
        if name != "errors":
            table.add_row(name, "-" if value is None else str(value))
    for error, count in sorted(report.errors.items()):
        table.add_row(f"error: {error}", str(count))
    return table


def run_bench_command(args: argparse.Namespace) -> int:
    """Run `genrm-trio bench` from parsed flags; 0 when every group got answers."""
    api_key = os.environ.get(args.api_key_env, "") if args.api_key_env else None
    cfg = BenchConfig(
        url=args.url,
        mode=args.mode,
        groups=args.groups,
        concurrency=args.concurrency,
        rollouts=args.rollouts,
        answer_chars=args.answer_chars,
        rate=args.rate,
        timeout_s=args.timeout,
        server_pid=args.server_pid,
        judge_stats_url=args.judge_stats_url,
        api_key=api_key or None,
    )
    console = Console(stderr=True)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{cfg.mode} groups", total=cfg.groups)
            report = trio.run(
                functools.partial(run_bench, cfg, on_group_done=lambda: progress.advance(task))
            )
    except BenchError as exc:
        print(f"genrm-trio: bench stopped: {exc}", file=sys.stderr, flush=True)
        return 1
    Console().print(_render(report, args.label))
    hint = no_group_hint(report)
    if hint is not None:
        print(f"genrm-trio: bench: {hint}", file=sys.stderr, flush=True)
    if args.json_path:
        payload = json.loads(report.as_json())
        payload["label"] = args.label
        with open(args.json_path, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
    print(report.as_json())
    return 0 if report.failed_groups == 0 and report.groups == cfg.groups else 1
