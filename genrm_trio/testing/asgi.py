"""The simulated judge over HTTP: a plain ASGI3 app speaking both judge APIs (`POST
/v1/responses`, `POST /v1/chat/completions`) plus `GET /v1/models`, `GET /health` and `GET
/stats`, and `serve_sim_judge`, that app on `genrm_trio.testing.server`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, assert_never, final, get_args

import httpx
import trio

from genrm_trio.config import JudgeApiName
from genrm_trio.judge.apis import JUDGE_APIS
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing.core import (
    DEFAULT_BUDGET_TOKENS,
    SimConfig,
    context_refusal,
    prompt_length,
    token_count,
)
from genrm_trio.testing.faults import (
    DROP_MESSAGE,
    NOT_JSON_BODY,
    default_body,
    fault_text,
    http_fault,
)
from genrm_trio.testing.judge import SimJudge
from genrm_trio.testing.policy import PolicyStandIn
from genrm_trio.testing.ratelimit import RATE_LIMITED_BODY
from genrm_trio.testing.verdicts import FILLER

__all__ = ["SIM_APIS", "SimJudgeApp", "serve_sim_judge", "sim_asgi_app"]

_MODEL_ID: Final = "genrm-sim"
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024


class _SimulatedDrop(httpx.RemoteProtocolError):
    """Raised by the ASGI app after half a body: the `drop` fault, as the client should see it."""


# --- ASGI app ---------------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _history_content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") in ("input_text", "output_text", "text")
            and isinstance(part.get("text"), str)
        )
    return ""


def _responses_call(body: Mapping[str, Any]) -> JudgeCall:
    raw_input = body.get("input", [])
    history: list[dict[str, str]] = []
    if isinstance(raw_input, str):
        history.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        for item in raw_input:
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                continue
            role = item.get("role", "user")
            history.append(
                {
                    "role": role if isinstance(role, str) else "user",
                    "content": _history_content(item.get("content")),
                }
            )
    else:
        raise _BadRequest(400, "input must be a string or a list")
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        raise _BadRequest(400, "metadata with response_1 and response_2 is required")
    response_1, response_2 = metadata.get("response_1"), metadata.get("response_2")
    if not isinstance(response_1, str) or not isinstance(response_2, str):
        raise _BadRequest(400, "metadata.response_1 and metadata.response_2 must be strings")
    principle = metadata.get("principle")
    if principle is not None and not isinstance(principle, str):
        raise _BadRequest(400, "metadata.principle must be a string")
    return JudgeCall(history, response_1, response_2, principle)


def _chat_call(body: Mapping[str, Any]) -> JudgeCall:
    return _messages_call(body.get("messages"), "messages")


def _openai_responses_call(body: Mapping[str, Any]) -> JudgeCall:
    return _messages_call(body.get("input"), "input")


def _messages_call(messages: object, key: str) -> JudgeCall:
    """The comparison of chat messages (or Responses input messages) that end with the roles
    principle (optional), response_1, response_2."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise _BadRequest(400, f"{key} must be a list of objects with a role")
    roles = [m["role"] for m in messages]
    if roles[-2:] != ["response_1", "response_2"]:
        raise _BadRequest(400, f"{key} must end with roles response_1, response_2")
    head = messages[:-2]
    principle: str | None = None
    if head and head[-1]["role"] == "principle":
        principle = _history_content(head[-1].get("content"))
        head = head[:-1]
    special = {"principle", "response_1", "response_2"}
    if any(m["role"] in special for m in head):
        raise _BadRequest(400, "principle, response_1, response_2 must come last, in that order")
    history = [{"role": m["role"], "content": _history_content(m.get("content"))} for m in head]
    return JudgeCall(
        history,
        _history_content(messages[-2].get("content")),
        _history_content(messages[-1].get("content")),
        principle,
    )


# Whether a request is a judge call (the answers in `metadata`, or as the last two chat roles)
# rather than an ordinary policy request, and a policy request's text (its instructions and every
# message's content, in order): one function per judge API.


def _responses_shaped(request: Mapping[str, Any]) -> bool:
    metadata = request.get("metadata")
    return isinstance(metadata, dict) and "response_1" in metadata and "response_2" in metadata


def _chat_shaped(request: Mapping[str, Any]) -> bool:
    return _ends_with_answers(request.get("messages"))


