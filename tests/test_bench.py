"""`genrm-trio bench`: its HTTP/1.1 client and whole runs against the real service.

Real sockets on 127.0.0.1 and the real clock (no autojump: the I/O is real), every wait bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from genrm_trio.bench import BenchConfig, _Closed, _Connection, _HttpPool, answer_text, run_bench
from genrm_trio.config import settings_from_mapping
from genrm_trio.judge.sim import SimConfig, serve_sim_judge, sim_asgi_app
from genrm_trio.serve import serve


async def _read(*chunks: bytes, close: bool = False) -> tuple[int, bytes, bool]:
    client, server = trio.testing.memory_stream_pair()
    connection = _Connection(client)  # type: ignore[arg-type]
    for chunk in chunks:
        await server.send_all(chunk)
    if close:
        await server.aclose()
    with trio.fail_after(5):
        return await connection.read_response()


async def test_content_length_response_keeps_the_connection() -> None:
    reply = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\ncontent-type: x\r\n\r\n{"ok":true}'
    assert await _read(reply[:20], reply[20:]) == (200, b'{"ok":true}', True)


async def test_chunked_response_with_trailers_and_interim_response() -> None:
    reply = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4;ext=1\r\n{"de\r\n7\r\ntail":1\r\n0\r\nx-trailer: 1\r\n\r\n'
    )
    assert await _read(reply) == (503, b'{"detail":1', True)


async def test_connection_close_and_close_delimited_bodies() -> None:
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
    assert await _read(closing) == (200, b"{}", False)
    assert await _read(b"HTTP/1.0 200 OK\r\n\r\nuntil eof", close=True) == (
        200,
        b"until eof",
        False,
    )
    with pytest.raises(_Closed):
        await _read(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort", close=True)


async def test_a_keep_alive_connection_closed_while_idle_is_retried_on_a_new_one() -> None:
    connections = 0

    async def answer_once_then_close(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await stream.aclose()  # without `connection: close`, as an expired keep-alive looks

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, answer_once_then_close, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            pool = _HttpPool(f"http://127.0.0.1:{port}", 5.0, {})
            assert await pool.post("/x", b"{}") == (200, b"ok")
            await trio.sleep(0.05)  # the server has closed the idle connection by now
            assert await pool.post("/x", b"{}") == (200, b"ok")
            assert connections == 2
            await pool.aclose()
            nursery.cancel_scope.cancel()


def test_answers_are_deterministic_and_exactly_sized() -> None:
    assert answer_text(3, 4, 1000) == answer_text(3, 4, 1000)
    assert answer_text(3, 4, 1000) != answer_text(3, 5, 1000)
    assert [len(answer_text(1, 2, n)) for n in (1000, 16384)] == [1000, 16384]


@asynccontextmanager
async def _service() -> AsyncIterator[str]:
    judge_app = sim_asgi_app(SimConfig(record_calls=False))
    async with trio.open_nursery() as nursery:
        judge_port = await nursery.start(partial(serve_sim_judge, judge_app, port=0))
        settings = settings_from_mapping(
            {
                "port": 0,
                "num_rollouts_per_prompt": 4,
                "cohort_collection_timeout_s": 20.0,
                "cohort_evaluation_timeout_s": 20.0,
                "judge_request_timeout_s": 10.0,
                "judge": {"base_url": f"http://127.0.0.1:{judge_port}/v1"},
                "server": {"shutdown_grace_s": 1.0},
            }
        )
        port = await nursery.start(partial(serve, settings))
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("mode", "rate"), [("verify", None), ("compare", None), ("verify", 50.0)])
async def test_runs_against_the_service(
    mode: str, rate: float | None, capsys: pytest.CaptureFixture[str]
) -> None:
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1

    with trio.fail_after(30):
        async with _service() as url:
            cfg = BenchConfig(
                url=url,
                mode=mode,  # type: ignore[arg-type]
                groups=6,
                concurrency=3,
                rollouts=4,
                answer_chars=200,
                rate=rate,
                timeout_s=20.0,
            )
            run: Callable[..., Awaitable[Any]] = run_bench
            report = await run(cfg, on_group_done=tick)
    capsys.readouterr()
    assert (report.groups, report.failed_groups, report.errors, done) == (6, 0, {}, 6)
    assert report.masked_fraction == 0.0
    assert report.judge_calls_per_group == 4.0  # circular N=4, read from /metrics
    assert report.group_p50_ms is not None and report.group_p50_ms > 0
