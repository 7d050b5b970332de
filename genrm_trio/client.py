"""A client of genrm-trio's HTTP API for trainers: one group of completions in, one reward (or
None, masked) per completion out (docs/trainers.md, "The client").

Each group is sent as the server's `/verify` protocol expects it: one `POST /verify` per
completion, all at once, under a fresh `_ng_group_id` (its only `_ng_group_attempt`, 0) with
each member's `_ng_rollout_index`, so the server's group barrier, partial masking and every
other server-side feature apply. The group size must be the server's `num_rollouts_per_prompt`,
which the client reads once from `GET /group_settings` and checks before it sends anything (a
short group would wait out the server's collection deadline).

What a group gives:

- every member scored or masked: a `ScoredRollout` or `MaskedRollout` per member
  (`score_group_results`), or a float or None per member (`score_group`); a masked member's
  placeholder reward 0.0 is never returned;
- a group the server failed (every member masked, the evaluation deadline, a 503 whose `reason`
  is `group_failed` or `superseded`): every member `MaskedRollout` with the server's message;
- a member whose connection broke before its answer (reset, closed, refused while the server
  restarts): sent again, the same body (group id, attempt, index), after a back-off, up to
  `resends` times within the group's timeout; the server answers a re-sent member from its
  group (docs/http-api.md, "A member sent again");
- a server that cannot be reached after those resends, is shutting down (503 `shutting_down`),
  or answers a request with an error (401, 409, 422, ...): an exception (`GenRMUnavailable`,
  `GenRMRequestError`); a trainer should stop, not train on nothing;
- a reply the client cannot trust (larger than `max_reply_bytes`, not JSON, a reward that is
  not a finite number, a deadline that is not): `GenRMReplyError`;
- no answer within the timeout: `GenRMTimeout`.

Every failure is a `GenRMError`, and one exception, never a group. The client does not read
proxy variables (`HTTP_PROXY`, ...): it would send the bearer token to the proxy; a trainer
that needs one passes its own `httpx.AsyncClient` as `http`.

`AsyncGenRMClient` runs under trio and under asyncio (httpx and anyio serve both);
`GenRMClient` is its blocking twin: each call runs the async client under `trio.run`.

This module is a client of the HTTP API: of genrm-trio it imports only the pure exception-group
walker `genrm_trio.domain.exceptions`, nothing of the service (`lint-imports` holds it to that;
docs/architecture.md, "Layers").
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, final

import anyio
import httpx
import trio

from genrm_trio.domain.exceptions import describe, leaves

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEADLINE_MARGIN_S",
    "MAX_REPLY_BYTES",
    "RESENDS",
    "AsyncGenRMClient",
    "Completion",
    "GenRMClient",
    "GenRMError",
    "GenRMReplyError",
    "GenRMRequestError",
    "GenRMTimeout",
    "GenRMUnavailable",
    "GroupSettings",
    "GroupSizeError",
    "MaskedRollout",
    "Prompt",
    "RolloutResult",
    "ScoredRollout",
    "all_at_once",
    "loop_client",
    "one_error",
    "rewards_of",
    "scored_mean",
]

Prompt = str | Sequence[Mapping[str, Any]]
"""A prompt: a string (a user message) or chat messages (`{"role", "content"}` mappings)."""
Completion = str | Sequence[Mapping[str, Any]]
"""A completion: a string, or chat messages whose contents are joined (TRL's conversational
format: `[{"role": "assistant", "content": "..."}]`)."""

CONNECT_TIMEOUT_S: Final = 10.0
"""Opening a connection to the server takes at most this; then `GenRMUnavailable`."""
DEADLINE_MARGIN_S: Final = 60.0
"""The default timeout of a group is the server's two group deadlines plus this margin: the
server answers every member by its deadlines, so the client's own timeout is a backstop."""
MAX_REPLY_BYTES: Final = 16 * 1024 * 1024
"""The default bound of one reply's body: a row echoes its request, and a trainer's completion
is far smaller; a larger reply is `GenRMReplyError`, not gigabytes of memory."""
RESENDS: Final = 5
"""How many times a member whose connection broke is sent again, by default."""
_RESEND_BACKOFF_S: Final = 0.25  # the first wait before a resend; doubled each time up to...
_MAX_RESEND_BACKOFF_S: Final = 4.0  # ...this: 0.25 + 0.5 + 1 + 2 + 4 s covers a quick restart
_MIN_RETRY_AFTER_S: Final = 1.0  # a Retry-After of 0 must not become a busy loop
_MAX_RETRY_AFTER_S: Final = 30.0
# A connection that broke before its answer: the request may not have reached the server, or
# its answer was lost; either way the same request again is safe (the server answers a re-sent
# member from its group). Other transport errors (a bad URL, TLS, a local protocol error) would
# fail again the same way.
_BROKEN: Final = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)


