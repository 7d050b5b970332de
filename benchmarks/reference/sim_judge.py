"""Serve genrm-trio's simulated judge on 127.0.0.1 for reference_bench.py: `genrm-trio sim-judge`
plus `--cpu` pinning and a JSON ready line the driver reads.

    . /tmp/probe/bin/activate
    python benchmarks/reference/sim_judge.py --port 8300 [--latency-ms 200] \
        [--fault-rate 0.01 --fault-kind http_500 --sticky-faults] [--cpu 1]

Prints `SIM_JUDGE {"pid": ..., "port": ...}` once it is listening.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os

import trio

from genrm_trio.testing import SimConfig, serve_sim_judge


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--fault-kind", default="http_500")
    parser.add_argument("--sticky-faults", action="store_true")
    parser.add_argument("--cpu", type=int, default=None, help="pin to this core")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    config = SimConfig(
        latency_s=args.latency_ms / 1000,
        jitter_s=args.jitter_ms / 1000,
        seed=args.seed,
        fault_rate=args.fault_rate,
        fault_kind=args.fault_kind,  # type: ignore[arg-type]
        sticky_faults=args.sticky_faults,
        record_calls=False,
    )

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(functools.partial(serve_sim_judge, config, port=args.port))
            print("SIM_JUDGE " + json.dumps({"pid": os.getpid(), "port": port}), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
