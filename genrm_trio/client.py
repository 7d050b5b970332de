"""A client of genrm-trio's HTTP API for trainers: one group of completions in, one reward (or
None, masked) per completion out (docs/trainers.md, "The client").

Each group is sent as the server's `/verify` protocol expects it: one `POST /verify` per
completion, all at once, under a fresh `_ng_group_id` (its only `_ng_group_attempt`, 0) with
each member's `_ng_rollout_index`, so the server's group barrier, partial masking and every
other server-side feature apply. The group size must be the server's `num_rollouts_per_prompt`,
which the client reads once from `GET /group_settings` and checks before it sends anything (a
short group would wait out the server's collection deadline).

What a group gives:

- every member scored or masked: a `Scored` or `Masked` per member (`score_group_results`),
  or a float or None per member (`score_group`); a masked member's placeholder reward 0.0 is
  never returned;
- a group the server failed (every member masked, the evaluation deadline, a group-kind failure
  answered with 503): every member `Masked` with the server's reason;
- a server that cannot be reached, is shutting down, or answers a request with an error
  (401, 409, 422, ...): an exception (`GenRMUnavailable`, `GenRMRequestError`); a trainer
  should stop, not train on nothing;
- no answer within the timeout: `GenRMTimeout`.

`AsyncGenRMClient` runs under trio and under asyncio (httpx and anyio serve both);
`GenRMClient` is its blocking twin: each call runs the async client under `trio.run`.

This module is a client of the HTTP API: of genrm-trio it imports only the pure exception-group
walker `genrm_trio.domain.exceptions`, nothing of the service (`lint-imports` holds it to that;
docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math
import uuid
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
    "AsyncGenRMClient",
    "Completion",
    "GenRMClient",
    "GenRMError",
    "GenRMRequestError",
    "GenRMTimeout",
    "GenRMUnavailable",
    "GroupSettings",
    "GroupSizeError",
    "Masked",
    "Prompt",
    "RolloutResult",
    "Scored",
    "all_at_once",
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
_SHUTTING_DOWN: Final = "GenRM server is shutting down"
_MAX_RETRY_AFTER_S: Final = 30.0


class GenRMError(Exception):
    """Every error of this client."""


class GenRMUnavailable(GenRMError):
    """The server cannot be reached, the connection broke, or the server is shutting down."""


class GenRMTimeout(GenRMError):
    """The group got no answer within the client's timeout."""


class GroupSizeError(GenRMError, ValueError):
    """A group whose size is not the server's `num_rollouts_per_prompt` (nothing was sent)."""


class GenRMRequestError(GenRMError):
    """The server refused a request (401, 404, 409, 413, 422, ...): `status` and `detail`."""

    def __init__(self, status: int, detail: object) -> None:
        super().__init__(f"genrm-trio answered {status}: {detail}")
        self.status = status
        self.detail = detail


@final
@dataclass(frozen=True, slots=True)
class Scored:
    """A scored member: its reward and the server's whole reply row (its metrics included)."""

    reward: float
    row: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class Masked:
    """A masked member: no reward. `kind` is `judge_failed` (a 200 row with `mask_sample:
    true`: its comparisons failed, alone or with the whole group) or `group_failed` (the
    server answered 503 with the group's failure, e.g. members missing at the collection
    deadline); `reason` is the server's message."""

    reason: str
    kind: Literal["judge_failed", "group_failed"]
    row: Mapping[str, Any] | None = None


RolloutResult = Scored | Masked


def rewards_of(results: Sequence[RolloutResult]) -> list[float | None]:
    """One reward per member: the score, or None for a masked member."""
    return [result.reward if type(result) is Scored else None for result in results]


