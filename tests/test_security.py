"""Security over real sockets: default bind address, bearer auth, secrets never shown, bounded
failure reasons (docs/reliability.md, "Security").

One `genrm-trio serve` process (no `--host`) with `server.api_key_env` and `judge.api_key_env` set
to distinctive tokens, against a `genrm-trio sim-judge` process that requires the judge token.
Every reply body, every header and everything both processes print is kept and searched for the
tokens at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from procs import (
    Proc,
    Reply,
    answers,
    assert_masked,
    assert_scored,
    bodies,
    client,
    start_judge,
    start_server,
)

from genrm_trio.config import Settings

pytestmark = pytest.mark.slow

SERVER_ENV = "GENRM_TRIO_SECURITY_SERVER_TOKEN"
JUDGE_ENV = "GENRM_TRIO_SECURITY_JUDGE_TOKEN"
SERVER_TOKEN = f"srv-{secrets.token_hex(16)}"
JUDGE_TOKEN = f"jdg-{secrets.token_hex(16)}"
N = 4
BIG_BODY = "judge-error-body " * 400  # 6,800 characters; the judge client keeps 1,000 bytes


@dataclass
class Secured:
    judge: Proc
    server: Proc
    seen: list[str] = field(default_factory=list)  # every reply body and header, as text

    @property
    def base(self) -> str:
        return self.server.url

    def auth(self, token: str = SERVER_TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def keep(self, response: httpx.Response) -> httpx.Response:
        self.seen.append(response.text)
        self.seen.append(json.dumps(dict(response.headers)))
        return response

    def keep_reply(self, reply: Reply) -> Reply:
        self.seen.append(json.dumps(reply.body))
        self.seen.append(json.dumps(dict(reply.headers)))
        return reply


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("security")
    env = {SERVER_ENV: SERVER_TOKEN, JUDGE_ENV: JUDGE_TOKEN}
    judge = start_judge(
        directory,
        "--api-key-env",
        JUDGE_ENV,
        "--fault",
        f"http_error,status=500,match=[big500],position=both,body={BIG_BODY}",
        "--fault",
        f"http_error,status=503,match=[all500],body={BIG_BODY}",
        env=env,
    )
    config = {
        "num_rollouts_per_prompt": N,
        "cohort_collection_timeout_s": 10.0,
        "cohort_evaluation_timeout_s": 10.0,
        "judge_request_timeout_s": 5.0,
        "genrm_parse_retries": 1,
        "genrm_parse_retry_sleep_s": 0.01,
        "debug_logging": True,
        "judge": {"api_key_env": JUDGE_ENV},
        "server": {"api_key_env": SERVER_ENV},
    }
    try:
        server = start_server(directory, config, judge_url=judge.url + "/v1", env=env)
    except BaseException:
        judge.close()
        raise
    found = Secured(judge, server)
    try:
        yield found
    finally:
        server.close()
        judge.close()


# --- bind address -------------------------------------------------------------------------------


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of LISTEN sockets on `port` (Linux /proc/net/tcp{,6})."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_defaults_bind_loopback_only(secured: Secured) -> None:
    assert Settings().host == "127.0.0.1"
    for proc in (secured.server, secured.judge):  # neither was given --host
        assert proc.url.startswith("http://127.0.0.1:")
        if Path("/proc/net/tcp").exists():
            assert _listening_addresses(proc.port) == {"0100007F"}  # 127.0.0.1, nothing else


# --- bearer auth over a real socket ------------------------------------------------------------


async def test_bearer_token_is_required_except_on_health(secured: Secured) -> None:
    base = secured.base
    body = bodies("auth", answers("[clean]", N))[0]
    async with client() as http:
        for path in ("/health", "/healthz", "/readyz", "/livez", "/"):
            assert secured.keep(await http.get(base + path)).status_code == 200
        refused: list[httpx.Response] = [
            await http.post(f"{base}/verify", json=body),
            await http.post(f"{base}/verify", json=body, headers=secured.auth("wrong")),
            await http.post(f"{base}/verify", json=body, headers=secured.auth(JUDGE_TOKEN)),
            await http.post(
                f"{base}/verify", json=body, headers={"Authorization": f"Basic {SERVER_TOKEN}"}
            ),
            await http.post(f"{base}/verify", json=body, headers={"Authorization": SERVER_TOKEN}),
            await http.post(
                f"{base}/verify", json=body, headers={b"Authorization": b"Bearer \xff\xfe"}
            ),
            await http.post(f"{base}/compare", json={}),
            await http.get(f"{base}/metrics"),
            await http.get(f"{base}/cohorts"),
            await http.get(f"{base}/openapi.json"),
            await http.get(f"{base}/reverify_mode"),
            await http.get(f"{base}/no-such-route"),
        ]
        for response in refused:
            secured.keep(response)
            assert response.status_code == 401, (response.request.url, response.text)
            assert response.json() == {"detail": "missing or invalid bearer token"}
            assert response.headers["www-authenticate"] == "Bearer"
        assert (await http.get(f"{base}/cohorts")).status_code == 401
        ok = secured.keep(await http.get(f"{base}/metrics", headers=secured.auth()))
        assert ok.status_code == 200
        ok = secured.keep(await http.get(f"{base}/openapi.json", headers=secured.auth()))
        assert ok.status_code == 200
        assert "bearer" in ok.text.lower()


async def test_early_replies_close_the_connection_instead_of_wedging_it(secured: Secured) -> None:
    """A reply sent before the request body was read (401, 404, 405) carries Connection: close:
    without it the next request on that keep-alive connection sometimes got no answer at all."""
    base = secured.base
    body = {"payload": "x" * 10_000}
    async with client(timeout=3.0) as http:
        for _ in range(8):
            for method, path, headers, status in (
                ("POST", "/verify", {}, 401),
                ("POST", "/no-such-route", secured.auth(), 404),
                ("PUT", "/verify", secured.auth(), 405),
            ):
                early = secured.keep(
                    await http.request(method, base + path, json=body, headers=headers)
                )
                assert early.status_code == status
                assert early.headers["connection"] == "close"
                after = secured.keep(await http.get(f"{base}/health"))
                assert after.status_code == 200
        read = secured.keep(await http.post(f"{base}/verify", json=body, headers=secured.auth()))
        assert read.status_code == 422  # the body was read: the connection stays open
        assert read.headers.get("connection") != "close"


# --- secrets never shown; failure reasons bounded -----------------------------------------------


async def _group(secured: Secured, group_id: str, tag: str, tagged: Any = None) -> list[Reply]:
    replies: dict[int, Reply] = {}
    async with client(headers=secured.auth()) as http:

        async def one(i: int, body: dict[str, Any]) -> None:
            started = trio.current_time()
            response = await http.post(f"{secured.base}/verify", json=body)
            elapsed = trio.current_time() - started
            secured.keep(response)
            replies[i] = Reply(response.status_code, response.json(), response.headers, elapsed)

        async with trio.open_nursery() as nursery:
            for i, body in enumerate(bodies(group_id, answers(tag, N, tagged))):
                nursery.start_soon(one, i, body)
    return [replies[i] for i in range(N)]


async def test_the_judge_token_reaches_the_judge(secured: Secured) -> None:
    for reply in await _group(secured, "authorised", "[clean]"):
        assert_scored(reply)


async def test_failure_reasons_are_bounded(secured: Secured) -> None:
    partial = await _group(secured, "big-partial", "[big500]", tagged=(1, 2))
    assert_scored(partial[0])
    assert_scored(partial[3])
    for i in (1, 2):
        reason = assert_masked(partial[i], "JudgeHTTPError: HTTP 500; response=judge-error-body")
        # The judge client keeps 1,000 bytes of the body; the row stays within 2,000 characters.
        assert reason.count("judge-error-body") <= 1000 // len("judge-error-body ") + 1
    every = await _group(secured, "big-all", "[all500]")
    for reply in every:
        reason = assert_masked(reply, "GenRM masked every rollout of the group", "HTTP 503")
        assert len(reason) <= 2000
    async with client(headers=secured.auth()) as http:
        response = secured.keep(
            await http.post(
                f"{secured.base}/compare",
                json={
                    "conversation_history": [{"role": "user", "content": "q"}],
                    "response_objs": [b["response"] for b in bodies("c", answers("[all500]", 3))],
                },
            )
        )
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert "HTTP 503; response=judge-error-body" in detail
    assert len(detail) <= 2000


async def test_tokens_never_appear_in_logs_or_replies(secured: Secured) -> None:
    # Run after the others in this module (pytest keeps file order): stop both processes and
    # search everything they printed and everything they answered.
    async with client(headers=secured.auth()) as http:
        for path in ("/metrics", "/cohorts", "/openapi.json"):
            secured.keep(await http.get(secured.base + path))
    secured.server.signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(secured.server.wait, 15) == 0
    secured.judge.signal(signal.SIGTERM)
    assert await trio.to_thread.run_sync(secured.judge.wait, 15) == 0
    texts = {
        "serve stderr": secured.server.log(),
        "serve stdout": secured.server.stdout_rest().decode(errors="replace"),
        "judge stderr": secured.judge.log(),
        "replies": "\n".join(secured.seen),
    }
    assert "GenRM dropped comparison" in texts["serve stderr"]  # the failures were logged
    assert len(secured.seen) > 40
    for where, text in texts.items():
        for token in (SERVER_TOKEN, JUDGE_TOKEN):
            assert token not in text, f"a token leaked into {where}"
    assert SERVER_ENV not in os.environ and JUDGE_ENV not in os.environ
