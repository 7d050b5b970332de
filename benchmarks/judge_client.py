"""Judge-client throughput: comparisons/s and client CPU per call at 16..512 calls in flight.

Starts a minimal delay server in another process on 127.0.0.1 (asyncio, HTTP/1.1 keep-alive,
answers every POST after `--latency` seconds with a valid Responses verdict), then drives
`HttpJudge.attempt()` from N concurrent trio tasks for `--seconds` per level and prints a table.
The server is deliberately tiny so that the client, not the server, is what is measured; the
ideal rate is in_flight / latency. CPU columns are shares of one core (client = this process,
server = the delay server); "CPU wait" is the share of time the client was runnable but had no
CPU (other processes), so a rate below ideal can be told apart from a busy machine.

    python benchmarks/judge_client.py [--latency 0.2] [--seconds 5] [--levels 16,64,256,512]
        [--replicas 1,2,4]

`--replicas K,...` repeats the table for a judge fleet of K delay servers (each its own
process; `judge.base_url` a list of K URLs; K = 1 is a plain string: a fleet of one); "server
CPU" is then summed over the K servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import trio

VERDICT = {
    "id": "resp_bench",
    "object": "response",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": '{"score_1": 4, "score_2": 2, "ranking": 2}'}
            ],
        }
    ],
    "usage": {"input_tokens": 100, "output_tokens": 20},
}


# --- the delay server (runs in a child process) -------------------------------------------------


def serve(port_file: str, latency: float, status: int = 200) -> None:
    body = json.dumps(VERDICT).encode() if status == 200 else b"judge unavailable"
    reply = (
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: " % status
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            loop = asyncio.get_running_loop()
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].lower()
                length = 0
                marker = head.find(b"content-length:")
                if marker >= 0:
                    length = int(head[marker + 15 :].split(b"\r\n", 1)[0])
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                loop.call_later(latency, self._reply)

        def _reply(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(reply)

    sock = socket.create_server(("127.0.0.1", 0), backlog=4096)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, sock=sock)
        await server.serve_forever()

    asyncio.run(main())


def start_server(latency: float, status: int = 200) -> tuple[subprocess.Popen[bytes], int]:
    """A delay server process answering every POST after `latency` s with `status` (200: a
    verdict); (process, port)."""
    port_file = f"/tmp/genrm-bench-{os.getpid()}-{time.monotonic_ns()}.port"
    if os.path.exists(port_file):
        os.unlink(port_file)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", port_file, "--latency", str(latency),
         "--status", str(status)]
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not os.path.exists(port_file):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("delay server did not start")
        time.sleep(0.01)
    with open(port_file) as f:
        port = int(f.read())
    os.unlink(port_file)
    return proc, port


# --- the client ---------------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` (0.0 once it is gone)."""
    from genrm_trio.app.bench import procfs  # here: the delay server imports nothing of ours

    return procfs.cpu_s(pid) or 0.0


def runqueue_wait() -> float:
    """Seconds this process spent runnable but waiting for a CPU. A high value means other
    processes held the CPUs: a rate below ideal is then the machine's, not the client's."""
    from genrm_trio.app.bench import procfs

    return procfs.runqueue_wait_s(os.getpid())


@dataclass
class Level:
    in_flight: int
    calls: int
    rate: float  # calls/s
    cpu_ms: float  # client CPU per call
    client_cpu: float  # share of one core used by the client
    server_cpu: float  # share of one core used by the delay server
    runqueue: float  # share of the time the client waited for a CPU
    connections: int


def servers_cpu(pids: list[int]) -> float:
    return sum(process_cpu(pid) for pid in pids)


def open_connections(judge: object) -> int:
    from genrm_trio.judge.client import HttpJudge
    from genrm_trio.judge.fleet import JudgeFleet

    if isinstance(judge, HttpJudge):
        return judge.open_connections
    assert isinstance(judge, JudgeFleet)
    return sum(
        replica.judge.open_connections
        for replica in judge._replicas
        if isinstance(replica.judge, HttpJudge)
    )