def scored_mean(results: Sequence[RolloutResult]) -> float:
    """The mean of a group's scored rewards (0.0 when none is scored): the reward the trainer
    adapters without a mask (verl, slime) give a masked member, so that its advantage is 0."""
    scored = [result.reward for result in results if type(result) is Scored]
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
            raise GenRMError(f"GET /group_settings: expected an object, got {value!r:.200}")
        try:
            size = value["num_rollouts_per_prompt"]
            collection = float(value["cohort_collection_timeout_s"])
            evaluation = float(value["cohort_evaluation_timeout_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise GenRMError(f"GET /group_settings: unexpected reply {value!r:.200}") from exc
        if type(size) is not int or size < 1:
            raise GenRMError(f"GET /group_settings: bad num_rollouts_per_prompt {size!r}")
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


def new_group_id() -> str:
    """A fresh group id: never seen by the server, so a group never joins an older one."""
    return f"genrm-client-{uuid.uuid4().hex}"


def _json(response: httpx.Response, route: str) -> object:
    """A 200 reply's JSON; a body that is not JSON is the client's error, not a ValueError."""
    try:
        return response.json()
    except ValueError as exc:
        raise GenRMError(
            f"{route}: a {response.status_code} reply that is not JSON: {response.text[:200]!r}"
        ) from exc


def _detail(response: httpx.Response) -> object:
    try:
        value = response.json()
    except ValueError:
        return response.text[:200]
    return value.get("detail", value) if isinstance(value, dict) else value


def _retry_after_s(response: httpx.Response) -> float | None:
    """The Retry-After of an at-capacity 503 (seconds), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S) if math.isfinite(seconds) else 1.0


def _check_timeout(timeout: float | None) -> None:
    """A group's timeout is None (the server's deadlines) or a positive, finite number."""
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _row_result(row: object) -> RolloutResult:
    if not isinstance(row, dict):
        raise GenRMError(f"/verify: expected a row object, got {row!r:.200}")
    if row.get("mask_sample") is True:
        return Masked(str(row.get("failure_reason")), "judge_failed", row)
    reward = row.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise GenRMError(f"/verify: a scored row without a numeric reward: {reward!r:.200}")
    return Scored(float(reward), row)


class AsyncGenRMClient:
    """genrm-trio's client under trio or asyncio (see the module docstring).

    `timeout`: the bound of one group's wait in seconds; None (the default) takes the server's
    collection and evaluation deadlines plus `DEADLINE_MARGIN_S`. `http`: an httpx client of
    your own (its lifetime stays yours); by default one is made with no connection limit,
    since a group's members must all be in flight at once. `group_settings`: skip
    `GET /group_settings` (the server's answer is used otherwise, fetched once).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float | None = None,
        http: httpx.AsyncClient | None = None,
        group_settings: GroupSettings | None = None,
    ) -> None:
        _check_timeout(timeout)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._settings = group_settings
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(
            # the read bound is the group's timeout (anyio.fail_after), not httpx's
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
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
            if response.status_code != 200:
                raise GenRMRequestError(response.status_code, _detail(response))
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
            raise GroupSizeError(
                f"a group of {len(completions)} completions; the server scores groups of "
                f"num_rollouts_per_prompt={size} (nothing was sent)"
            )
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
            raise one_error(group) from group
        return [result for result in results if result is not None]

    async def _request(self, method: str, path: str, body: object = None) -> httpx.Response:
        url = self.base_url + path
        try:
            if method == "GET":
                return await self._http.get(url, headers=self._headers)
            return await self._http.post(url, json=body, headers=self._headers)
        except httpx.TransportError as exc:
            raise GenRMUnavailable(
                f"genrm-trio at {self.base_url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc

    async def _verify(self, body: dict[str, Any]) -> RolloutResult:
        while True:
            response = await self._request("POST", "/verify", body)
            status = response.status_code
            if status == 200:
                return _row_result(_json(response, "/verify"))
            detail = _detail(response)
            if status == 503:
                wait = _retry_after_s(response)
                if wait is not None:  # at capacity: the same request again, after the wait
                    await anyio.sleep(wait)
                    continue
                if detail == _SHUTTING_DOWN:
                    raise GenRMUnavailable(f"genrm-trio at {self.base_url}: {detail}")
                return Masked(str(detail), "group_failed")
            raise GenRMRequestError(status, detail)


def one_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception to raise for a task group that failed: its first leaf, nested groups
    read through, so a caller catches the client's typed errors (`GenRMUnavailable`, ...)
    rather than a group. When the leaves say different things, the first gets a note naming
    every one (a traceback shows it), so no member's error is lost."""
    found = leaves(group)
    distinct = dict.fromkeys(describe(leaf) for leaf in found)
    if len(distinct) > 1:
        found[0].add_note(f"{len(found)} errors: {'; '.join(distinct)}")
    return found[0]


async def all_at_once(calls: Iterable[Callable[[], Coroutine[Any, Any, object]]]) -> None:
    """Run the calls concurrently (the trainer adapters' groups of one batch); when one fails
    the others are cancelled and `one_error` of the failure is raised, not a group."""
    try:
        async with anyio.create_task_group() as tasks:
            for call in calls:
                tasks.start_soon(call)
    except BaseExceptionGroup as failed:
        raise one_error(failed) from failed


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
    ) -> None:
        _check_timeout(timeout)
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self._settings = group_settings

    def _run(self, call: Callable[[AsyncGenRMClient], Awaitable[_T]]) -> _T:
        async def main() -> _T:
            async with AsyncGenRMClient(
                self.base_url,
                api_key=self.api_key,
                timeout=self.timeout,
                group_settings=self._settings,
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
