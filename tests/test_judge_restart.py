"""A judge restart costs nothing, with real processes (docs/reliability.md, "A judge restart"):
`genrm-trio sim-judge` killed with SIGKILL while groups are in flight, down for about 2 s, then
started again on the same port. The engine (in this process, real clock, 127.0.0.1) waits for it
instead of spending attempts: no rollout is masked. Once with one replica, once with a fleet of
two whose every replica is killed. Times are scaled down from the issue's 30 s outage with
`cohort_evaluation_timeout_s: 300`; every wait is bounded."""

from __future__ import annotations

import logging
import signal
from functools import partial
from pathlib import Path

import pytest
import trio
from judges import member, verify
from procs import Proc, start_judge

from genrm_trio.config import Settings
from genrm_trio.domain.model import Scored
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.fleet import JudgeFleet

N = 4
GROUPS = 16
EVERY_S = 0.25  # a new group this often, for 4 s
KILL_AT = 0.6
DOWN_S = 2.0  # from the kill to the restart


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-replica", "fleet-of-two"])
async def test_every_replica_killed_and_restarted_masks_nothing(
    tmp_path: Path, replicas: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    judges: list[Proc] = [
        await trio.to_thread.run_sync(
            partial(start_judge, tmp_path, "--latency-ms", "50", name=f"judge{i}")
        )
        for i in range(replicas)
    ]
    ports = [judge.port for judge in judges]
    try:
        config = Settings.model_validate(
            {
                "num_rollouts_per_prompt": N,
                "cohort_collection_timeout_s": 300.0,
                "cohort_evaluation_timeout_s": 300.0,
                "judge_request_timeout_s": 30.0,
                "genrm_parse_retries": 3,
                "genrm_parse_retry_sleep_s": 0.05,
                "judge": {
                    "api": "genrm_model",
                    # one URL is a fleet of one replica
                    "base_url": [f"{judge.url}/v1" for judge in judges]
                    if replicas > 1
                    else f"{judges[0].url}/v1",
                    "outage_probe_s": 0.5,  # scaled down with the outage
                    "probe": False,
                },
            }
        )
        judge = make_judge(config)
        assert isinstance(judge, JudgeFleet)
        replies: list[object] = []
        seen: dict[str, object] = {}

        async def group(g: int) -> None:
            async with trio.open_nursery() as nursery:
                for i in range(N):
                    nursery.start_soon(one, g, i)

        async def one(g: int, i: int) -> None:
            replies.append(await verify(engine, member(i, group=f"g{g}", answer=f"g{g} a{i}")))

        async def outage() -> None:
            await trio.sleep(KILL_AT)
            for proc in judges:
                proc.signal(signal.SIGKILL)  # kill -9, groups in flight
            for proc in judges:
                await trio.to_thread.run_sync(proc.close)  # reaped, its pipe closed
            await trio.sleep(DOWN_S / 2)
            seen["readyz"] = engine.judge_unreachable()
            await trio.sleep(DOWN_S / 2)
            for index, port in enumerate(ports):  # restarted on the same port
                judges[index] = await trio.to_thread.run_sync(
                    partial(
                        start_judge,
                        tmp_path,
                        "--latency-ms",
                        "50",
                        "--port",
                        str(port),
                        name=f"judge{index}-again",
                    )
                )

        try:
            with trio.fail_after(60):
                async with open_engine(config, judge) as engine, trio.open_nursery() as nursery:
                    nursery.start_soon(outage)
                    for g in range(GROUPS):
                        nursery.start_soon(group, g)
                        await trio.sleep(EVERY_S)
                gone = judge.unreachable_seconds()
                masked = sum(
                    engine.metrics.registry.get_sample_value(
                        "genrm_trio_masked_rollouts_total", {"cause": cause}
                    )
                    or 0.0
                    for cause in ("alone", "whole_group")
                )
        finally:
            await judge.aclose()
    finally:
        for proc in judges:
            await trio.to_thread.run_sync(proc.close)
    print(f"{replicas} replica(s): unreachable for {gone:.2f}s")  # pytest -s
    assert len(replies) == GROUPS * N
    assert [r for r in replies if not isinstance(r, Scored)] == []
    assert masked == 0.0
    # down from (about) the kill to the restart, plus the start and one probe interval
    assert DOWN_S * 0.5 < gone < DOWN_S + 10.0, gone
    assert isinstance(seen["readyz"], str) and seen["readyz"].startswith("judge unreachable for")
    lines = [r.getMessage() for r in caplog.records]
    assert len([line for line in lines if line.startswith("judge unreachable: ")]) >= 1
    assert len([line for line in lines if line.startswith("judge is back after ")]) >= 1