def _openai_responses_shaped(request: Mapping[str, Any]) -> bool:
    return _ends_with_answers(request.get("input"))


def _ends_with_answers(messages: object) -> bool:
    roles = (
        [m.get("role") for m in messages if isinstance(m, dict)]
        if isinstance(messages, list)
        else []
    )
    return roles[-2:] == ["response_1", "response_2"]


def _responses_prompt(request: Mapping[str, Any]) -> str:
    instructions = request.get("instructions")
    raw = request.get("input")
    items = [{"content": raw}] if isinstance(raw, str) else raw
    return _joined([instructions] if isinstance(instructions, str) else [], items)


def _chat_prompt(request: Mapping[str, Any]) -> str:
    return _joined([], request.get("messages"))


def _joined(parts: list[str], items: object) -> str:
    if isinstance(items, list):
        parts.extend(
            _history_content(item.get("content")) for item in items if isinstance(item, dict)
        )
    return "\n".join(parts)


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass")


def _responses_body(
    request: Mapping[str, Any], n: int, text: str, budget: bool, usage: tuple[int, int]
) -> dict[str, Any]:
    if budget:
        output: list[dict[str, Any]] = [
            {
                "type": "reasoning",
                "id": f"rs_sim_{n}",
                "summary": [{"type": "summary_text", "text": FILLER}],
            }
        ]
    else:
        output = [
            {
                "type": "message",
                "id": f"msg_sim_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    model = request.get("model")
    return {
        "id": f"resp_sim_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model if isinstance(model, str) else _MODEL_ID,
        "status": "incomplete" if budget else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if budget else None,
        "output": output,
        # openai's `Response` requires these (NeMo Gym's openai_model validates every upstream
        # reply with it, so without them a Gym `genrm_model` in front of this judge answers 500).
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        },
    }


def _chat_body(
    request: Mapping[str, Any], n: int, text: str, budget: bool, usage: tuple[int, int]
) -> dict[str, Any]:
    model = request.get("model")
    return {
        "id": f"chatcmpl-sim-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model if isinstance(model, str) else _MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": FILLER if budget else text},
                "finish_reason": "length" if budget else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        },
    }


@final
@dataclass(frozen=True, slots=True)
class _SimApi:
    """The simulated judge's side of one judge API: the comparison a request asks for, the key
    of its output budget (the API object's), the reply body, and, for the policy stand-in,
    whether a request is a judge call and a policy request's text."""

    call: Callable[[Mapping[str, Any]], JudgeCall]
    budget_key: str
    reply: Callable[[Mapping[str, Any], int, str, bool, tuple[int, int]], dict[str, Any]]
    judge_shaped: Callable[[Mapping[str, Any]], bool]
    policy_prompt: Callable[[Mapping[str, Any]], str]


def _sim_api(name: JudgeApiName) -> _SimApi:
    """The judge API `name` as the simulated judge serves it (mypy fails here until every
    `judge.api` value is served)."""
    match name:
        case "genrm_model":
            return _SimApi(
                _responses_call,
                JUDGE_APIS[name].budget_key,
                _responses_body,
                _responses_shaped,
                _responses_prompt,
            )
        case "openai_responses":
            return _SimApi(
                _openai_responses_call,
                JUDGE_APIS[name].budget_key,
                _responses_body,
                _openai_responses_shaped,
                _responses_prompt,
            )
        case "chat_completions":
            return _SimApi(
                _chat_call, JUDGE_APIS[name].budget_key, _chat_body, _chat_shaped, _chat_prompt
            )
        case _:
            assert_never(name)


SIM_APIS: Final[Mapping[JudgeApiName, _SimApi]] = {
    name: _sim_api(name) for name in get_args(JudgeApiName)
}
"""Every judge API the simulated judge serves (all of them), by `judge.api` value."""

_ROUTES: Final[Mapping[str, tuple[JudgeApiName, ...]]] = {
    path: tuple(
        # Gym's protocol first: a request shaped as no API's judge call is read as Gym's
        sorted(
            (n for n in SIM_APIS if "/v1" + JUDGE_APIS[n].path == path), key="genrm_model".__ne__
        )
    )
    for path in {"/v1" + JUDGE_APIS[name].path for name in SIM_APIS}
}
"""`POST /v1{path}` and the judge APIs posted there (the paths are the client's, `judge.apis`;
`genrm_model` and `openai_responses` share `/v1/responses`, told apart by the request's shape)."""