class GenRMError(Exception):
    """Every error of this client."""


class GenRMUnavailable(GenRMError):
    """The server cannot be reached, the connection kept breaking, or the server is shutting
    down."""


class GenRMReplyError(GenRMError):
    """A reply the client does not accept: too large, not JSON, or not what the API defines
    (a reward that is not a finite number, a deadline that is not)."""


class GenRMTimeout(GenRMError):
    """The group got no answer within the client's timeout."""


class GroupSizeError(GenRMError, ValueError):
    """A group whose size is not the server's `num_rollouts_per_prompt` (nothing was sent)."""


class GenRMRequestError(GenRMError):
    """The server refused a request (401, 404, 409, 413, 422, ...): `status` and `detail`."""

    def __init__(self, status: int, detail: object) -> None:
        super().__init__(f"genrm-trio answered {status}: {detail!s:.1000}")
        self.status = status
        self.detail = detail


@final
@dataclass(frozen=True, slots=True)
class ScoredRollout:
    """A scored member: its reward (a finite number) and the server's whole reply row (its
    metrics included)."""

    reward: float
    row: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class MaskedRollout:
    """A masked member: no reward. `kind` is `judge_failed` (a 200 row with `mask_sample:
    true`: its comparisons failed, alone or with the whole group) or `group_failed` (the
    server answered 503 with the group's failure, `reason` `group_failed` or `superseded`,
    e.g. members missing at the collection deadline); `reason` is the server's message."""

    reason: str
    kind: Literal["judge_failed", "group_failed"]
    row: Mapping[str, Any] | None = None


RolloutResult = ScoredRollout | MaskedRollout


def rewards_of(results: Sequence[RolloutResult]) -> list[float | None]:
    """One reward per member: the score, or None for a masked member."""
    return [result.reward if type(result) is ScoredRollout else None for result in results]


def scored_mean(results: Sequence[RolloutResult]) -> float:
    """The mean of a group's scored rewards (0.0 when none is scored): the reward the trainer
    adapters without a mask (verl, slime) give a masked member, so that its advantage is 0."""
    scored = [result.reward for result in results if type(result) is ScoredRollout]
    return sum(scored) / len(scored) if scored else 0.0


