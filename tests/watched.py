"""A server to watch: simulated judge replicas (two by default, or one: a single `--judge-url`,
a fleet of one) and `genrm-trio serve` over them, with a server API key, all real processes on
127.0.0.1 (the dashboard, alert-rule and `top` tests). Answers carrying FAIL make the judges
answer empty replies: those comparisons fail after their attempts and mask their rollouts,
without ejecting a replica.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from procs import Proc, answers, bodies, client, run_group, start_judge, start_server

KEY_ENV = "GENRM_TRIO_WATCHED_SERVER_TOKEN"
FAIL = "[fail]"
GROUP = 4


@dataclass
class Watched:
    judges: list[Proc]
    server: Proc
    token: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def target(self) -> str:
        return self.url.removeprefix("http://")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def env(self) -> dict[str, str]:
        return {KEY_ENV: self.token}

    @property
    def replicas(self) -> list[str]:
        return [judge.url.removeprefix("http://") for judge in self.judges]


def server_config(**overrides: Any) -> dict[str, Any]:
    return {
        "num_rollouts_per_prompt": GROUP,
        "cohort_collection_timeout_s": 30.0,
        "cohort_evaluation_timeout_s": 30.0,
        "judge_request_timeout_s": 10.0,
        "genrm_parse_retries": 1,
        "genrm_parse_retry_sleep_s": 0.0,
        "server": {"api_key_env": KEY_ENV},
        **overrides,
    }


@contextlib.contextmanager
def watched_server(
    directory: Path,
    *judge_flags: str,
    port: int | None = None,
    replicas: int = 2,
    **overrides: Any,
) -> Iterator[Watched]:
    token = f"watch-{secrets.token_hex(12)}"
    env = {KEY_ENV: token}
    judges: list[Proc] = []
    try:
        for i in range(replicas):
            judges.append(
                start_judge(
                    directory,
                    "--latency-ms",
                    "5",
                    "--jitter-ms",
                    "10",
                    "--fault",
                    f"empty,match={FAIL}",
                    *judge_flags,
                    name=f"judge{i}",
                )
            )
        extra = [flag for judge in judges[1:] for flag in ("--judge-url", f"{judge.url}/v1")]
        if port is not None:
            extra += ["--port", str(port)]
        server = start_server(
            directory,
            server_config(**overrides),
            judge_url=f"{judges[0].url}/v1",
            extra=extra,
            env=env,
        )
        try:
            yield Watched(judges, server, token)
        finally:
            server.close()
    finally:
        for judge in judges:
            judge.close()


async def load(
    watched: Watched, seconds: float, *, failing: bool, loops: int = 3, prefix: str = "g"
) -> int:
    """Whole groups of GROUP rollouts from `loops` concurrent senders, started during `seconds`;
    with `failing`, one member of each group carries FAIL. Returns the number of groups."""
    sent = 0
    tagged: Sequence[int] = [GROUP - 1] if failing else []
    async with client(timeout=30.0, headers=watched.headers) as http:
        end = trio.current_time() + seconds

        async def sender(n: int) -> None:
            nonlocal sent
            i = 0
            while trio.current_time() < end:  # whole groups only: none left half-sent
                group = f"{prefix}-{'fail' if failing else 'ok'}-{n}-{i}"
                replies, _ = await run_group(
                    http, watched.url, bodies(group, answers(FAIL, GROUP, tagged))
                )
                assert all(r.status == 200 for r in replies), [r.body for r in replies]
                sent += 1
                i += 1

        async with trio.open_nursery() as nursery:
            for n in range(loops):
                nursery.start_soon(sender, n)
    return sent