async def run_level(
    url: str | list[str], in_flight: int, seconds: float, server_pids: list[int]
) -> Level:
    """Drive `in_flight` concurrent callers for `seconds` after a 1 s warm-up."""
    from genrm_trio.config import settings_from_mapping
    from genrm_trio.judge.base import JudgeCall, ReplyStatus
    from genrm_trio.judge.factory import make_judge

    settings = settings_from_mapping(
        {"judge": {"api": "genrm_model", "base_url": url, "max_concurrency": max(in_flight, 1)}}
    )
    judge = make_judge(settings)
    call = JudgeCall(
        history=[{"role": "user", "content": "What is 2 + 2? " * 20}],
        response_1="four " * 100,
        response_2="4 " * 100,
        principle=None,
    )
    done = 0
    measuring = False

    async def worker() -> None:
        nonlocal done
        while True:
            reply = await judge.attempt(call)
            assert reply.status is ReplyStatus.COMPLETED
            if measuring:
                done += 1

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(worker)
            await trio.sleep(1.0)  # warm-up: connections opened
            measuring = True
            cpu0, wall0, srv0 = time.process_time(), time.perf_counter(), servers_cpu(server_pids)
            rq0 = runqueue_wait()
            await trio.sleep(seconds)
            measuring = False
            cpu1, wall1, srv1 = time.process_time(), time.perf_counter(), servers_cpu(server_pids)
            rq1 = runqueue_wait()
            connections = open_connections(judge)
            nursery.cancel_scope.cancel()
    finally:
        await judge.aclose()
    wall = wall1 - wall0
    return Level(
        in_flight=in_flight,
        calls=done,
        rate=done / wall,
        cpu_ms=(cpu1 - cpu0) / max(done, 1) * 1000,
        client_cpu=(cpu1 - cpu0) / wall,
        server_cpu=(srv1 - srv0) / wall,
        runqueue=(rq1 - rq0) / wall,
        connections=connections,
    )


async def bench(
    url: str | list[str], levels: list[int], latency: float, seconds: float, server_pids: list[int]
) -> None:
    replicas = 1 if isinstance(url, str) else len(url)
    print(
        f"judge client benchmark: {os.cpu_count()} CPUs, server latency {latency * 1000:.0f} ms, "
        f"{replicas} replica(s), load average {os.getloadavg()[0]:.2f}"
    )
    header = ("in flight", "ideal/s", "calls/s", "% ideal", "CPU ms/call", "client CPU",
              "server CPU", "CPU wait", "conns")  # fmt: skip
    print("  ".join(f"{h:>11}" for h in header))
    for in_flight in levels:
        r = await run_level(url, in_flight, seconds, server_pids)
        ideal = in_flight / latency
        row = (
            f"{in_flight}",
            f"{ideal:.0f}",
            f"{r.rate:.0f}",
            f"{r.rate / ideal * 100:.1f}%",
            f"{r.cpu_ms:.3f}",
            f"{r.client_cpu * 100:.0f}%",
            f"{r.server_cpu * 100:.0f}%",
            f"{r.runqueue * 100:.0f}%",
            f"{r.connections}",
        )
        print("  ".join(f"{c:>11}" for c in row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--levels", default="16,64,256,512")
    parser.add_argument("--replicas", default="1", help="comma-separated fleet sizes")
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--status", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.latency, args.status)
        return
    levels = [int(x) for x in args.levels.split(",")]
    for count in [int(x) for x in args.replicas.split(",")]:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            urls = []
            for _ in range(count):
                proc, port = start_server(args.latency)
                procs.append(proc)
                urls.append(f"http://127.0.0.1:{port}/v1")
            url: str | list[str] = urls[0] if count == 1 else urls
            trio.run(bench, url, levels, args.latency, args.seconds, [p.pid for p in procs])
        finally:
            from genrm_trio.testing.procs import terminate

            for proc in procs:
                terminate(proc, timeout=10)


if __name__ == "__main__":
    main()