@final
@dataclass(frozen=True, slots=True)
class GroupSettings:
    """`GET /group_settings`: the group size and the deadlines that bound a group's wait."""

    num_rollouts_per_prompt: int
    cohort_collection_timeout_s: float
    cohort_evaluation_timeout_s: float

    @classmethod
    def from_json(cls, value: object) -> GroupSettings:
        if not isinstance(value, dict):
            raise GenRMReplyError(f"GET /group_settings: expected an object, got {value!r:.200}")
        try:
            size = value["num_rollouts_per_prompt"]
            collection = float(value["cohort_collection_timeout_s"])
            evaluation = float(value["cohort_evaluation_timeout_s"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise GenRMReplyError(f"GET /group_settings: unexpected reply {value!r:.200}") from None
        if type(size) is not int or size < 1:
            raise GenRMReplyError(f"GET /group_settings: bad num_rollouts_per_prompt {size!r:.40}")
        for name, seconds in (("collection", collection), ("evaluation", evaluation)):
            # the client's default timeout is made of these: an endless one would never end
            if not (math.isfinite(seconds) and seconds > 0):
                raise GenRMReplyError(
                    f"GET /group_settings: cohort_{name}_timeout_s is not a positive number of "
                    f"seconds: {seconds!r}"
                )
        return cls(size, collection, evaluation)

    def group_timeout_s(self) -> float:
        """The default bound of one group's wait (`DEADLINE_MARGIN_S` over the server's)."""
        deadlines = self.cohort_collection_timeout_s + self.cohort_evaluation_timeout_s
        return deadlines + DEADLINE_MARGIN_S


def _input_items(prompt: Prompt) -> list[dict[str, Any]]:
    """The prompt as `responses_create_params.input` message items."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    items: list[dict[str, Any]] = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, list):
            # chat-template text parts are the Responses API's input_text parts
            content = [
                {**part, "type": "input_text"}
                if isinstance(part, Mapping) and part.get("type") == "text"
                else part
                for part in content
            ]
        items.append({"role": message.get("role", "user"), "content": content})
    return items


def completion_text(completion: Completion) -> str:
    """A completion's text: the string, or its messages' text contents joined."""
    if isinstance(completion, str):
        return completion
    texts: list[str] = []
    for message in completion:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
    return "".join(texts)


def verify_body(
    prompt: Prompt,
    completion: Completion,
    *,
    group_id: str,
    rollout_index: int,
    principle: str | None = None,
) -> dict[str, Any]:
    """The `/verify` body of one member (docs/http-api.md, "POST /verify")."""
    body: dict[str, Any] = {
        "responses_create_params": {"input": _input_items(prompt)},
        "response": {
            "object": "response",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": completion_text(completion)}],
                }
            ],
        },
        "_ng_group_id": group_id,
        # a group id is used once, so this is its only attempt; sent, since a request without
        # it is a legacy request to the server (which logs a warning for those)
        "_ng_group_attempt": 0,
        "_ng_rollout_index": rollout_index,
    }
    if principle is not None:
        body["principle"] = principle
    return body


def group_size_message(got: int, size: int, setting: str) -> str:
    """The refusal of a group of `got` completions by a server of groups of `size`: both numbers
    and the setting to change (nothing was sent)."""
    one = " (a server started without it scores groups of one)" if size == 1 else ""
    return (
        f"{setting} is {got} but the genrm-trio server scores groups of "
        f"num_rollouts_per_prompt={size}{one}: set {setting} to {size}, or start the server "
        f"with --num-rollouts-per-prompt {got} (nothing was sent)"
    )


def new_group_id() -> str:
    """A fresh group id: never seen by the server, so a group never joins an older one."""
    return f"genrm-client-{uuid.uuid4().hex}"


@final
@dataclass(frozen=True, slots=True)
class _Reply:
    """A reply read whole (within the client's size bound)."""

    status: int
    headers: httpx.Headers
    content: bytes

    def text(self, limit: int = 200) -> str:
        return self.content[:limit].decode("utf-8", "replace")


@final
class _Body(httpx.AsyncByteStream):
    """A request body of one chunk whose iterator is an object, not an async generator: a
    connection reset while it is sent leaves no generator behind for the event loop to
    finalise (httpx's own `ByteStream` is one, and trio warns about each)."""

    def __init__(self, content: bytes) -> None:
        self._content = content
        self._sent = False

    def __aiter__(self) -> _Body:
        self._sent = False
        return self

    async def __anext__(self) -> bytes:
        if self._sent:
            raise StopAsyncIteration
        self._sent = True
        return self._content


def _refuse_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _decoded(reply: _Reply) -> object:
    """A reply's JSON, or ValueError (NaN and Infinity are not JSON, so they are refused too)."""
    try:
        return json.loads(reply.content, parse_constant=_refuse_constant)
    except RecursionError:  # nesting deeper than Python's stack: not a reply of the API
        raise ValueError("JSON nested too deeply") from None


def _json(reply: _Reply, route: str) -> object:
    """A 200 reply's JSON; a body that is not JSON is `GenRMReplyError`, not a ValueError."""
    try:
        return _decoded(reply)
    except ValueError as exc:
        raise GenRMReplyError(
            f"{route}: a {reply.status} reply that is not JSON: {reply.text()!r} ({exc})"
        ) from None


def _refusal(reply: _Reply) -> tuple[object, object]:
    """A refusal's `detail` (its text when the body is not JSON) and a 503's machine-readable
    `reason` (docs/http-api.md, "503 reasons") or None, from one decoding of the body."""
    try:
        value = _decoded(reply)
    except ValueError:
        return reply.text(), None
    if isinstance(value, dict):
        return value.get("detail", value), value.get("reason")
    return value, None


def _retry_after_s(reply: _Reply) -> float | None:
    """The wait a 503's Retry-After asks for, in `[_MIN_RETRY_AFTER_S, _MAX_RETRY_AFTER_S]`
    seconds, or None without one (the group's timeout bounds it too)."""
    value = reply.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:  # an HTTP date, or garbage
        return _MIN_RETRY_AFTER_S
    if not math.isfinite(seconds):
        return _MIN_RETRY_AFTER_S
    return min(max(seconds, _MIN_RETRY_AFTER_S), _MAX_RETRY_AFTER_S)


def _check_timeout(timeout: float | None) -> None:
    """A group's timeout is None (the server's deadlines) or a positive, finite number."""
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _row_result(row: object) -> RolloutResult:
    if not isinstance(row, dict):
        raise GenRMReplyError(f"/verify: expected a row object, got {row!r:.200}")
    mask = row.get("mask_sample")
    if mask is True:
        return MaskedRollout(str(row.get("failure_reason"))[:2000], "judge_failed", row)
    if mask is not False:
        raise GenRMReplyError(f"/verify: a row whose mask_sample is not a boolean: {mask!r:.40}")
    reward = row.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise GenRMReplyError(f"/verify: a scored row without a numeric reward: {reward!r:.200}")
    try:
        value = float(reward)
    except OverflowError:  # an integer too large for a float
        value = math.inf
    if not math.isfinite(value):
        # a trainer would train on it: NaN poisons a group's advantages
        raise GenRMReplyError(f"/verify: a reward that is not a finite number: {reward!r:.40}")
    return ScoredRollout(value, row)


class AsyncGenRMClient:
    """genrm-trio's client under trio or asyncio (see the module docstring).

    `timeout`: the bound of one group's wait in seconds; None (the default) takes the server's
    collection and evaluation deadlines plus `DEADLINE_MARGIN_S`. `http`: an httpx client of
    your own (its lifetime stays yours); by default one is made with no connection limit,
    since a group's members must all be in flight at once, and without proxies
    (`trust_env=False`). `group_settings`: skip `GET /group_settings` (the server's answer is
    used otherwise, fetched once). `resends`: how many times a request whose connection broke
    is sent again. `max_reply_bytes`: the bound of one reply's body.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = None,
        http: httpx.AsyncClient | None = None,
        group_settings: GroupSettings | None = None,
        resends: int = RESENDS,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        _check_timeout(timeout)
        if resends < 0 or max_reply_bytes < 1:
            raise ValueError(
                f"resends must be >= 0 and max_reply_bytes >= 1, got {resends}, {max_reply_bytes}"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.resends = resends
        self.max_reply_bytes = max_reply_bytes
        self._settings = group_settings
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            # the read bound is the group's timeout (anyio.fail_after), not httpx's
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            # HTTP_PROXY and friends would route the bearer token through a proxy, even for
            # 127.0.0.1 (as the CLI's own clients, never)
            trust_env=False,
        )
        self._headers = headers

    async def __aenter__(self) -> AsyncGenRMClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def group_settings(self) -> GroupSettings:
        """The server's group settings (`GET /group_settings`), fetched once."""
        if self._settings is None:
            bound = CONNECT_TIMEOUT_S * 3
            try:
                with anyio.fail_after(bound):
                    response = await self._request("GET", "/group_settings")
            except TimeoutError:
                raise GenRMTimeout(
                    f"GET /group_settings: no answer within {bound:g} s from {self.base_url}"
                ) from None
            if response.status != 200:
                raise GenRMRequestError(response.status, _refusal(response)[0])
            self._settings = GroupSettings.from_json(_json(response, "GET /group_settings"))
        return self._settings

    async def num_rollouts_per_prompt(self) -> int:
        return (await self.group_settings()).num_rollouts_per_prompt

    async def score_group(
        self, prompt: Prompt, completions: Sequence[Completion], *, principle: str | None = None
    ) -> list[float | None]:
        """One reward per completion, None for a masked one (its reason:
        `score_group_results`)."""
        return rewards_of(await self.score_group_results(prompt, completions, principle=principle))

    async def score_group_results(
        self, prompt: Prompt, completions: Sequence[Completion], *, principle: str | None = None
    ) -> list[RolloutResult]:
        """A `Scored` or `Masked` per completion, in order, for one whole group."""
        size = await self.num_rollouts_per_prompt()
        if len(completions) != size:
            raise GroupSizeError(group_size_message(len(completions), size, "the group's size"))
        members = list(enumerate(completions))
        return await self.score_members(
            prompt, members, group_id=new_group_id(), principle=principle
        )

    async def score_members(
        self,
        prompt: Prompt,
        members: Sequence[tuple[int, Completion]],
        *,
        group_id: str,
        principle: str | None = None,
    ) -> list[RolloutResult]:
        """Some members of a group whose other members are sent by other callers (e.g. other
        processes of a trainer): `(rollout_index, completion)` pairs under a shared `group_id`.
        The server answers once every member of the group has arrived, so every caller must
        send its part; the indices must be distinct across callers and in
        `[0, num_rollouts_per_prompt)`."""
        settings = await self.group_settings()
        seen: set[int] = set()
        for index, _ in members:
            if type(index) is not int or not 0 <= index < settings.num_rollouts_per_prompt:
                raise GroupSizeError(
                    f"rollout index {index!r} outside [0, {settings.num_rollouts_per_prompt})"
                )
            if index in seen:  # the server would refuse the second (409) or take it for a retry
                raise GroupSizeError(f"rollout index {index} twice in one call (nothing was sent)")
            seen.add(index)
        timeout = self.timeout if self.timeout is not None else settings.group_timeout_s()
        results: list[RolloutResult | None] = [None] * len(members)

        async def one(position: int, index: int, completion: Completion) -> None:
            body = verify_body(
                prompt, completion, group_id=group_id, rollout_index=index, principle=principle
            )
            results[position] = await self._verify(body)

        try:
            with anyio.fail_after(timeout):
                async with anyio.create_task_group() as tasks:
                    for position, (index, completion) in enumerate(members):
                        tasks.start_soon(one, position, index, completion)
        except TimeoutError:
            raise GenRMTimeout(
                f"group {group_id}: no answer within {timeout:g} s (the client's timeout)"
            ) from None
        except BaseExceptionGroup as group:
            # one member's error stops the group (several, if they failed at once)
            raise one_error(group)  # noqa: B904 - the group is in the note, not the chain
        return [result for result in results if result is not None]

    async def _request(self, method: str, path: str, body: object = None) -> _Reply:
        """One request, sent again while its connection breaks (up to `resends` times, with a
        doubling back-off): the same body, so a `/verify` member keeps its group id, attempt
        and index, and the server answers it from its group."""
        content = None
        if body is not None:  # as httpx's json= encodes it, once for every resend
            text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            content = text.encode()
        backoff = _RESEND_BACKOFF_S
        for resend in range(self.resends + 1):
            try:
                return await self._send(method, path, content)
            except _BROKEN as exc:
                if resend == self.resends:
                    raise GenRMUnavailable(
                        f"genrm-trio at {self.base_url} unreachable after {resend + 1} "
                        f"tries: {type(exc).__name__}: {exc}"
                    ) from exc
            except httpx.TransportError as exc:
                raise GenRMUnavailable(
                    f"genrm-trio at {self.base_url} unreachable: {type(exc).__name__}: {exc}"
                ) from exc
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_RESEND_BACKOFF_S)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _send(self, method: str, path: str, content: bytes | None) -> _Reply:
        """One request, its reply read whole up to `max_reply_bytes`."""
        headers = dict(self._headers)
        if content is not None:
            headers["Content-Type"] = "application/json"
        limit = self.max_reply_bytes
        request = self._http.build_request(
            method, self.base_url + path, content=content, headers=headers
        )
        if content is not None:
            request.stream = _Body(content)
        response = await self._http.send(request, stream=True)
        try:
            declared = response.headers.get("content-length", "")
            # the length's digits bounded first: int() refuses a few thousand of them
            if declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
                raise GenRMReplyError(self._too_large(path, f"{declared} bytes"))
            chunks: list[bytes] = []
            size = 0
            # a reply without Content-Length, counted as it arrives (decoded: a compressed
            # reply is bounded by what it becomes)
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise GenRMReplyError(self._too_large(path, f"over {size} bytes"))
                chunks.append(chunk)
            return _Reply(response.status_code, response.headers, b"".join(chunks))
        finally:
            await response.aclose()

    def _too_large(self, path: str, size: str) -> str:
        return (
            f"{path}: genrm-trio at {self.base_url} sent a reply of {size}, over the client's "
            f"max_reply_bytes={self.max_reply_bytes}"
        )

    async def _verify(self, body: dict[str, Any]) -> RolloutResult:
        while True:
            reply = await self._request("POST", "/verify", body)
            status = reply.status
            if status == 200:
                return _row_result(_json(reply, "/verify"))
            detail, reason = _refusal(reply)
            if status != 503:
                raise GenRMRequestError(status, detail)
            wait = _retry_after_s(reply)
            if reason == "at_capacity" or (reason is None and wait is not None):
                # the same request again after the wait (a proxy's 503 with Retry-After too)
                await anyio.sleep(wait if wait is not None else _MIN_RETRY_AFTER_S)
                continue
            if reason in ("group_failed", "superseded"):
                return MaskedRollout(f"{detail}"[:2000], "group_failed")
            # shutting_down, or a 503 the client does not know: stop rather than mask
            raise GenRMUnavailable(
                f"genrm-trio at {self.base_url} answered 503 ({reason!s:.40}): {detail!s:.300}"
            )


def one_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception to raise for a task group that failed: its first leaf, nested groups
    read through, so a caller catches the client's typed errors (`GenRMUnavailable`, ...)
    rather than a group. When the leaves say different things, the first gets a note naming
    every one (a traceback shows it), so no member's error is lost. The leaf keeps its own
    cause but not the group as its context: a traceback shows one error, not a nest of
    groups (a server that shuts down mid-step fails every member at once)."""
    found = leaves(group)
    distinct = dict.fromkeys(describe(leaf) for leaf in found)
    if len(distinct) > 1:
        found[0].add_note(f"{len(found)} errors: {'; '.join(distinct)}")
    found[0].__suppress_context__ = True
    return found[0]


async def all_at_once(calls: Iterable[Callable[[], Coroutine[Any, Any, object]]]) -> None:
    """Run the calls concurrently (the trainer adapters' groups of one batch); when one fails
    the others are cancelled and `one_error` of the failure is raised, not a group."""
    try:
        async with anyio.create_task_group() as tasks:
            for call in calls:
                tasks.start_soon(call)
    except BaseExceptionGroup as failed:
        raise one_error(failed)  # noqa: B904 - the group is in the note, not the chain


_LoopKey = tuple[str, str | None, float | None]
# One client per asyncio event loop and (URL, key, timeout): its pool and the server's group
# settings serve every group of a run; dropped with the loop (a trainer's loop lives as long as
# its rollouts).
_LOOP_CLIENTS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[_LoopKey, AsyncGenRMClient]
] = weakref.WeakKeyDictionary()


def loop_client(
    base_url: str, *, api_key: str | None = None, timeout: float | None = None
) -> AsyncGenRMClient:
    """The running asyncio loop's client of the server at `base_url`, made on first use: for
    trainer hooks that are called once per group or per rollout (slime's `group_rm`, verl's
    reward manager), so they share one connection pool rather than open one per call."""
    clients = _LOOP_CLIENTS.setdefault(asyncio.get_running_loop(), {})
    key = (base_url, api_key, timeout)
    client = clients.get(key)
    if client is None:
        client = clients[key] = AsyncGenRMClient(base_url, api_key=api_key, timeout=timeout)
    return client


_T = TypeVar("_T")


class GenRMClient:
    """The blocking twin of `AsyncGenRMClient`: each call runs it under `trio.run` (with its
    own connections, closed at the end of the call); the group settings are fetched once."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = None,
        group_settings: GroupSettings | None = None,
        resends: int = RESENDS,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        _check_timeout(timeout)
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.resends = resends
        self.max_reply_bytes = max_reply_bytes
        self._settings = group_settings

    def _run(self, call: Callable[[AsyncGenRMClient], Awaitable[_T]]) -> _T:
        async def main() -> _T:
            async with AsyncGenRMClient(
                self.base_url,
                api_key=self.api_key,
                timeout=self.timeout,
                group_settings=self._settings,
                resends=self.resends,
                max_reply_bytes=self.max_reply_bytes,
            ) as client:
                try:
                    return await call(client)
                finally:
                    self._settings = client._settings

        return trio.run(main)

    def group_settings(self) -> GroupSettings:
        return self._run(lambda client: client.group_settings())

    def num_rollouts_per_prompt(self) -> int:
        return self.group_settings().num_rollouts_per_prompt

    def score_group(
        self, prompt: Prompt, completions: Sequence[Completion], *, principle: str | None = None
    ) -> list[float | None]:
        """One reward per completion, None for a masked one."""
        return rewards_of(self.score_group_results(prompt, completions, principle=principle))

    def score_group_results(
        self, prompt: Prompt, completions: Sequence[Completion], *, principle: str | None = None
    ) -> list[RolloutResult]:
        return self._run(
            lambda client: client.score_group_results(prompt, completions, principle=principle)
        )

    def score_members(
        self,
        prompt: Prompt,
        members: Sequence[tuple[int, Completion]],
        *,
        group_id: str,
        principle: str | None = None,
    ) -> list[RolloutResult]:
        return self._run(
            lambda client: client.score_members(
                prompt, members, group_id=group_id, principle=principle
            )
        )
