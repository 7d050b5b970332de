"""The HTTP judge: `HttpJudge`, one POST per attempt to an OpenAI-style server, and
`make_http_judge`, the judge `settings.judge` describes.

One `attempt()` is one POST: the body is the judge API's (`judge.apis`), the exchange the
keep-alive pool's (`judge.pool`), which is the only way to the judge (tests reach it through the
pool's network backend, `judge.network`). Every failure the pool raises is mapped at this
boundary, by one table (`TRANSPORT_ERRORS`), to a `JudgeTransportError` (docs/differences.md,
D14); retries, pacing and deadlines belong to the caller (`judge.attempts`), so the pool has no
timeouts and no connection retries of its own (D15).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from functools import partial
from typing import Final, final

import httpx
import trio

from genrm_trio.config import ConfigError, Settings, endpoint_of, read_secret
from genrm_trio.domain.codec import values_outside_strings_at_most
from genrm_trio.domain.ratelimit import parse_rate_limit_headers
from genrm_trio.domain.ratelimit import parse_retry_after as retry_after_seconds
from genrm_trio.judge.apis import JUDGE_APIS, JudgeApi, judge_api, roles_refused
from genrm_trio.judge.base import (
    EXCERPT_BYTES,
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
)
from genrm_trio.judge.http1 import OutgoingRequest, ResponseTooLarge
from genrm_trio.judge.network import NetworkBackend
from genrm_trio.judge.offload import score_off_loop
from genrm_trio.judge.pool import (
    CertificateError,
    KeepAlivePool,
    StaleConnectionError,
    UnreachableError,
    judge_pool,
)
from genrm_trio.judge.prompts import judge_prompt

__all__ = [
    "DECODE_OFF_LOOP_BYTES",
    "MAX_REPLY_VALUES",
    "TRANSPORT_ERRORS",
    "HttpJudge",
    "Redactor",
    "make_http_judge",
    "parse_retry_after",
    "transport_error",
]

TRANSPORT_ERRORS: Final[tuple[tuple[type[httpx.HTTPError], str, bool, bool, bool], ...]] = (
    # (what the pool raised, the {ErrorType} of the judge error, retried against the same
    #  judge, retried on another replica of a fleet, the request reached a server); the first
    #  row that matches wins.
    (CertificateError, "ConnectError", False, True, True),  # this replica's certificate
    (UnreachableError, "ConnectError", True, True, False),  # no TCP connection: not sent
    (httpx.ConnectError, "ConnectError", True, True, True),  # a TLS handshake that broke
    (httpx.ReadError, "ReadError", True, True, True),
    (httpx.WriteError, "WriteError", True, True, True),
    (httpx.RemoteProtocolError, "RemoteProtocolError", True, True, True),
    (ResponseTooLarge, "ResponseTooLarge", False, False, True),  # the same request and reply
    (httpx.DecodingError, "DecodingError", False, False, True),
    (httpx.LocalProtocolError, "LocalProtocolError", False, False, True),  # a client bug
)
"""Every failure of an exchange, as a judge error (docs/differences.md, D14): the connect, read
and write failures and a connection closed before a complete response are transient; a reply too
large or in an encoding that does not decode, and a request the client refuses to write, would
be the same again. A certificate the judge's TLS trust rejects would be too, at that replica.
A connection that could not be opened never carried the request: the judge is unreachable, and
a fleet that waits out outages does not count it as an attempt (docs/reliability.md)."""

_BEARER: Final = rb"(?P<scheme>bearer\s+)[^\s;,\"'()\[\]]+"
"""Any bearer credential, the judge's or another (a proxy's), as a header echo shows it."""

REDACTED: Final = b"[redacted]"


def _byte_forms(byte: int) -> bytes:
    """One byte of a secret as an echo may show it: itself, backslash-escaped (JSON's `\\/`),
    percent-escaped, or as a JSON/Python `\\u00XX` / `\\xXX` escape."""
    forms = (
        re.escape(bytes([byte])),
        rb"\\" + re.escape(bytes([byte])),
        b"%%%02x" % byte,
        rb"\\u00%02x" % byte,
        rb"\\x%02x" % byte,
    )
    return b"(?:" + b"|".join(forms) + b")"


_LONGEST_FORM: Final = len(b"\\u0000")
"""The most bytes one byte of a secret takes in an echo (`_byte_forms`)."""


@final
class Redactor:
    """THE redaction of judge-supplied bytes (error bodies, previews, exception texts) before
    they reach a failure reason, a log, a row, a checkpoint or the state file: the judge's
    token in any echoed form (`_byte_forms`, case-insensitive) and any `Bearer` credential
    become `[redacted]` (docs/reliability.md, "Security")."""

    def __init__(self, token: str | None) -> None:
        alternatives = [_BEARER]
        secret = token.encode("utf-8") if token else b""
        if secret:
            alternatives.append(b"".join(_byte_forms(byte) for byte in secret))
        self._pattern: Final = re.compile(b"(?i)" + b"|".join(alternatives))
        # an echo of the secret that starts before an excerpt's cut ends within this many bytes
        self._reach: Final = _LONGEST_FORM * len(secret)

    def __call__(self, data: bytes, limit: int | None = None) -> bytes:
        """`data` redacted; with `limit`, its first `limit` bytes only (as an excerpt), cut
        AFTER redaction so that no part of a secret that straddles the cut is shown."""
        if limit is None:
            return self._pattern.sub(self._replace, data)
        window = data[: limit + self._reach]
        out, done = bytearray(), 0
        for match in self._pattern.finditer(window):
            if match.start() >= limit:
                break
            out += window[done : match.start()]
            out += self._replace(match)
            done = match.end()
        if done < limit:
            out += window[done:limit]
        return bytes(out)

    def text(self, text: str) -> str:
        """An exception's text, redacted (an httpx error can quote a header value)."""
        return self(text.encode("utf-8", errors="surrogateescape")).decode(
            "utf-8", errors="replace"
        )

    @staticmethod
    def _replace(match: re.Match[bytes]) -> bytes:
        scheme = match.group("scheme")
        return REDACTED if scheme is None else scheme + REDACTED


# --- reply headers and bodies ---------------------------------------------------------------------


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date (wall clock)."""
    return retry_after_seconds(value, now=time.time() if now is None else now)


def _raw_header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header `name` (lower case) in a raw header list."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def transport_error(exc: httpx.HTTPError, redact: Redactor) -> JudgeTransportError:
    """`exc`, raised by the pool, as the judge error `TRANSPORT_ERRORS` says it is; its text
    `redact`ed (httpx quotes a header value it refuses, the bearer token included)."""
    name, retryable, elsewhere, reached = next(
        (
            (name, retry, other, reached)
            for kind, name, retry, other, reached in TRANSPORT_ERRORS
            if isinstance(exc, kind)
        ),
        # not one the pool raises: a bug, reported under its own name and not retried
        (type(exc).__name__, False, False, True),
    )
    error = JudgeTransportError(name, redact.text(str(exc)) or name, reached=reached)
    error.retryable = retryable
    error.retry_elsewhere = elsewhere
    return error


ROLES_HINT: Final = (
    "the judge's chat template must accept the roles principle, response_1 and response_2, "
    "which judge.api {api} sends with judge.prompt: genrm; for any other model set "
    "judge.prompt: instruct"
)
"""Said after a reply that refuses the request for those roles (`apis.roles_refused`;
docs/configuration.md)."""

_FIRST_BYTES: Final = 80
"""How much of a reply that is not JSON its failure reason quotes."""


MAX_REPLY_VALUES: Final = 100_000
"""The most JSON values a judge reply may hold (a verdict reply holds a few dozen), counted from
its separators outside strings (`values_outside_strings_at_most`) before it is decoded: a 30 MiB
reply of `[[],[],…]` decoded to 800 MB in one call that held the GIL for 2.9 s
(docs/reliability.md, "Security")."""

DECODE_OFF_LOOP_BYTES: Final = 1 << 20
"""A reply body from this size (1 MiB) is decoded in a worker thread: 32 MiB took 40 ms."""


def _decode_json(content: bytes, content_type: str | None, redact: Redactor) -> object:
    """The decoded JSON reply; else `JudgeBadJSON` naming the reply's content type and first
    bytes (`redact`ed; a server that streams server-sent events says `text/event-stream`), or
    saying that it holds more than `MAX_REPLY_VALUES` values."""
    if len(content) > MAX_REPLY_VALUES:
        values = values_outside_strings_at_most(content, MAX_REPLY_VALUES)
        if values > MAX_REPLY_VALUES:
            raise JudgeBadJSON(
                f"the reply holds up to {values} JSON values, more than the {MAX_REPLY_VALUES} "
                f"a judge reply may hold (content-type {content_type or 'missing'}, "
                f"{len(content)} bytes)"
            )
    try:
        return json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        cause = (
            str(exc) if isinstance(exc, json.JSONDecodeError) else f"{type(exc).__name__}: {exc}"
        )
        head = redact(content, _FIRST_BYTES).decode("utf-8", errors="replace")
        more = "…" if len(content) > _FIRST_BYTES else ""
        raise JudgeBadJSON(
            f"{cause} (the reply is not JSON: content-type {content_type or 'missing'}, "
            f"{len(content)} bytes, first {head!r}{more})"
        ) from exc


# --- the judge ------------------------------------------------------------------------------------


@final
class HttpJudge:
    """A `Judge` that POSTs to an OpenAI-style server (Responses or chat completions) over
    `pool`."""

    def __init__(
        self,
        *,
        url: str,
        endpoint: str,
        api: JudgeApi,
        pool: KeepAlivePool,
        token: str | None = None,
        probe_url: str | None = None,
    ) -> None:
        parsed = httpx.URL(url)
        self._url = str(parsed)
        self._endpoint = endpoint
        self._path = parsed.path
        self._redact: Final = Redactor(token)
        # The request body and the reply's meaning are the API's; the rest is the same for both.
        self._api: Final = api
        self._pool: Final = pool
        # The request is (method, target, headers, body): the headers are the same for every
        # call but for the length.
        self._target: Final = parsed.raw_path
        headers = [
            (b"host", parsed.netloc),
            (b"content-type", b"application/json"),
            (b"accept", b"application/json"),
            # Judge replies are JSON on a fast network: compression buys nothing. A server that
            # compresses anyway is decoded (judge.pool.decode_content).
            (b"accept-encoding", b"identity"),
        ]
        if token is not None:
            headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
        self._header_list: Final = headers
        # GET {base_url}/models, as the start-up probe (judge.probe) sends it
        self._probe_request: OutgoingRequest | None = None
        if probe_url is not None:
            models = httpx.URL(probe_url)
            probe_headers = [(b"host", models.netloc), (b"accept", b"application/json")]
            probe_headers += [h for h in headers if h[0] in (b"accept-encoding", b"authorization")]
            self._probe_request = (b"GET", models.raw_path, probe_headers, b"")
        self._closed = False
        self._in_flight = 0
        self._decoding = trio.CapacityLimiter(1)  # replies of 1 MiB or more, one at a time

    def __repr__(self) -> str:
        return f"HttpJudge({self._api.name}, {self._url!r})"

    @property
    def endpoint(self) -> str:
        return self._endpoint

    @property
    def path(self) -> str:
        return self._path

    @property
    def url(self) -> str:
        return self._url

    @property
    def in_flight(self) -> int:
        """Attempts between request start and reply (or failure) now."""
        return self._in_flight

    @property
    def open_connections(self) -> int:
        """Connections the pool holds."""
        return self._pool.connections

    @property
    def pool(self) -> KeepAlivePool:
        return self._pool

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        """One POST: a classified reply, or JudgeTransportError / JudgeHTTPError / JudgeBadJSON."""
        if self._closed:
            raise RuntimeError("HttpJudge is closed")
        self._in_flight += 1
        try:
            try:
                status, headers, body = await self._pool.exchange(self._request(call))
            except StaleConnectionError:
                # Not answered, not an attempt: once more, on a new connection.
                status, headers, body = await self._pool.exchange(self._request(call), fresh=True)
        except httpx.HTTPError as exc:
            raise transport_error(exc, self._redact) from exc
        finally:
            self._in_flight -= 1
        rate_limit = parse_rate_limit_headers(headers, now=time.time())
        if not 200 <= status <= 299:
            retry_after = None if rate_limit is None else rate_limit.retry_after_s
            error = JudgeHTTPError(status, self._redact(body, EXCERPT_BYTES), retry_after)
            error.rate_limit = rate_limit
            if self._api.custom_roles and roles_refused(status, body):
                # what a chat template or an API that rejects unknown roles answers
                error.hint = ROLES_HINT.format(api=self._api.name)
            raise error
        content_type = _raw_header(headers, b"content-type")
        decode = partial(_decode_json, body, content_type, self._redact)
        if len(body) < DECODE_OFF_LOOP_BYTES:
            decoded = decode()
        else:  # pure: abandoned on cancel, its result unwanted then
            decoded = await score_off_loop(decode, self._decoding, abandon_on_cancel=True)
        reply = self._api.interpret(decoded)
        if rate_limit is not None:
            reply = dataclasses.replace(reply, rate_limit=rate_limit)
        return reply

    async def probe(self) -> str | None:
        """`GET {base_url}/models`: None when the server answered with a status below 500 (it
        is up, whether or not it lists models), else why not (judge.base.Probing). No deadline
        of its own: the caller bounds it."""
        if self._probe_request is None:
            return None  # nothing to probe with: as good as an answer
        try:
            status, _, _ = await self._pool.exchange(self._probe_request)
        except httpx.HTTPError as exc:
            return transport_error(exc, self._redact).describe()
        return None if status < 500 else f"HTTP {status}"

    def _request(self, call: JudgeCall) -> list[OutgoingRequest]:
        """`call`'s POST in a one-item list the pool empties once it is sent, so that no frame
        holds the prompt's bytes while the reply is awaited (docs/benchmarks.md, "Judge
        client"). (So a resend builds it anew.)"""
        content = json.dumps(self._api.body(call)).encode("ascii")
        headers = [*self._header_list, (b"content-length", b"%d" % len(content))]
        return [(b"POST", self._target, headers, content)]

    async def aclose(self) -> None:
        """Close the pool and its connections. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._pool.aclose()


def make_http_judge(
    settings: Settings,
    *,
    base_url: str | None = None,
    backend: NetworkBackend | None = None,
) -> HttpJudge:
    """The judge `settings.judge` describes (at `base_url`, one replica of a fleet, when given);
    `backend` opens its connections (tests: an in-memory network; else real TCP)."""
    judge = settings.judge
    if base_url is None:
        if judge.base_url is not None and not isinstance(judge.base_url, str):
            raise ConfigError(
                "settings", "judge.base_url", "a list of URLs is a fleet: use make_judge"
            )
        base_url = judge.base_url
    if base_url is None:
        raise ConfigError("settings", "judge.base_url", "required for an HTTP judge")
    token = None
    if judge.api_key_env:
        token = read_secret(judge.api_key_env, key="judge.api_key_env")
    return HttpJudge(
        url=base_url.rstrip("/") + JUDGE_APIS[judge.api].path,
        endpoint=endpoint_of(base_url),
        api=judge_api(
            judge.api,
            settings.judge_create_params,
            prompt=judge_prompt(judge),
            structured_output=judge.structured_output,
        ),
        pool=judge_pool(base_url, judge, backend=backend),
        token=token,
        probe_url=base_url.rstrip("/") + "/models",
    )
