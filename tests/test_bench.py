"""`genrm-trio bench`: its HTTP/1.1 client and whole runs against the real service.

Real sockets on 127.0.0.1 and the real clock (no autojump: the I/O is real), every wait bounded.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from genrm_trio.app.bench import (
    BenchConfig,
    BenchError,
    BenchReport,
    answer_text,
    no_group_hint,
    run_bench,
)
from genrm_trio.app.bench.client import HttpPool
from genrm_trio.app.cli import main
from genrm_trio.app.serve import serve
from genrm_trio.config import settings_from_mapping
from genrm_trio.judge.http1 import Http1Connection
from genrm_trio.judge.pool import MAX_RESPONSE_BYTES
from genrm_trio.testing import SimConfig, serve_sim_judge, sim_asgi_app


async def _read(*chunks: bytes, close: bool = False) -> tuple[int, bytes, bool]:
    """(status, body, reusable) of the response `chunks` make, read by the connection bench's
    pool uses (`judge.http1.Http1Connection`) after it sent one POST."""
    client, server = trio.testing.memory_stream_pair()
    connection = Http1Connection(client, MAX_RESPONSE_BYTES)
    for chunk in chunks:
        await server.send_all(chunk)
    if close:
        await server.send_stream.aclose()  # the server's FIN; the request can still be sent
    request = (b"POST", b"/verify", [(b"host", b"bench"), (b"content-length", b"2")], b"{}")
    with trio.fail_after(5):
        status, _, body, reusable = await connection.exchange(request)
    return status, body, reusable


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
    with pytest.raises(httpx.RemoteProtocolError):
        await _read(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort", close=True)


async def test_a_keep_alive_connection_closed_while_idle_is_retried_on_a_new_one() -> None:
    connections = 0
    closed = trio.Event()

    async def answer_once_then_close(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await stream.aclose()  # without `connection: close`, as an expired keep-alive looks
        closed.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, answer_once_then_close, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            pool = HttpPool(f"http://127.0.0.1:{port}", 5.0, {})
            assert await pool.post("/x", b"{}") == (200, b"ok")
            await closed.wait()  # the server has closed the idle connection
            assert await pool.post("/x", b"{}") == (200, b"ok")
            assert connections == 2
            await pool.aclose()
            nursery.cancel_scope.cancel()


def test_answers_are_deterministic_and_exactly_sized() -> None:
    assert answer_text(3, 4, 1000) == answer_text(3, 4, 1000)
    assert answer_text(3, 4, 1000) != answer_text(3, 5, 1000)
    assert [len(answer_text(1, 2, n)) for n in (1000, 16384)] == [1000, 16384]


@asynccontextmanager
async def _service(rollouts: int = 4) -> AsyncIterator[str]:
    judge_app = sim_asgi_app(SimConfig(record_calls=False))
    async with trio.open_nursery() as nursery:
        judge_port = await nursery.start(partial(serve_sim_judge, judge_app, port=0))
        settings = settings_from_mapping(
            {
                "port": 0,
                "num_rollouts_per_prompt": rollouts,
                "cohort_collection_timeout_s": 20.0,
                "cohort_evaluation_timeout_s": 20.0,
                "judge_request_timeout_s": 10.0,
                "judge": {"base_url": f"http://127.0.0.1:{judge_port}/v1", "api": "genrm_model"},
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


@pytest.mark.parametrize(
    ("rollouts", "why"),
    [
        (
            2,
            "no group can complete (each cohort waits for 4 members until the server's "
            "cohort_collection_timeout_s)",
        ),
        (6, "the server rejects _ng_rollout_index 4 and above with 422"),
    ],
)
async def test_rollouts_other_than_the_servers_n_stop_the_run_naming_n(
    rollouts: int, why: str
) -> None:
    # The server collects for 20 s: stopping within 10 s means bench learned N, not timed out.
    with trio.fail_after(10):
        async with _service(rollouts=4) as url:
            cfg = BenchConfig(url=url, groups=4, concurrency=2, rollouts=rollouts, timeout_s=20.0)
            with pytest.raises(BenchError) as caught:
                await run_bench(cfg)
    assert str(caught.value) == (
        f"the server expects 4 rollouts per group (its num_rollouts_per_prompt) but --rollouts "
        f"is {rollouts}: {why}; run bench with --rollouts 4"
    )


def _report(**changes: Any) -> BenchReport:
    fields: dict[str, Any] = {
        "mode": "verify",
        "groups": 2,
        "rollouts_per_group": 8,
        "concurrency": 2,
        "rate": None,
        "wall_s": 600.0,
        "groups_per_s": 0.0,
        "group_p50_ms": None,
        "group_p95_ms": None,
        "group_p99_ms": None,
        "request_p50_ms": None,
        "masked_fraction": 0.0,
        "failed_groups": 2,
        "judge_calls_per_group": None,
        "server_cpu_s": None,
        "server_cpu_ms_per_group": None,
        "server_rss_idle_mb": None,
        "server_rss_peak_mb": None,
        "errors": {"TooSlowError": 16},
    }
    return BenchReport(**(fields | changes))


def test_a_run_whose_groups_all_timed_out_asks_about_the_group_size() -> None:
    assert no_group_hint(_report()) == (
        "no group completed; does the server's num_rollouts_per_prompt match --rollouts 8?"
    )
    assert no_group_hint(_report(failed_groups=1)) is None  # one group completed
    assert no_group_hint(_report(errors={"HTTP 502": 16})) is None
    assert no_group_hint(_report(mode="compare")) is None


def test_bench_command_prints_why_it_stopped_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import genrm_trio.app.bench as bench
    from genrm_trio.app.bench import output

    async def mismatched(cfg: BenchConfig, **_: Any) -> BenchReport:
        raise BenchError(bench.rollouts_mismatch(16, cfg.rollouts))

    monkeypatch.setattr(output, "run_bench", mismatched)  # where the command calls it
    assert main(["bench", "--rollouts", "8"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == (
        "genrm-trio: bench stopped: the server expects 16 rollouts per group (its "
        "num_rollouts_per_prompt) but --rollouts is 8: no group can complete (each cohort waits "
        "for 16 members until the server's cohort_collection_timeout_s); run bench with "
        "--rollouts 16"
    )


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (["bench", "--help"], ["Load generator:", "(default: 16)", "(default: verify)"]),
        (["sim-judge", "--help"], ["(default: 8000)", "(default: http_500)", "(default: 0.0)"]),
    ],
)
def test_help_shows_the_description_and_defaults(
    command: list[str], shown: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(command) == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for text in shown:
        assert text in out
    assert "(default: None)" not in out and "(default: False)" not in out


def test_the_proc_reader_reads_this_process() -> None:
    """`genrm_trio.app.bench.procfs`, the one /proc reader of bench and the benchmarks."""
    from genrm_trio.app.bench import procfs

    pid = os.getpid()
    found = procfs.stat(pid)
    assert found is not None and found.state == "R" and found.ppid == os.getppid()
    assert procfs.cpu_ticks(pid) >= found.cpu_ticks
    cpu = procfs.cpu_s(pid)
    assert cpu is not None and cpu > 0
    rss = procfs.rss_mb(pid)
    assert rss is not None and rss > 1
    assert (procfs.status_field(pid, "Threads") or 0) >= 1
    assert (procfs.open_fds(pid) or 0) >= 3
    assert pid in procfs.pids()
    assert (procfs.cmdline(pid) or b"").split(b"\0")[0]  # the program that runs this test
    assert procfs.system_busy_s() > 0
    gone = max(procfs.pids()) + 100_000
    assert (procfs.stat(gone), procfs.cpu_s(gone), procfs.rss_mb(gone)) == (None, None, None)
    assert (procfs.cpu_ticks(gone), procfs.open_fds(gone), procfs.cmdline(gone)) == (0, None, None)
    assert procfs.task_cpu_ns(gone) == 0


def test_the_proc_reader_counts_cpu_in_nanoseconds_and_splits_an_interval() -> None:
    """`task_cpu_ns` (every thread's schedstat) grows with this process's CPU as `cpu_s` does,
    and `CpuMeter` books it to the side it was spent on (here: the "server" is this process)."""
    import time

    from genrm_trio.app.bench import procfs

    pid = os.getpid()
    before_ns, before_cpu = procfs.task_cpu_ns(pid), time.process_time()
    meter = procfs.CpuMeter(pid, None)
    while time.process_time() - before_cpu < 0.05:
        pass  # 50 ms of this process's CPU
    spent = meter.stop(groups=10)
    assert procfs.task_cpu_ns(pid) - before_ns >= 40_000_000
    # the same 50 ms, seen as the server's and as the load generator's: 10 groups, >= 4 ms each
    assert spent["server_cpu_ms_per_group"] >= 4.0  # type: ignore[operator]
    assert spent["load_cpu_ms_per_group"] >= 4.0  # type: ignore[operator]
    assert spent["judge_cpu_ms_per_group"] == 0.0


def test_terminate_stops_a_process_and_kills_one_that_ignores_sigterm() -> None:
    """`genrm_trio.testing.procs.terminate`, the one stop of every process a test or benchmark
    starts: SIGTERM, then SIGKILL once `timeout` has passed."""
    import signal
    import subprocess
    import sys

    from genrm_trio.testing.procs import terminate

    program = "import signal, sys, time\n{}\nprint('ready', flush=True)\ntime.sleep(60)"
    codes = []
    for setup in ("", "signal.signal(signal.SIGTERM, signal.SIG_IGN)"):
        popen = subprocess.Popen(
            [sys.executable, "-c", program.format(setup)], stdout=subprocess.PIPE
        )
        assert popen.stdout is not None
        with popen.stdout:
            assert popen.stdout.readline() == b"ready\n"  # its handler is in place
            codes.append(terminate(popen, timeout=0.5))
    assert codes == [-signal.SIGTERM, -signal.SIGKILL]
