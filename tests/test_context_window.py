"""The judge's context window (#37 item 4): the overflow 400 read in each of its real forms, the
budget fitted to the window, and the simulated judge's window, which answers vLLM's 400."""

from __future__ import annotations

import json
import logging
from functools import partial

import httpx
import pytest
import trio

from genrm_trio.config import settings_from_mapping
from genrm_trio.domain.context_window import (
    ContextOverflow,
    context_overflow,
    estimate_prompt_tokens,
    fitted_budget,
)
from genrm_trio.judge.apis import judge_api
from genrm_trio.judge.base import JudgeCall, JudgeHTTPError, JudgeReply, JudgeTimeout, ReplyStatus
from genrm_trio.judge.context import ContextFit, Resend, prompt_bytes
from genrm_trio.judge.probe import probe_judge, served_window, with_context_window
from genrm_trio.testing.asgi import serve_sim_judge, sim_asgi_app
from genrm_trio.testing.core import SimConfig, context_refusal


def vllm(message: str) -> bytes:
    """vLLM's error body around `message`."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
    return json.dumps({"error": error}).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # vLLM, the budget too large (the numbers)
        (
            vllm(
                "'max_tokens' or 'max_completion_tokens' is too large: 2048. This model's "
                "maximum context length is 3000 tokens and your request has 1033 input tokens "
                "(2048 > 3000 - 1033)."
            ),
            ContextOverflow(3000, 1033, 2048),
        ),
        # vLLM, the input alone too long; its older flat body
        (
            b'{"object":"error","message":"This model\'s maximum context length is 8192 tokens. '
            b"However, your request has 9000 input tokens. Please reduce the length of the "
            b'input messages.","type":"BadRequestError","param":null,"code":400}',
            ContextOverflow(8192, 9000, None),
        ),
        # vLLM before 0.6 (DeepSeek's API still says it)
        (
            vllm(
                "This model's maximum context length is 8192 tokens. However, you requested "
                "9100 tokens (8100 in the messages, 1000 in the completion). Please reduce the "
                "length of the messages or completion."
            ),
            ContextOverflow(8192, 8100, 1000),
        ),
        (
            vllm(
                "This model's maximum context length is 4096 tokens. However, you requested "
                "5000 tokens in the messages, Please reduce the length of the messages."
            ),
            ContextOverflow(4096, 5000, None),
        ),
        # OpenAI
        (
            json.dumps(
                {
                    "error": {
                        "message": "This model's maximum context length is 128000 tokens. "
                        "However, your messages resulted in 130000 tokens. Please reduce the "
                        "length of the messages.",
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": "context_length_exceeded",
                    }
                }
            ).encode(),
            ContextOverflow(128000, 130000, None),
        ),
        # the code alone says it
        (
            b'{"error": {"message": "Input is too long.", "code": "context_length_exceeded"}}',
            ContextOverflow(None, None, None),
        ),
        # OpenRouter
        (
            b'{"error":{"message":"This endpoint\'s maximum context length is 8192 tokens. '
            b"However, you requested about 12000 tokens (10000 of text input, 2000 in the "
            b'output). Please reduce the length of either one.","code":400}}',
            ContextOverflow(8192, 10000, 2000),
        ),
    ],
)
def test_the_overflow_400_is_read_in_each_of_its_forms(
    body: bytes, expected: ContextOverflow
) -> None:
    assert context_overflow(400, body) == expected


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, vllm("unknown role: response_1")),
        (400, b"Bad Request"),
        (500, vllm("This model's maximum context length is 3000 tokens. However, ...")),
        (400, b'{"error": "max_tokens must be at least 1, got 0."}'),
    ],
)
def test_other_errors_are_not_overflows(status: int, body: bytes) -> None:
    assert context_overflow(status, body) is None


def test_what_fits_beside_the_stated_input() -> None:
    assert ContextOverflow(3000, 1033, 2048).fits() == 3000 - 1033 - 16
    assert ContextOverflow(3000, 1033, 2048).fits(margin=0) == 1967
    assert ContextOverflow(3000, 2990, None).fits() is None  # no room at all
    assert ContextOverflow(None, None, None).fits() is None
    assert ContextOverflow(3000, None, 2048).fits() is None
    assert ContextOverflow(3000, 1033, 2048).describe() == (
        "window 3000 tokens, prompt 1033 tokens, output budget 2048 tokens"
    )


def test_the_budget_is_fitted_to_the_window() -> None:
    assert fitted_budget(2048, 3000, 1033) == 1951
    assert fitted_budget(512, 3000, 1033) == 512  # fits already: unchanged
    assert fitted_budget(2048, 3000, 3100) == 1  # nothing fits: the server says so
    assert estimate_prompt_tokens(3000) == 1000
    assert estimate_prompt_tokens(3001) == 1001


# --- the simulated judge's window ---------------------------------------------------------------


def test_the_simulated_window_refuses_as_vllm_does() -> None:
    assert context_refusal(3000, 1033, 1967) is None
    too_large = context_refusal(3000, 1033, 2048)
    assert too_large is not None
    assert context_overflow(400, vllm(too_large)) == ContextOverflow(3000, 1033, 2048)
    assert context_refusal(3000, 2999, None) is None  # vLLM gives it what is left
    too_long = context_refusal(3000, 3000, None)
    assert too_long is not None
    assert context_overflow(400, vllm(too_long)) == ContextOverflow(3000, 3000, None)


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses"])
async def test_the_simulated_judge_answers_the_overflow_400_and_reports_its_window(
    api: str,
) -> None:
    app = sim_asgi_app(SimConfig(context_tokens=300))
    call = JudgeCall([{"role": "user", "content": "q" * 400}], "a" * 200, "b" * 200, None)
    # 800 characters: 200 prompt tokens by the simulator's count
    path = "/v1/chat/completions" if api == "chat_completions" else "/v1/responses"
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as http:
        body = judge_api(api, {"max_output_tokens": 150}).body(call)
        refused = await http.post(path, json=body)
        fits = await http.post(path, json={**judge_api(api, {}).body(call), "stream": False})
        models = (await http.get("/v1/models")).json()
    assert refused.status_code == 400
    assert context_overflow(400, refused.content) == ContextOverflow(300, 200, 150)
    assert fits.status_code == 200  # no budget: what is left of the window
    assert models["data"][0]["max_model_len"] == 300
    assert app.sim.statistics().overflows == 1


# --- fitting a comparison's attempts ------------------------------------------------------------


def overflow_error(message: str) -> JudgeHTTPError:
    return JudgeHTTPError(400, vllm(message))


TOO_LARGE = (
    "'max_tokens' or 'max_completion_tokens' is too large: 2048. This model's maximum context "
    "length is 3000 tokens and your request has 1033 input tokens (2048 > 3000 - 1033)."
)
CALL = JudgeCall([{"role": "user", "content": "q" * 300}], "a" * 150, "b" * 150, None)


def test_the_budget_is_fitted_with_the_learned_overhead() -> None:
    fit = ContextFit(3000, min_output_tokens=256)
    assert prompt_bytes(CALL) == 600
    assert fit.estimate(CALL) == 200
    assert fit.budget(CALL, 4096) == 3000 - 200 - 16
    assert fit.budget(CALL, 512) == 512
    assert fit.budget(CALL, None) is None  # the judge's own default: nothing to fit
    # the judge counted 500 prompt tokens: 300 of template and chat overhead
    fit.observe(CALL, JudgeReply(ReplyStatus.COMPLETED, "x", 500, 3))
    assert fit.estimate(CALL) == 500
    assert fit.budget(CALL, 4096) == 3000 - 500 - 16
    fit.observe(CALL, JudgeReply(ReplyStatus.COMPLETED, "x", 400, 3))  # the largest is kept
    assert fit.estimate(CALL) == 500
    assert ContextFit(None, 256).budget(CALL, 4096) == 4096  # no window known


def test_an_overflow_is_resent_once_with_a_budget_that_fits() -> None:
    fit = ContextFit(None, min_output_tokens=256)
    overflow = fit.overflowed(overflow_error(TOO_LARGE), 2048)
    assert overflow == ContextOverflow(3000, 1033, 2048)
    assert (fit.overflows, fit.window) == (1, 3000)  # learned from the reply
    assert fit.resend(overflow, 2048) == Resend(3000 - 1033 - 16)
    # never the same request again
    assert fit.resend(overflow, 1951) is None
    assert fit.overflowed(JudgeHTTPError(500, b"Internal Server Error"), 2048) is None
    assert fit.overflowed(JudgeTimeout(1.0), 2048) is None
    assert fit.overflows == 1


def test_an_overflow_that_cannot_be_fitted_fails_with_the_numbers_and_the_fixes() -> None:
    fit = ContextFit(None, min_output_tokens=2000)
    overflow = fit.overflowed(overflow_error(TOO_LARGE), 2048)
    assert overflow is not None and fit.resend(overflow, 2048) is None
    failure = fit.failure(overflow, 2048)
    assert not failure.retryable and not failure.retry_elsewhere
    assert failure.describe() == (
        "ContextOverflow: the judge's context window is too small for this comparison: window "
        "3000 tokens, prompt 1033 tokens, output budget 2048 tokens; 1951 tokens fit, below "
        "judge.min_output_tokens (2000); fixes: a smaller "
        "genrm_responses_create_params.max_output_tokens, a judge with a longer context window "
        "(vLLM --max-model-len), or shorter answers"
    )
    long_input = (
        "This model's maximum context length is 3000 tokens. However, your request has 3100 "
        "input tokens. Please reduce the length of the input messages."
    )
    overflow = fit.overflowed(overflow_error(long_input), 512)
    assert overflow is not None and fit.resend(overflow, 512) is None
    assert "prompt 3100 tokens (asked for 512); the prompt alone fills the window" in (
        fit.failure(overflow, 512).describe()
    )
    coded = JudgeHTTPError(400, b'{"error": {"code": "context_length_exceeded"}}')
    overflow = fit.overflowed(coded, 512)
    assert overflow is not None and fit.resend(overflow, 512) is None
    assert "the reply does not state the prompt's tokens" in fit.failure(overflow, 512).describe()
    assert fit.overflows == 3


# --- the window learned from GET /models --------------------------------------------------------


def test_the_window_is_read_as_vllm_and_sglang_report_it() -> None:
    body = json.dumps(
        {
            "object": "list",
            "data": [
                {"id": "lora-a", "object": "model", "max_model_len": None},
                {"id": "qwen", "object": "model", "max_model_len": 32768},
            ],
        }
    ).encode()
    assert served_window(body, "qwen") == 32768
    assert served_window(body, None) is None  # the first entry states none
    assert served_window(b'{"data": [{"id": "m", "max_model_len": 4096}]}', None) == 4096
    assert served_window(b'{"data": [{"id": "m", "max_model_len": true}]}', "m") is None
    assert served_window(b'{"data": [{"id": "m"}]}', "m") is None  # a hosted API: not stated
    assert served_window(b"not json", "m") is None


def test_a_configured_window_wins_over_the_learned_one(caplog: pytest.LogCaptureFixture) -> None:
    learned = settings_from_mapping({"judge": {"base_url": "http://j:8000/v1"}})
    caplog.set_level(logging.INFO, "genrm_trio.serve")
    assert with_context_window(learned, [8192, 4096]).judge.context_tokens == 4096
    assert "judge context window: 4096 tokens (max_model_len from GET /models)" in caplog.text
    assert with_context_window(learned, []) is learned
    configured = settings_from_mapping(
        {"judge": {"base_url": "http://j:8000/v1", "context_tokens": 2000}}
    )
    assert with_context_window(configured, [8192]) is configured


async def test_the_start_up_probe_learns_the_window_of_the_simulated_judge() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_sim_judge, SimConfig(context_tokens=3000)))
            config = settings_from_mapping({"judge": {"base_url": f"http://127.0.0.1:{port}/v1"}})
            report = await probe_judge(config, None)
            nursery.cancel_scope.cancel()
    assert report.answered and report.windows == (3000,)
