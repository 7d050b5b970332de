"""A real OpenAI-compatible inference server for the tests: Hugging Face `transformers serve`
with a tiny model built at test time (tests/tiny_models.py), and a recording proxy in front of
it that keeps every request body and every reply's usage, so a test reads what the server was
asked and what it reported.

Everything binds 127.0.0.1 and is stopped by its PID; nothing is downloaded (the hub is off).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from tiny_models import require_ml

START_TIMEOUT_S = 120.0  # importing torch and transformers on a busy 2-core machine
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",  # the machine is shared; a tiny model needs no threads
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ServeProcess:
    """One `transformers serve` process, pinned to one model (`force_model`)."""

    model: Path
    port: int
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until `/v1/models` lists the model."""
        assert self.popen is None or self.popen.poll() is not None
        env = {**os.environ, **OFFLINE, "HF_HOME": str(self.log_path.parent / "hf-home")}
        cmd = [
            sys.executable,
            "-c",
            "import sys; from transformers.cli.transformers import main; sys.argv[0] = "
            "'transformers'; sys.exit(main())",
            "serve",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--log-level",
            "warning",
        ]
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        with httpx.Client(trust_env=False, timeout=5.0) as http:
            while True:
                assert self.popen.poll() is None, f"transformers serve exited: {self.log()}"
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/v1/models").status_code == 200:
                        return
                assert time.monotonic() < deadline, f"transformers serve not up: {self.log()}"
                time.sleep(0.2)

    def kill(self) -> None:
        """`kill -9`, as a crash would."""
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=15)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=15)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def transformers_serve(model: Path, directory: Path, name: str = "serve") -> Iterator[ServeProcess]:
    """`transformers serve MODEL` on 127.0.0.1, up when this yields, stopped after."""
    require_ml(serving=True)
    server = ServeProcess(model, free_port(), directory / f"{name}.log")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@dataclass
class Exchange:
    """One request the proxy forwarded, and the reply."""

    path: str
    request: Any
    status: int
    content_type: str
    reply: Any  # the decoded JSON reply, or None


def answer_probe(exchange: Exchange) -> bool:
    """Whether `exchange` is an answer probe: its output budget is one token."""
    request = exchange.request if isinstance(exchange.request, dict) else {}
    return 1 in (request.get("max_tokens"), request.get("max_output_tokens"))


@dataclass
class RecordingProxy:
    """An HTTP/1.1 keep-alive proxy to `upstream` that records every POST (`exchanges`)."""

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # upstream failures (none forwarded)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def posts(self, suffix: str = "") -> list[Exchange]:
        """The judge calls of the workload (the answer probes left out: `probes`)."""
        with self._lock:
            return [e for e in self.exchanges if e.path.endswith(suffix) and not answer_probe(e)]

    def probes(self) -> list[Exchange]:
        """The answer probes genrm-trio sent (judge/answer_probe.py: one output token)."""
        with self._lock:
            return [e for e in self.exchanges if answer_probe(e)]

    def usage(self) -> tuple[int, int]:
        """(input, output) tokens summed over the replies, as the server reported them."""
        tokens_in = tokens_out = 0
        for exchange in self.posts():
            usage = (exchange.reply or {}).get("usage") or {}
            tokens_in += usage.get("input_tokens", usage.get("prompt_tokens", 0))
            tokens_out += usage.get("output_tokens", usage.get("completion_tokens", 0))
        return tokens_in, tokens_out

    def __post_init__(self) -> None:
        self._lock = threading.Lock()


STALE_RETRIES = 8
"""Times the recording proxy sends a request again after its upstream connection closed."""


@contextlib.contextmanager
def recording_proxy(upstream: str) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(upstream)
    http = httpx.Client(trust_env=False, timeout=300.0)

    def upstream_request(
        method: str, path: str, body: bytes, headers: dict[str, str] | None
    ) -> httpx.Response:
        # The upstream closes a kept-alive connection after a 500 from an exception (uvicorn
        # does): a request that went out on one goes again, on the next; the pool holds at most
        # `STALE_RETRIES` such connections at the concurrency of these tests.
        for _ in range(STALE_RETRIES):
            try:
                return http.request(method, upstream + path, content=body or None, headers=headers)
            except httpx.RemoteProtocolError:
                continue
        return http.request(method, upstream + path, content=body or None, headers=headers)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _forward(self, method: str) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {"content-type": "application/json"} if body else None
            try:
                reply = upstream_request(method, self.path, body, headers)
            except httpx.HTTPError as error:
                proxy.errors.append(f"{type(error).__name__}: {error}")
                self.close_connection = True  # the server is gone: so is this connection
                return
            if method == "POST":
                content_type = reply.headers.get("content-type", "")
                decoded = reply.json() if content_type.startswith("application/json") else None
                with proxy._lock:
                    proxy.exchanges.append(
                        Exchange(
                            self.path, json.loads(body), reply.status_code, content_type, decoded
                        )
                    )
            self.send_response(reply.status_code)
            self.send_header("content-type", reply.headers.get("content-type", "text/plain"))
            self.send_header("content-length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        def do_GET(self) -> None:
            self._forward("GET")

        def do_POST(self) -> None:
            self._forward("POST")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    proxy.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        http.close()
        thread.join(timeout=15)
