"""The stop (docs/operations.md, "Graceful shutdown"): a SIGINT delivered twice is one stop, and
the process leaves without the collector's last pass over its heap.

Real clock and real sockets (the signal arrives through the OS); every wait is bounded and waits
on state (a log line, a cohort state), not on time.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import tomllib
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from genrm_trio.app.cli import exit_process
from genrm_trio.app.serve import REPEAT_SIGNAL_WINDOW_S, is_repeat_delivery, serve
from genrm_trio.config import settings_from_mapping
from genrm_trio.testing import SimConfig, serve_sim_judge, sim_asgi_app

ROOT = Path(__file__).resolve().parent.parent


def verify_row(rollout: int) -> dict[str, object]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Why?"}]},
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer {rollout}"}],
                }
            ]
        },
        "_ng_group_id": "g-twice",
        "_ng_group_attempt": 0,
        "_ng_rollout_index": rollout,
    }


def test_the_repeat_window() -> None:
    assert REPEAT_SIGNAL_WINDOW_S == 1.0
    assert is_repeat_delivery(10.0, 10.0)
    assert is_repeat_delivery(10.0, 10.999)
    assert not is_repeat_delivery(10.0, 11.0)
    assert not is_repeat_delivery(10.0, 25.0)


async def _wait_for_log(caplog: pytest.LogCaptureFixture, text: str) -> None:
    while not any(text in record.getMessage() for record in caplog.records):  # noqa: ASYNC110
        await trio.sleep(0.005)  # a log line has no event to wait on


async def test_a_sigint_delivered_twice_is_one_graceful_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ctrl-C under a launcher: the process group's SIGINT, then the launcher's own, ms apart.
    The second is logged as the same stop; the waiting requests still get their 503s."""
    caplog.set_level(logging.INFO, logger="genrm_trio.serve")
    judge_app = sim_asgi_app(SimConfig(latency_s=30.0))
    replies: list[httpx.Response] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as outer:
            judge_port = await outer.start(partial(serve_sim_judge, judge_app, port=0))
            settings = settings_from_mapping(
                {
                    "port": 0,
                    "num_rollouts_per_prompt": 2,
                    "judge": {
                        "base_url": f"http://127.0.0.1:{judge_port}/v1",
                        "api": "genrm_model",
                    },
                    # the stalled request below holds the stop this long: the second signal
                    # arrives while the stop is still running
                    "server": {"shutdown_grace_s": 3.0},
                }
            )
            async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
                async with trio.open_nursery() as nursery:
                    port = await nursery.start(partial(serve, settings))
                    base = f"http://127.0.0.1:{port}"

                    async def member(i: int) -> None:
                        replies.append(await client.post(f"{base}/verify", json=verify_row(i)))

                    for i in range(2):
                        nursery.start_soon(member, i)
                    while judge_app.sim.statistics().in_flight < 2:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    # a request whose body never comes: the graceful stop waits for it
                    stalled = await trio.open_tcp_stream("127.0.0.1", port)
                    await stalled.send_all(
                        b"POST /verify HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"
                    )
                    os.kill(os.getpid(), signal.SIGINT)
                    await _wait_for_log(caplog, "received SIGINT: shutting down")
                    os.kill(os.getpid(), signal.SIGINT)
                    await _wait_for_log(caplog, "received SIGINT again")
                await stalled.aclose()
            outer.cancel_scope.cancel()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.endswith("serve")]
    again = [m for m in messages if "again" in m[1]]
    assert len(again) == 1
    level, text = again[0]
    assert level == "INFO"
    assert text.startswith("received SIGINT again ")
    assert text.endswith("ms later: already shutting down (the same stop, delivered twice)")
    assert not any("stopping without waiting" in text for _, text in messages)
    assert [r.status_code for r in replies] == [503, 503]
    shutdown = {"detail": "GenRM server is shutting down", "reason": "shutting_down"}
    assert all(r.json() == shutdown for r in replies)


def test_exit_process_freezes_the_heap_then_exits() -> None:
    before = gc.get_freeze_count()
    try:
        with pytest.raises(SystemExit) as exited:
            exit_process(3)
        assert exited.value.code == 3
        # every object alive is out of the collector's reach: finalization skips them
        assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # this is pytest's process: give the collector its objects back


def test_every_entry_point_exits_through_exit_process() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"genrm-trio": "genrm_trio.app.cli:run"}
    app_py = ROOT / "genrm_trio/app/gym_root/resources_servers/genrm_trio/app.py"
    assert "exit_process(gym_main())" in app_py.read_text()
