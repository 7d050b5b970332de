"""The judge client against what real servers do: a keep-alive close crossing a request on a
reused connection, an answer sent (and the connection closed) before the request body is in,
compressed bodies nobody asked for, oversized replies, certificates, and one-line error logs.
Scripted servers on 127.0.0.1 speak exact bytes; every exchange is bounded by `fail_after`."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import socket
import ssl
import struct
import subprocess
import zlib
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from real_sockets import (
    CALL,
    real_judge,
    responses_reply,
    scripted_judge,
    serve_tls,
    tiny_server,
)

from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.domain.model import Scored
from genrm_trio.judge.base import (
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
    one_line,
)
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.pool import KeepAlivePool, StaleConnectionError
from genrm_trio.judge.probe import ProbeReport, log_proxy_use, probe_judge
from genrm_trio.testing.network import response_bytes

BODY = json.dumps(responses_reply()).encode()


def _reset(stream: trio.SocketStream) -> None:
    """Make the coming close a reset (RST), as a server does that drops a connection hard."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


# --- a reused connection the server closed as the request went out ------------------------------


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_reused_connection_closed_before_any_reply_byte_is_sent_again(how: str) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 1:  # the second request, on the reused connection: closed unanswered
            if how == "reset":
                _reset(stream)
            return False
        await stream.send_all(response_bytes(200, BODY))
        return True

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            # Succeeds: the request went out once more on a new connection, inside the attempt.
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
        assert (len(server.requests), server.connections) == (3, 2)
        assert server.requests[1] == server.requests[2]
        assert judge._pool is not None and judge._pool.stale_retries == 1


async def test_pool_resends_a_bytes_request_itself_and_a_list_request_asks_the_caller() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n in (1, 3):
            return False
        await stream.send_all(response_bytes(200, b"{}"))
        return True

    request = (b"POST", b"/v1/responses", [(b"host", b"x"), (b"content-length", b"2")], b"{}")
    async with tiny_server(script) as server:
        pool = KeepAlivePool(httpx.URL(f"http://127.0.0.1:{server.port}"))
        with trio.fail_after(5):
            assert (await pool.exchange(request))[0] == 200
            assert (await pool.exchange(request))[0] == 200  # n=1 closed, n=2 answered
            with pytest.raises(StaleConnectionError):
                await pool.exchange([request])  # n=3 closed: the request is gone
            assert (await pool.exchange([request], fresh=True))[0] == 200
        assert (len(server.requests), server.connections, pool.stale_retries) == (5, 3, 2)
        await pool.aclose()


async def test_a_fresh_connection_closed_unanswered_is_one_failed_attempt() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        return False

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "RemoteProtocolError"
        assert info.value.retryable
        assert len(server.requests) == 1  # not sent again: nothing says it was not processed


async def test_a_reused_connection_closed_mid_reply_is_not_sent_again() -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 1:
            await stream.send_all(response_bytes(200, BODY)[:20])
            return False
        await stream.send_all(response_bytes(200, BODY))
        return True

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            await judge.attempt(CALL)
            with pytest.raises(JudgeTransportError) as info:
                await judge.attempt(CALL)
        assert info.value.type_name == "RemoteProtocolError"
        assert len(server.requests) == 2


# --- an answer before the request body is in ----------------------------------------------------


async def test_413_sent_while_the_body_is_still_going_out_is_read_and_reported() -> None:
    heads: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some()
        heads.append(buffer.split(b"\r\n\r\n")[0])
        await stream.send_all(
            response_bytes(413, b"<html>\r\n<h1>413 Request Entity Too Large</h1>\r\n</html>")
        )
        # A lingering close, as nginx and uvicorn do: stop sending, discard the rest of the body
        # until the client hangs up. (Closing at once with the body unread makes the kernel reset
        # the connection, and a reset may discard the 413 before anyone can read it.)
        await stream.send_eof()
        while await stream.receive_some():
            pass
        await stream.aclose()

    big = JudgeCall(CALL.history, "x" * (16 * 1024 * 1024), "y", None)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        judge = real_judge(listeners[0].socket.getsockname()[1])
        with trio.fail_after(10), pytest.raises(JudgeHTTPError) as info:
            await judge.attempt(big)
        assert info.value.status == 413
        assert not info.value.retryable  # a 4xx: not a transport error, not retried
        assert b"413 Request Entity Too Large" in info.value.body
        assert len(heads) == 1
        await judge.aclose()
        nursery.cancel_scope.cancel()


