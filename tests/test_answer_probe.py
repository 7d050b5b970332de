"""The start-up answer probe (#37 item 5): two comparisons of one prompt with answers of very
different lengths and a one-token budget; the prompt tokens say whether the judge reads the
answers, and a refusal is told apart as the GenRM roles' fault or not."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from genrm_trio.judge.answer_probe import (
    ANSWER_BYTES,
    AnswersRead,
    AnswersUnread,
    ProbeFailed,
    RolesRefused,
    probe_answers,
    probe_call,
)
from genrm_trio.judge.apis import judge_api
from genrm_trio.judge.base import (
    JudgeAttemptError,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.testing.core import token_count


class FakeJudge:
    """A judge whose every attempt is `answer(call)`; it records the calls."""

    endpoint = "judge.test:8000"
    path = "/v1/chat/completions"

    def __init__(self, answer: Callable[[JudgeCall], JudgeReply]) -> None:
        self.answer = answer
        self.calls: list[JudgeCall] = []

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        self.calls.append(call)
        return self.answer(call)

    async def aclose(self) -> None:
        pass


def reads(call: JudgeCall) -> JudgeReply:
    shown = sum(len(m["content"]) for m in call.history) + len(call.response_1 + call.response_2)
    return JudgeReply(ReplyStatus.BUDGET_EXHAUSTED, "", 30 + token_count(shown), 1)


def unread(call: JudgeCall) -> JudgeReply:
    return JudgeReply(ReplyStatus.BUDGET_EXHAUSTED, "", 42, 1)


def raises(error: JudgeAttemptError) -> Callable[[JudgeCall], JudgeReply]:
    def answer(call: JudgeCall) -> JudgeReply:
        raise error

    return answer


def test_the_probe_asks_for_one_token_with_answers_of_very_different_lengths() -> None:
    call = probe_call()
    assert (len(call.response_1), len(call.response_2)) == (4, 4036)
    assert ANSWER_BYTES == 4040 and call.principle is None
    # what the judge is sent: chat's max_tokens of 1
    assert judge_api("chat_completions", {"max_output_tokens": 4096}).body(call)["max_tokens"] == 1


async def test_a_judge_that_reads_the_answers_passes() -> None:
    judge = FakeJudge(reads)
    assert await probe_answers(judge) == AnswersRead(30 + (4040 + 37) // 4)
    assert len(judge.calls) == 1


async def test_a_judge_whose_prompt_does_not_hold_the_answers_is_found() -> None:
    outcome = await probe_answers(FakeJudge(unread))
    assert outcome == AnswersUnread(
        "the start-up probe's answers of 4040 bytes gave a prompt of 42 tokens, fewer than they "
        "alone need (at most 32 bytes a token)"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"error": {"message": "Invalid value: \'response_1\'.", "param": "messages[2].role"}}',
        b'{"object": "error", "message": "unknown role: principle"}',
    ],
)
async def test_a_refusal_that_names_a_role_is_the_roles(body: bytes) -> None:
    instruct = FakeJudge(reads)
    outcome = await probe_answers(FakeJudge(raises(JudgeHTTPError(400, body))), instruct=instruct)
    assert isinstance(outcome, RolesRefused)
    assert outcome.reason.startswith("JudgeHTTPError: HTTP 400; response=")
    assert instruct.calls == []  # the reply said it: nothing to confirm


async def test_a_bare_500_is_the_roles_only_when_the_instruct_messages_get_through() -> None:
    bare = JudgeHTTPError(500, b"Internal Server Error")
    outcome = await probe_answers(FakeJudge(raises(bare)), instruct=FakeJudge(reads))
    assert outcome == RolesRefused(
        "JudgeHTTPError: HTTP 500; response=Internal Server Error, and the same comparison "
        "with judge.prompt: instruct got an answer"
    )
    # an outage answers 500 to both
    both = await probe_answers(FakeJudge(raises(bare)), instruct=FakeJudge(raises(bare)))
    assert both == ProbeFailed(
        "JudgeHTTPError: HTTP 500; response=Internal Server Error; with judge.prompt: instruct: "
        "JudgeHTTPError: HTTP 500; response=Internal Server Error"
    )
    # without a judge to confirm with (judge.prompt: instruct already), no guess
    alone = await probe_answers(FakeJudge(raises(bare)))
    assert alone == ProbeFailed("JudgeHTTPError: HTTP 500; response=Internal Server Error")


async def test_one_broken_connection_decides_nothing() -> None:
    broken = JudgeTransportError("RemoteProtocolError", "Server disconnected")
    replies = [raises(broken), reads]

    def flaky(call: JudgeCall) -> JudgeReply:
        return replies.pop(0)(call)

    assert isinstance(await probe_answers(FakeJudge(flaky)), AnswersRead)


async def test_a_judge_that_cannot_answer_decides_nothing() -> None:
    down = JudgeTransportError("ConnectError", "connection refused", reached=False)
    refused = FakeJudge(raises(down))
    assert await probe_answers(refused) == ProbeFailed("ConnectError: connection refused")
    assert len(refused.calls) == 2  # once more after a broken connection, then no answer
    throttled = JudgeHTTPError(429, b"slow down")
    assert await probe_answers(FakeJudge(raises(throttled)), instruct=FakeJudge(reads)) == (
        ProbeFailed("JudgeHTTPError: HTTP 429; response=slow down")
    )
    no_usage = FakeJudge(lambda call: JudgeReply(ReplyStatus.COMPLETED, "x", None, None))
    assert await probe_answers(no_usage) == ProbeFailed("the judge reports no prompt tokens")
