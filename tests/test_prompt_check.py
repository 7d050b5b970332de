"""A judge that does not take the GenRM roles is found (#37 item 1): a refusal naming a role, or
answers in prose with no verdict in a replica's first replies."""

from __future__ import annotations

from genrm_trio.judge.prompt_check import NO_VERDICT_REPLIES, PromptCheck


def test_a_refusal_that_names_a_role_is_the_finding_once() -> None:
    check = PromptCheck()
    assert check.observe_error(500, b"Internal Server Error") is None  # an outage says nothing
    assert check.observe_error(429, b"response_1") is None
    reason = check.observe_error(
        400,
        b'{"error": {"message": "Invalid value: \'response_1\'.",\n "param": "messages[3].role"}}',
    )
    assert reason == (
        'it refused the GenRM roles: HTTP 400: {"error": {"message": "Invalid value: '
        '\'response_1\'.", "param": "messages[3].role"}}'
    )
    assert check.finding == reason
    assert check.observe_error(400, b"unknown role: principle") is None  # said once


def test_prose_without_a_verdict_in_the_first_replies_is_the_finding() -> None:
    check = PromptCheck()
    for _ in range(NO_VERDICT_REPLIES - 1):
        assert check.observe_reply(False) is None
    assert check.observe_reply(False) == (
        f"its first {NO_VERDICT_REPLIES} completed replies held no verdict: it answers in prose"
    )
    assert check.observe_reply(False) is None


def test_a_judge_that_gave_a_verdict_understands_the_prompt() -> None:
    check = PromptCheck()
    assert check.observe_reply(True) is None
    for _ in range(3 * NO_VERDICT_REPLIES):  # later parse failures are the judge's noise
        assert check.observe_reply(False) is None
    assert check.finding is None
    assert check.refused("HTTP 500, and instruct got an answer") == (
        "it refused the GenRM roles: HTTP 500, and instruct got an answer"
    )
    assert check.refused("again") is None
