"""Scripted judge answers through the production judge path: a `Script` answers the judge's
calls in order, over an in-memory network (`genrm_trio.testing.network`), so every exchange runs
through `KeepAlivePool` and `Http1Connection` exactly as against a real server, in virtual time.

An answer is what the server does with one call: a `Reply` (status, headers, body), a hang-up
or a reset (after some bytes of a reply, or none), a refused connection, a connection reset
before the request could be written, or an async callable of the request (to sleep first) that
returns one of those. The script keeps the connection open after a reply unless the next answer
needs a new one (a refusal, or a close before any byte), as a server going down closes its
connections.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from genrm_trio.judge.network import NetworkBackend
from genrm_trio.testing.network import (
    Connect,
    MemoryNetwork,
    Request,
    reset,
    response_bytes,
    serve_requests,
)


@dataclass(frozen=True)
class Reply:
    """An HTTP response with a Content-Length."""

    status: int
    body: bytes = b""
    headers: tuple[str, ...] = ()

    @classmethod
    def json(cls, payload: object, status: int = 200, *headers: str) -> Reply:
        return cls(status, json.dumps(payload).encode(), headers)

    def bytes(self, close: bool = False) -> bytes:
        return response_bytes(
            self.status, self.body, [*self.headers, *(["connection: close"] if close else [])]
        )


@dataclass(frozen=True)
class Hangup:
    """Send `partial` (bytes of a reply, maybe none), then close the connection."""

    partial: bytes = b""


@dataclass(frozen=True)
class Reset:
    """Send `partial`, then reset the connection."""

    partial: bytes = b""


@dataclass(frozen=True)
class Refused:
    """The call's connection is refused."""


@dataclass(frozen=True)
class BrokenWrite:
    """The call's connection is reset before the request could be written."""


REFUSED = Refused()
BROKEN_WRITE = BrokenWrite()

Fixed = Reply | Hangup | Reset | Refused | BrokenWrite
Answer = Fixed | Callable[[Request], Awaitable[Fixed]]


def _fresh(answer: Answer) -> bool:
    """Whether `answer` needs the call on a new connection (it acts before the request, or
    closes before any byte, which on a reused connection is the keep-alive race)."""
    if isinstance(answer, (Refused, BrokenWrite)):
        return True
    return isinstance(answer, (Hangup, Reset)) and not answer.partial


class Script:
    """Answers the judge's calls from a list (the last answer repeats). Records each call's
    (virtual) time, request and JSON body, and the most calls the server held at once."""

    def __init__(self, *answers: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answers = list(answers)
        self.times: list[float] = []
        self.requests: list[Request | None] = []  # None for a call refused or reset at connect
        self.active = 0
        self.max_active = 0
        self.network = MemoryNetwork(serve_requests(self._handle), connect=self._connect, tls=tls)

    @property
    def calls(self) -> int:
        return len(self.times)

    @property
    def bodies(self) -> list[Any]:
        return [None if r is None else json.loads(r.body) for r in self.requests]

    def _answer(self, index: int) -> Answer:
        return self.answers[min(index, len(self.answers) - 1)]

    def _take(self, request: Request | None) -> Answer:
        answer = self._answer(self.calls)
        self.times.append(trio.current_time())
        self.requests.append(request)
        return answer

    def _connect(self, host: str, port: int) -> Connect:
        answer = self._answer(self.calls)
        if isinstance(answer, Refused):
            self._take(None)
            return "refuse"
        if isinstance(answer, BrokenWrite):
            self._take(None)
            return "reset"
        return "accept"

    async def _handle(self, request: Request, stream: trio.abc.Stream) -> bool:
        answer = self._take(request)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if not isinstance(answer, Fixed):
                answer = await answer(request)
            else:
                await trio.lowlevel.checkpoint()
            if isinstance(answer, Reply):
                keep = not _fresh(self._answer(self.calls))
                await stream.send_all(answer.bytes(close=not keep))
                return keep
            if isinstance(answer, (Hangup, Reset)):
                if answer.partial:
                    await stream.send_all(answer.partial)
                if isinstance(answer, Reset):
                    reset(stream)
                return False
            raise AssertionError(f"call {self.calls} is {answer!r} but its connection was open")
        finally:
            self.active -= 1


class ByHost:
    """A network backend routing each connection to the backend of its `host:port` (one per
    replica of a fleet)."""

    def __init__(self, backends: dict[str, NetworkBackend]) -> None:
        self.backends = backends

    async def connect_tcp(self, host: str, port: int) -> trio.abc.Stream:
        return await self.backends[f"{host}:{port}"].connect_tcp(host, port)