def _route_api(apis: tuple[JudgeApiName, ...], request: Mapping[str, Any]) -> JudgeApiName:
    """The API of a request to a path that several share: the first whose judge call the
    request is shaped as, else the first."""
    return next((name for name in apis if SIM_APIS[name].judge_shaped(request)), apis[0])


def _asked_budget(request: Mapping[str, Any], api: JudgeApiName) -> int | None:
    value = request.get(SIM_APIS[api].budget_key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _budget_tokens(request: Mapping[str, Any], api: JudgeApiName) -> int:
    asked = _asked_budget(request, api)
    return DEFAULT_BUDGET_TOKENS if asked is None else asked


def _overflow_body(message: str) -> bytes:
    """vLLM's error body (0.10: `ErrorResponse` under `error`)."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return _json_bytes({"error": error})


def _format_retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


@final
class SimJudgeApp:
    """The simulated judge as an ASGI3 app (both judge APIs); `sim` exposes calls and counters.

    Routes: `POST /v1/responses`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.
    The `drop` fault sends the headers (with a Content-Length) and half the body, then raises
    an `httpx.RemoteProtocolError` subclass: the server closes the connection (the client's
    httpx raises `RemoteProtocolError`), and
    `httpx.ASGITransport` hands the exception to the client as it is.
    """

    def __init__(
        self, config: SimConfig | None = None, *, policy: PolicyStandIn | None = None
    ) -> None:
        self.sim = SimJudge(config)
        self._core = self.sim._core
        self._n = 0
        # with a policy stand-in, requests that are not judge-shaped get its answers (no 400)
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        else:  # websocket: refuse
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if path == "/health":
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
                return
            await _respond(send, 200, b'{"status": "ok"}')
            return
        if path == "/stats" and method == "GET":
            # counters for load generators (genrm-trio bench --judge-stats-url)
            stats = dataclasses.asdict(self.sim.statistics())
            if self.policy is not None:
                stats["policy_calls"] = self.policy.calls  # not in `calls`: those are judge calls
            await _respond(send, 200, _json_bytes(stats))
            return
        if path == "/v1/models":
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
            elif not self._authorised(scope):
                await _respond(send, 401, default_body(401).encode())
            else:
                await _respond(send, 200, _models_body(self._core.config.context_tokens))
            return
        apis = _ROUTES.get(path)
        if apis is None:
            await _respond(send, 404, _json_bytes({"error": f"no route {path}"}))
            return
        if method != "POST":
            await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
            return
        try:
            if not self._authorised(scope):
                raise _BadRequest(401, "unauthorized")
            raw = await _read_body(receive)
            if raw is None:  # the client went away before sending the body
                return
            try:
                request = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise _BadRequest(400, f"body is not JSON: {error}") from error
            if not isinstance(request, dict):
                raise _BadRequest(400, "body must be a JSON object")
            api = _route_api(apis, request)
            sim = SIM_APIS[api]
            if self.policy is not None and not sim.judge_shaped(request):
                await self._answer_policy(sim, request, send)
                return
            call = sim.call(request)
            asked = request.get(sim.budget_key)
            if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
                call = dataclasses.replace(call, max_output_tokens=asked)
        except _BadRequest as error:
            self._core.bad_requests += 1
            await _respond(send, error.status, _json_bytes({"error": str(error)}))
            return
        self._n += 1
        await self._judge(api, request, call, self._n, receive, send)

    async def _answer_policy(self, sim: _SimApi, request: Mapping[str, Any], send: Send) -> None:
        assert self.policy is not None
        prompt = sim.policy_prompt(request)
        text = self.policy.answer(prompt)
        self._n += 1
        usage = (token_count(len(prompt)), token_count(len(text)))
        await _respond(send, 200, _json_bytes(sim.reply(request, self._n, text, False, usage)))

    def _authorised(self, scope: Scope) -> bool:
        key = self._core.config.api_key
        if key is None:
            return True
        expected = f"Bearer {key}".encode()
        return any(
            name.lower() == b"authorization" and value == expected
            for name, value in scope.get("headers", [])
        )

    async def _judge(
        self,
        api: JudgeApiName,
        request: Mapping[str, Any],
        call: JudgeCall,
        n: int,
        receive: Receive,
        send: Send,
    ) -> None:
        limited = self._core.rate_limit(call)
        limit_headers: list[tuple[bytes, bytes]] = []
        if limited is not None:
            served, limit_headers = limited
            if not served:
                await _respond(send, 429, RATE_LIMITED_BODY, limit_headers)
                return
        decision = self._core.begin(call, api)
        try:
            if not await _sleep_unless_disconnected(decision.delay_s, receive, self._core.serve):
                return
            fault, rule = decision.fault, decision.rule
            http = http_fault(fault, rule) if fault is not None else None
            if http is not None:
                extra: list[tuple[bytes, bytes]] = []
                if http.retry_after_s is not None:
                    extra.append((b"retry-after", _format_retry_after(http.retry_after_s).encode()))
                await _respond(send, http.status, http.body, extra)
                return
            if fault == "not_json":
                await _respond(send, 200, NOT_JSON_BODY.encode(), content_type=b"text/plain")
                return
            window = self._core.config.context_tokens
            if window is not None:
                asked = _asked_budget(request, api)
                refusal = context_refusal(window, token_count(prompt_length(call)), asked)
                if refusal is not None:
                    self._core.overflows += 1
                    await _respond(send, 400, _overflow_body(refusal))
                    return
            limit = _budget_tokens(request, api)
            budget = fault == "budget_exhausted" or self._core.cut_off(decision, limit)
            text = (
                ""
                if budget
                else fault_text(fault, rule, call.response_1, call.response_2, decision.verdict)
            )
            if budget:
                out_tokens = limit
            elif decision.need is not None:
                out_tokens = decision.need
            else:
                out_tokens = token_count(len(text))
            usage = (token_count(prompt_length(call)), out_tokens)
            body = _json_bytes(SIM_APIS[api].reply(request, n, text, budget, usage))
            if fault == "drop":
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": body[: len(body) // 2],
                        "more_body": True,
                    }
                )
                # A real server closes the connection (its client sees the body cut short);
                # under httpx.ASGITransport the exception reaches the client as it is.
                raise _SimulatedDrop(
                    f"{DROP_MESSAGE} (received {len(body) // 2} bytes, expected {len(body)})"
                )
            await _respond(send, 200, body, limit_headers)
        finally:
            self._core.end()


def _models_body(context_tokens: int | None) -> bytes:
    """`GET /v1/models`: the one model, with `max_model_len` as vLLM reports it when the
    simulated judge has a context window."""
    model: dict[str, Any] = {"id": _MODEL_ID, "object": "model", "owned_by": "genrm-trio"}
    if context_tokens is not None:
        model["max_model_len"] = context_tokens
    return _json_bytes({"object": "list", "data": [model]})


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY_BYTES:
            raise _BadRequest(413, "body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _sleep_unless_disconnected(
    delay_s: float,
    receive: Receive,
    serve: Callable[[float], Awaitable[None]] = trio.sleep,
) -> bool:
    """Sleep `delay_s` (with `serve`: the simulator's capacity queue, then the latency); False
    if the client disconnected meanwhile (then nothing is sent)."""
    if delay_s <= 0:
        return True
    disconnected = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        await serve(delay_s)
        nursery.cancel_scope.cancel()
    return not disconnected


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    content_type: bytes | None = None,
) -> None:
    if content_type is None:
        content_type = b"application/json" if body.startswith(b"{") else b"text/plain"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def sim_asgi_app(
    config: SimConfig | None = None, *, policy: PolicyStandIn | None = None
) -> SimJudgeApp:
    """A fresh simulated-judge ASGI app (its own counters; `app.sim` is its `SimJudge`); with a
    `policy` it also answers ordinary (policy) requests."""
    return SimJudgeApp(config, policy=policy)


# --- serving ----------------------------------------------------------------------------------


async def serve_sim_judge(
    config: SimConfig | SimJudgeApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the simulated judge until cancelled, on :mod:`genrm_trio.testing.server` (a minimal
    HTTP/1.1 server: the judge's own CPU per call must not stretch the latencies a benchmark
    measures).

    `task_status.started()` reports the bound port (useful with `port=0`). Pass a `SimJudgeApp`
    instead of a config to keep a handle on its calls and counters.
    """
    from genrm_trio.testing.server import serve_h1

    app = config if isinstance(config, SimJudgeApp) else SimJudgeApp(config)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_h1, app, host=host, port=port, backlog=4096))
        task_status.started(bound)
