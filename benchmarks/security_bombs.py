#!/usr/bin/env python3
"""The security review's request bombs (issue #40 items 2 and 3) against one `genrm-trio serve`.

Starts `genrm-trio serve --judge sim` (N = 4) on 127.0.0.1, then sends each bomb in turn while a
thread polls `GET /health` every 10 ms. Per bomb it prints the reply's status and time, the
slowest `/health` answer while the bomb was in flight, and the server's peak RSS so far
(`VmHWM`). `--scale` shrinks every bomb (1.0 is the review's sizes: run that on a quiet machine).
Exits 1 when a `/health` answer took longer than `--max-health-ms` or the peak RSS passed
`--max-rss-mb`. The first row polls /health with no bomb: the machine's own noise.

The bombs: a 60 MiB `/verify` body of `[[],[],…]` (refused before decoding: more values than a
body may hold), one just under that value budget (decoded off the loop, held compressed), a
`/verify` with 1.9 million extra keys, `/aggregate_metrics` with 500,000 rows (25 MiB), a
`/compare` of 500,000 empty lists, and `GET /checkpoint` / `POST /checkpoint` after 4,096 groups
(`max_terminal_cohorts`: the most a checkpoint holds by default). Last, a second `serve` whose
judge (a stub in this process) answers every comparison with 999,999 `{` (the most a verdict
search takes, `MAX_BRACES`) and then a verdict: a `/compare` of two answers makes two such
replies, each parsed in a worker thread (`Comparator._read`, judge/attempts.py) by one pass of
the scanner (domain/verdict.py); then judges whose replies are as long as
`judge.max_response_bytes` allows, of `{}{}…` (refused by their count of braces) and of
`[[],…]` (refused by their count of values, `MAX_REPLY_VALUES`), and one whose replies carry the
review's 30 MiB of `[[],…]` (refused as they are read, past `judge.max_response_bytes`).

    python benchmarks/security_bombs.py                 # the review's sizes
    python benchmarks/security_bombs.py --scale 0.05    # a quick look
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from genrm_trio.app.bench import procfs, verify_body
from genrm_trio.config import MAX_RESPONSE_BYTES
from genrm_trio.domain.verdict import MAX_BRACES
from genrm_trio.testing.procs import start, terminate

N = 4


def _list_bomb(values: int, group: str) -> bytes:
    """A `/verify` body whose extra key holds `values // 2` empty lists."""
    body = verify_body(task=0, rollout=0, group_id=group, attempt=0, prompt="Q?", answer="a")
    head = json.dumps(body)[:-1].encode()
    return head + b', "extra": [' + b"[]," * (values // 2) + b"[]]}"


def _extra_keys(keys: int) -> bytes:
    body = verify_body(task=0, rollout=1, group_id="keys", attempt=0, prompt="Q?", answer="b")
    head = json.dumps(body)[:-1].encode()
    return head + b"," + b",".join(b'"k%d":0' % i for i in range(keys)) + b"}"


def _aggregate(rows: int) -> bytes:
    row = b'{"reward":1.0,"mask_sample":false,"accuracy":0.5}'
    return b'{"verify_responses":[' + b",".join([row] * rows) + b"]}"


def _compare(lists: int) -> bytes:
    history = b'[{"role":"user","content":"Q?"}]'
    return b'{"conversation_history":' + history + b',"response_objs":[' + b"[]," * lists + b"[]]}"


def _two_answers() -> bytes:
    """A `/compare` body of two answers (one comparison per judge pass)."""
    answers = [
        verify_body(task=0, rollout=i, group_id="c", attempt=0, prompt="Q?", answer=f"a{i}")
        for i in range(2)
    ]
    history = [{"role": "user", "content": "Q?"}]
    objs = [body["response"] for body in answers]
    return json.dumps({"conversation_history": history, "response_objs": objs}).encode()


def _brace_judge(filler: str, junk: int = 0) -> ThreadingHTTPServer:
    """A chat-completions judge on 127.0.0.1 whose every answer is `filler` and then a verdict
    (not in a fence, so the whole answer is scanned), with a usage that grows with the prompt
    (so the start-up answer probe finds a judge that reads the answers); with `junk`, its
    replies also carry a key of `junk` empty lists."""
    answer = filler + ' {"score_1": 4, "score_2": 3, "ranking": 2}'
    chars = len(answer)
    junk_json = b"[" + b"[]," * junk + b"[]]"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # GET /v1/models: the start-up and outage probes
            self._send({"object": "list", "data": [{"id": "braces", "object": "model"}]})

        def do_POST(self) -> None:
            prompt = self.rfile.read(int(self.headers.get("content-length", "0")))
            usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": chars // 4}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            message = {"role": "assistant", "content": answer}
            payload = {
                "id": "braces",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
            data = json.dumps(payload).encode()
            if junk and server.armed:  # not for the start-up answer probe
                data = data[:-1] + b', "junk": ' + junk_json + b"}"
            self._send(data)

        def _send(self, payload: object) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        armed = False  # whether replies carry the junk

        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a reply refused while it is sent: the server closed the connection

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="bomb size factor (1.0: review)")
    parser.add_argument("--max-health-ms", type=float, default=100.0)
    parser.add_argument("--max-rss-mb", type=float, default=512.0)
    args = parser.parse_args(argv)
    scale = args.scale

    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "genrm.yaml"
        config.write_text("cohort_collection_timeout_s: 1\n")  # a bomb's group waits 1 s
        proc = start(
            ["serve", "--judge", "sim", "--port", "0", "--num-rollouts-per-prompt", str(N),
             "--config", str(config)],
            Path(folder) / "serve.log",
            program=[sys.executable, "-m", "genrm_trio.app.cli"],
        )  # fmt: skip
        try:
            failed = _run(proc.url, proc.popen.pid, scale, args)
        finally:
            terminate(proc.popen)
        # the most "{" a verdict search takes; a reply as long as judge.max_response_bytes of
        # spans, refused by its count of braces; one of that many `[[],…]`, refused by its
        # count of values; the review's 30 MiB of `[[],…]`, refused as it is read
        most = int((MAX_RESPONSE_BYTES - 1024) * scale)
        judged = [
            ("judge replies of 999,999 '{' (x2)", "{" * int((MAX_BRACES - 1) * scale), 0),
            (f"judge replies of {most / 2**20:.1f} MiB of '{{}}' (x2)", "{}" * (most // 2), 0),
            (f"judge replies of {most / 2**20:.1f} MiB of [[],…] (x2)", "", most // 3),
            ("judge replies of 30 MiB of [[],…] (x2)", "", int(30 * 2**20 * scale) // 3),
        ]
        for name, filler, junk in judged:
            failed |= _judged(name, filler, junk, Path(folder), args)
        return 1 if failed else 0


def _judged(name: str, filler: str, junk: int, folder: Path, args: argparse.Namespace) -> bool:
    """A `/compare` of two answers at a `serve` whose judge answers with `filler` + a verdict
    (`_brace_judge`)."""
    judge = _brace_judge(filler, junk)
    braced = start(
        ["serve", "--judge-url", f"http://127.0.0.1:{judge.server_port}/v1", "--judge-api",
         "chat_completions", "--port", "0", "--num-rollouts-per-prompt", str(N)],
        folder / "serve-braces.log",
        program=[sys.executable, "-m", "genrm_trio.app.cli"],
    )  # fmt: skip
    try:
        with httpx.Client(base_url=braced.url, timeout=600, trust_env=False) as client:
            judge.armed = True  # type: ignore[attr-defined]
            body = _two_answers()
            return _measure(
                braced.url,
                braced.popen.pid,
                name,
                lambda: client.post("/compare", content=body),
                args,
            )
    finally:
        terminate(braced.popen)
        judge.shutdown()


def _measure(
    url: str,
    pid: int,
    name: str,
    send: Callable[[], httpx.Response],
    args: argparse.Namespace,
) -> bool:
    """Send one bomb while a thread polls `/health`; print its row. Whether it failed a bound."""
    worst = [0.0]
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as probe:
            while not stop.is_set():
                started = time.perf_counter()
                probe.get("/health")
                worst[0] = max(worst[0], time.perf_counter() - started)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    started = time.perf_counter()
    reply = send()
    took = time.perf_counter() - started
    stop.set()
    poller.join()
    peak = (procfs.status_field(pid, "VmHWM") or 0) / 1024
    print(f"{name:40s} {reply.status_code:6d} {took:7.2f} {worst[0] * 1000:15.1f} {peak:12.0f}")
    return bool(worst[0] * 1000 > args.max_health_ms or peak > args.max_rss_mb)


def _run(url: str, pid: int, scale: float, args: argparse.Namespace) -> bool:
    client = httpx.Client(base_url=url, timeout=600, trust_env=False)
    # retained records for the checkpoint bombs: groups of N scored by the simulated judge
    groups = max(1, int(4096 * scale))  # max_terminal_cohorts: the most a checkpoint holds

    def fill() -> None:
        with httpx.Client(base_url=url, timeout=600, trust_env=False) as c:
            for g in range(groups):
                bodies = [
                    verify_body(task=g, rollout=i, group_id=f"g{g}", attempt=0, prompt="Q?",
                                answer=f"a{i}")
                    for i in range(N)
                ]  # fmt: skip
                threads = [
                    threading.Thread(target=c.post, args=("/verify",), kwargs={"json": body})
                    for body in bodies
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

    exported: list[bytes] = []

    def export() -> httpx.Response:
        reply = client.get("/checkpoint")
        exported.append(reply.content)
        return reply

    def post(path: str, content: bytes) -> Callable[[], httpx.Response]:
        return lambda: client.post(path, content=content)

    def sized(count: float) -> int:
        return int(count * scale)

    def idle() -> httpx.Response:
        time.sleep(2.0)
        return client.get("/health")

    bombs: list[tuple[str, Callable[[], httpx.Response]]] = [
        ("(none: /health alone for 2 s)", idle),
        ("60 MiB /verify of [[],…]", post("/verify", _list_bomb(sized(40e6), "b1"))),
        ("/verify just under the value budget", post("/verify", _list_bomb(sized(3.9e6), "b2"))),
        ("/verify with 1.9M extra keys", post("/verify", _extra_keys(sized(1.9e6)))),
        ("/aggregate_metrics, 500k rows", post("/aggregate_metrics", _aggregate(sized(5e5)))),
        ("/compare of 500k lists", post("/compare", _compare(sized(5e5)))),
        ("GET /checkpoint", export),
        ("POST /checkpoint", lambda: client.post("/checkpoint", content=exported[-1])),
    ]
    fill()
    failed = False
    print(
        f"{'bomb':40s} {'status':>6s} {'time s':>7s} {'max /health ms':>15s} {'peak RSS MB':>12s}"
    )
    for name, send in bombs:
        failed |= _measure(url, pid, name, send, args)
    client.close()
    return failed


if __name__ == "__main__":
    sys.exit(main())