# --- compression nobody asked for ---------------------------------------------------------------


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data)


def _zlib(data: bytes) -> bytes:
    return zlib.compress(data)


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("coding", "encode"),
    [("gzip", _gzip), ("x-gzip", _gzip), ("deflate", _zlib), ("deflate", _raw_deflate)],
)
async def test_compressed_bodies_are_decoded(coding: str, encode: Any) -> None:
    payload = encode(BODY)
    error_page = encode(b"<html>\r\nbad gateway\r\n</html>")

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        if n == 0:
            await stream.send_all(response_bytes(200, payload, [f"content-encoding: {coding}"]))
        else:
            await stream.send_all(response_bytes(502, error_page, [f"content-encoding: {coding}"]))
        return True

    async with scripted_judge(script) as (server, judge):
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED
            with pytest.raises(JudgeHTTPError) as info:
                await judge.attempt(CALL)
        assert info.value.body == b"<html>\r\nbad gateway\r\n</html>"
        assert b"\r\naccept-encoding: identity\r\n" in server.requests[0]
        assert server.connections == 1  # the decoded reply left the connection reusable


@pytest.mark.parametrize(
    ("headers", "payload", "message"),
    [
        (["content-encoding: br"], BODY, "unsupported Content-Encoding 'br'"),
        (["content-encoding: gzip"], b"not gzip at all", "gzip body does not decode"),
    ],
)
async def test_undecodable_bodies_are_one_clear_non_retryable_error(
    headers: list[str], payload: bytes, message: str
) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, payload, headers))
        return True

    async with scripted_judge(script) as (_, judge):
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "DecodingError"
        assert message in str(info.value)
        assert not info.value.retryable


# --- the response size cap ----------------------------------------------------------------------

_CAP = 4096


def _framed(kind: str, body: bytes) -> tuple[bytes, bool]:
    if kind == "length":
        return response_bytes(200, body), True
    if kind == "chunked":
        parts = [body[i : i + 1000] for i in range(0, len(body), 1000)]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        return head + chunks + b"0\r\n\r\n", True
    if kind == "close":
        return b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + body, False
    return response_bytes(200, gzip.compress(body), ["content-encoding: gzip"]), True


