"""The simulated judge's capacity model (`SimConfig.capacity`, `genrm-trio sim-judge
--capacity K`): at most K calls served at once, the rest first-in first-out, a hang-up leaves the
queue; in process and over HTTP, in virtual time."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
import trio.testing
from trio.testing import MockClock

from genrm_trio.app.cli import main
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing import SimConfig, SimJudge
from genrm_trio.testing.asgi import SimJudgeApp
from genrm_trio.testing.flags import sim_config_from_args


def call(answer: str) -> JudgeCall:
    return JudgeCall([{"role": "user", "content": "q"}], answer, "b", None)


async def test_k_calls_at_once_the_rest_first_in_first_out(autojump_clock: MockClock) -> None:
    judge = SimJudge(SimConfig(latency_s=1.0, capacity=2))
    answered: dict[str, float] = {}
    start = trio.current_time()

    async def one(name: str) -> None:
        await judge.attempt(call(name))
        answered[name] = trio.current_time() - start

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(one, f"a{i}")
                await trio.testing.wait_all_tasks_blocked()  # arrival order a0..a4
            stats = judge.statistics()
            assert (stats.serving, stats.queued, stats.in_flight) == (2, 3, 5)
    assert answered == {"a0": 1.0, "a1": 1.0, "a2": 2.0, "a3": 2.0, "a4": 3.0}
    stats = judge.statistics()
    assert (stats.capacity, stats.max_serving, stats.max_queued) == (2, 2, 3)
    assert (stats.serving, stats.queued, stats.hang_ups) == (0, 0, 0)
    assert stats.busy_s == 5.0  # five calls of 1 s each: utilisation 5 / (2 x 3 s)
    assert [c.started_at - start for c in judge.calls] == [0.0] * 5  # seen on arrival


async def test_a_caller_that_hangs_up_leaves_the_queue(autojump_clock: MockClock) -> None:
    judge = SimJudge(SimConfig(latency_s=1.0, capacity=1))
    answered: dict[str, float] = {}
    start = trio.current_time()

    async def one(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await judge.attempt(call(name))
            answered[name] = trio.current_time() - start

    scopes = {name: trio.CancelScope() for name in ("first", "gone", "third")}
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            for name, scope in scopes.items():
                nursery.start_soon(one, name, scope)
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(0.5)
            scopes["gone"].cancel()  # waiting behind "first"
    assert answered == {"first": 1.0, "third": 2.0}
    stats = judge.statistics()
    assert (stats.hang_ups, stats.busy_s, stats.max_queued) == (1, 2.0, 2)


async def test_without_capacity_every_call_is_served_at_once(autojump_clock: MockClock) -> None:
    judge = SimJudge(SimConfig(latency_s=1.0))
    start = trio.current_time()
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(judge.attempt, call(f"a{i}"))
    assert trio.current_time() - start == 1.0
    stats = judge.statistics()
    assert (stats.capacity, stats.max_serving, stats.max_queued, stats.busy_s) == (
        None,
        50,
        0,
        50.0,
    )


async def test_capacity_over_http(autojump_clock: MockClock) -> None:
    app = SimJudgeApp(SimConfig(latency_s=1.0, capacity=1))
    body: dict[str, Any] = {
        "input": [{"role": "user", "content": "q"}],
        "metadata": {"response_1": "a1", "response_2": "a2"},
    }
    done: list[float] = []
    start = trio.current_time()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://sim.test/v1"
    ) as client:

        async def one() -> None:
            reply = await client.post("/responses", json=body)
            assert reply.status_code == 200
            done.append(trio.current_time() - start)

        with trio.fail_after(100):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(one)
                    await trio.testing.wait_all_tasks_blocked()
        stats = (await client.get("http://sim.test/stats")).json()
    assert done == [1.0, 2.0, 3.0]
    assert (stats["capacity"], stats["max_serving"], stats["max_queued"]) == (1, 1, 2)
    assert stats["busy_s"] == 3.0


def test_capacity_flag_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sim_config_from_args(capacity=24).capacity == 24
    assert sim_config_from_args().capacity is None
    for bad in (0, -1):
        with pytest.raises(ValueError, match="capacity must be an integer >= 1"):
            SimConfig(capacity=bad)
    import genrm_trio.testing.flags as flags

    seen: dict[str, Any] = {}

    def capture(**kwargs: Any) -> SimConfig:
        seen.update(kwargs)
        raise ValueError("stop here")  # reported as a usage error: no server starts

    monkeypatch.setattr(flags, "sim_config_from_args", capture)
    assert main(["sim-judge", "--capacity", "24"]) == 2
    assert seen["capacity"] == 24
    assert main(["sim-judge"]) == 2
    assert seen["capacity"] is None


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_capacity_flag_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim-judge", f"--capacity={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genrm-trio sim-judge [-h]")
    assert err.splitlines()[-1].startswith("genrm-trio sim-judge: error: argument --capacity: ")
