"""The trainer client's own CPU per rollout (docs/trainers.md, "Throughput").

    python benchmarks/trainer_client.py [--groups 40] [--batches 8,32,64]

Starts `genrm-trio serve --judge sim` (an instant simulated judge) with groups of 16 and
measures this process's CPU time (`time.process_time`, so a busy machine changes the figures
little) per rollout scored: the blocking `GenRMClient` one group at a time (a `trio.run` and
fresh connections per group), the `AsyncGenRMClient` one group at a time (connections kept),
and TRL's reward function on batches of `--batches` groups sent at once (16 requests per group
in flight together). The server's own CPU is not counted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from genrm_trio.client import AsyncGenRMClient, GenRMClient
from genrm_trio.testing import procs
from genrm_trio.trl import genrm_reward

N = 16
ANSWER_WORDS = 200


def texts(n: int) -> list[str]:
    return [f"answer {i} " + "word " * ANSWER_WORDS for i in range(n)]


def blocking(url: str, groups: int) -> float:
    client = GenRMClient(url)
    client.score_group("warm up", texts(N))
    start = time.process_time()
    for group in range(groups):
        client.score_group(f"blocking {group}", texts(N))
    return (time.process_time() - start) / (groups * N)


def reused(url: str, groups: int) -> float:
    async def run() -> float:
        async with AsyncGenRMClient(url) as client:
            await client.score_group("warm up", texts(N))
            start = time.process_time()
            for group in range(groups):
                await client.score_group(f"async {group}", texts(N))
            return (time.process_time() - start) / (groups * N)

    return trio.run(run)


def trl_batch(url: str, groups: int) -> tuple[float, float]:
    reward = genrm_reward(url)
    reward(prompts=["warm up"] * N, completions=texts(N))
    prompts = [f"trl {groups} {group}" for group in range(groups) for _ in range(N)]
    completions = texts(N) * groups
    start, wall = time.process_time(), time.perf_counter()
    rewards = reward(prompts=prompts, completions=completions)
    cpu, wall = time.process_time() - start, time.perf_counter() - wall
    assert all(value is not None for value in rewards)
    return cpu / len(rewards), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=40, help="groups of the one-by-one runs")
    parser.add_argument("--batches", default="8,32,64", help="groups per TRL batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        flags = ["serve", "--judge", "sim", "--num-rollouts-per-prompt", str(N), "--port", "0"]
        server = procs.start(flags, Path(directory) / "serve.err")
        try:
            print(f"groups of {N}, answers of {ANSWER_WORDS + 2} words; client CPU per rollout:")
            one_by_one = blocking(server.url, args.groups), reused(server.url, args.groups)
            print(f"  GenRMClient, one group at a time: {one_by_one[0] * 1e3:.2f} ms")
            print(f"  AsyncGenRMClient, one group at a time: {one_by_one[1] * 1e3:.2f} ms")
            for groups in (int(value) for value in args.batches.split(",")):
                cpu, wall = trl_batch(server.url, groups)
                print(
                    f"  genrm_reward, {groups} groups ({groups * N} requests) at once: "
                    f"{cpu * 1e3:.2f} ms (batch wall {wall:.2f} s)"
                )
        finally:
            server.close()


if __name__ == "__main__":
    main()