@pytest.mark.parametrize("kind", ["length", "chunked", "close", "gzip"])
async def test_a_reply_over_max_response_bytes_ends_the_attempt(kind: str) -> None:
    big = json.dumps(responses_reply("x" * (2 * _CAP))).encode()
    raw, keep = _framed(kind, big)

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(raw)
        return keep

    async with scripted_judge(script, max_response_bytes=_CAP) as (_, judge):
        with trio.fail_after(5), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        assert info.value.type_name == "ResponseTooLarge"
        assert not info.value.retryable
        assert "judge response exceeds judge.max_response_bytes (4096 bytes)" in str(info.value)
        # A connection left mid-body is closed; a compressed body was read whole first.
        assert judge.open_connections == (1 if kind == "gzip" else 0)
        # Just under the cap is fine.
        small = json.dumps(responses_reply("x" * (_CAP // 2))).encode()
        raw, keep = _framed(kind, small)
        with trio.fail_after(5):
            assert (await judge.attempt(CALL)).status is ReplyStatus.COMPLETED


# --- error bodies in log lines ------------------------------------------------------------------


def test_one_line_collapses_whitespace_and_bounds_the_text() -> None:
    page = "<html>\r\n  <head><title>502</title></head>\r\n\t<body>bad</body>\r\n</html>\r\n"
    assert one_line(page) == "<html> <head><title>502</title></head> <body>bad</body> </html>"
    assert one_line("x" * 50, 10) == "x" * 9 + "…"
    assert len(one_line("a b " * 1000, 100)) == 100


async def test_html_error_bodies_log_as_one_bounded_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from judges import ScriptedJudge, gather, http_error, member, running, settings

    page = b"<html>\r\n<body>\r\n" + b"upstream sick\r\n" * 200 + b"</body>\r\n</html>"
    judge = ScriptedJudge(script=lambda r1, r2, n: http_error(502, page))
    caplog.set_level(logging.DEBUG, logger="genrm_trio")
    async with running(settings(genrm_parse_retries=1), judge) as engine:
        replies = await gather(engine, [member(0), member(1)])
    assert not [r for r in replies if isinstance(r, Scored)]
    lines = [r.getMessage() for r in caplog.records if "upstream sick" in r.getMessage()]
    assert len(lines) >= 2  # the retry (debug) and the dropped comparison (warning)
    for line in lines:
        assert "\r" not in line and "\n" not in line
        assert len(line) <= 2100


# --- TLS with a private CA: judge calls and the probe alike -------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a certificate for 127.0.0.1 that it signed (the CA is in no default store)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("ca")
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.pem", "k.pem", "r.csr", "c.pem"))
    # A key usage on the CA and key identifiers on the leaf: Python 3.13 verifies strictly
    # (VERIFY_X509_STRICT) and refuses a CA certificate without them.
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=genrm-trio test CA", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", str(key), "-out", str(csr))  # fmt: skip
    ext = d / "ext.cnf"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    hashed = d / "certs"
    hashed.mkdir()
    digest = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(ca)],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    (hashed / f"{digest}.0").symlink_to(ca)
    return {"ca": ca, "cert": cert, "key": key, "dir": hashed}


async def _tls_judge(stream: trio.SocketStream, context: ssl.SSLContext) -> None:
    """The judge over TLS: a model list for the probe's GET, a verdict for every POST."""
    await serve_tls(
        stream, context, lambda request: b'{"data": []}' if request.startswith(b"GET ") else BODY
    )


def _https(port: int, **judge: Any) -> Settings:
    return settings_from_mapping({"judge": {"base_url": f"https://127.0.0.1:{port}/v1", **judge}})


@pytest.mark.parametrize("trust", ["ca_file", "SSL_CERT_FILE", "SSL_CERT_DIR", "nothing"])
async def test_private_ca_is_trusted_by_calls_and_probe_alike(
    trust: str,
    private_ca: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    judge_keys: dict[str, Any] = {}
    if trust == "ca_file":
        judge_keys["ca_file"] = str(private_ca["ca"])
    elif trust == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", str(private_ca["ca"]))
    elif trust == "SSL_CERT_DIR":
        monkeypatch.setenv("SSL_CERT_DIR", str(private_ca["dir"]))
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(private_ca["cert"], private_ca["key"])
    caplog.set_level(logging.INFO, logger="genrm_trio.serve")
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            trio.serve_tcp, partial(_tls_judge, context=server_context), 0
        )
        config = _https(listeners[0].socket.getsockname()[1], **judge_keys)
        judge = make_http_judge(config)
        with trio.fail_after(10):
            probed = (await probe_judge(config, None)).answered
            try:
                outcome: object = await judge.attempt(CALL)
            except JudgeTransportError as exc:
                outcome = exc
        await judge.aclose()
        nursery.cancel_scope.cancel()
    probe_lines = [r.getMessage() for r in caplog.records if "judge probe" in r.getMessage()]
    assert len(probe_lines) == 1
    if trust == "nothing":
        assert probed is False
        assert isinstance(outcome, JudgeTransportError)
        # A certificate the judge's trust rejects would be rejected again: not retried.
        assert outcome.type_name == "ConnectError" and not outcome.retryable
        for text in (str(outcome), probe_lines[0]):
            assert "TLS handshake failed" in text
            assert "CERTIFICATE_VERIFY_FAILED" in text
            assert "unable to get local issuer certificate" in text
    else:
        assert probed is True, probe_lines
        assert isinstance(outcome, JudgeReply) and outcome.status is ReplyStatus.COMPLETED


async def test_a_handshake_with_a_plain_http_server_names_the_tls_error() -> None:
    async def plain(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, plain, 0)
        judge = make_http_judge(_https(listeners[0].socket.getsockname()[1]))
        with trio.fail_after(10), pytest.raises(JudgeTransportError) as info:
            await judge.attempt(CALL)
        await judge.aclose()
        nursery.cancel_scope.cancel()
    assert info.value.type_name == "ConnectError"
    assert "TLS handshake failed" in str(info.value)
    assert "SSLError" in str(info.value)  # e.g. [SSL: WRONG_VERSION_NUMBER] or record layer


# --- proxies: not used, and the start-up log says so --------------------------------------------


@pytest.mark.parametrize("variable", [None, "HTTPS_PROXY", "http_proxy"])
def test_start_up_log_says_proxy_variables_are_not_used(
    variable: str | None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    if variable is not None:
        monkeypatch.setenv(variable, "http://proxy.invalid:3128")
    caplog.set_level(logging.INFO, logger="genrm_trio.serve")
    log_proxy_use()
    (record,) = [r for r in caplog.records if "proxy" in r.getMessage()]
    if variable is None:
        assert record.levelno == logging.INFO
        assert record.getMessage() == "judge: connecting directly (proxy variables are not used)"
    else:
        assert record.levelno == logging.WARNING
        assert f"the proxy variables {variable} are set but not used" in record.getMessage()


# --- framing in virtual time --------------------------------------------------------------------


async def test_a_reply_dribbled_over_20_virtual_seconds_is_read_whole(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raw = response_bytes(200, BODY)
    pieces = [raw[:10], raw[10 : len(raw) // 2], raw[len(raw) // 2 :]]

    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        for number, piece in enumerate(pieces):
            if number:
                await trio.sleep(10)
            await stream.send_all(piece)
        return True

    async with scripted_judge(script) as (_, judge):
        start = trio.current_time()
        with trio.fail_after(60):
            reply = await judge.attempt(CALL)
        assert reply.status is ReplyStatus.COMPLETED
        assert trio.current_time() - start == pytest.approx(20.0, abs=0.01)


async def test_idle_expiry_in_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, BODY))
        return True

    async with scripted_judge(script) as (server, judge):  # judge.keepalive_expiry_s: 4.0 (default)
        with trio.fail_after(60):
            await judge.attempt(CALL)
            await trio.sleep(3.9)
            await judge.attempt(CALL)  # idle 3.9 s: reused
            assert server.connections == 1
            await trio.sleep(4.1)
            await judge.attempt(CALL)  # idle 4.1 s: expired, a new connection
            assert server.connections == 2
            assert judge.open_connections == 1


async def test_413_from_a_server_that_stops_reading_but_keeps_the_connection() -> None:
    """The server answers after the head and then neither reads nor closes: the client stops
    writing the rest of its body and reports the answer (instead of hanging to its deadline)."""
    done = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some()
        await stream.send_all(response_bytes(413, b"request entity too large"))
        await done.wait()  # holds the connection open, reading nothing more
        await trio.aclose_forcefully(stream)

    big = JudgeCall(CALL.history, "x" * (32 * 1024 * 1024), "y", None)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        judge = real_judge(listeners[0].socket.getsockname()[1])
        with trio.fail_after(10), pytest.raises(JudgeHTTPError) as info:
            await judge.attempt(big)
        assert (info.value.status, info.value.body) == (413, b"request entity too large")
        assert judge.open_connections == 0  # half a body went out: never reused
        done.set()
        await judge.aclose()
        nursery.cancel_scope.cancel()


async def test_the_probe_asks_every_replica_of_a_fleet(caplog: pytest.LogCaptureFixture) -> None:
    async def script(n: int, request: bytes, stream: trio.SocketStream) -> bool:
        await stream.send_all(response_bytes(200, b'{"data": []}'))
        return True

    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    caplog.set_level(logging.INFO, logger="genrm_trio.serve")
    async with tiny_server(script) as server:
        urls = [f"http://127.0.0.1:{server.port}/v1", f"http://127.0.0.1:{dead_port}/v1"]
        config = settings_from_mapping({"judge": {"base_url": urls}})
        with trio.fail_after(10):
            # one of two did not answer: it refused, so it is down from the start
            report = await probe_judge(config, None)
            assert report == ProbeReport(answered=False, unreachable=(urls[1],))
            one = await probe_judge(settings_from_mapping({"judge": {"base_url": urls[:1]}}), None)
            assert one == ProbeReport(answered=True)
    assert server.requests[0].startswith(b"GET /v1/models HTTP/1.1\r\n")
    lines = [r.getMessage() for r in caplog.records if "judge probe" in r.getMessage()]
    assert lines.count(f"judge probe GET {urls[0]}/models: HTTP 200") == 2
    failed = [line for line in lines if line.startswith(f"judge probe GET {urls[1]}/models")]
    assert len(failed) == 1 and "failed: ConnectError: " in failed[0]
    assert len(lines) == 3
