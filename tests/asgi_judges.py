"""The two ends of a small ASGI judge written in a test (served over the in-memory network by
`genrm_trio.testing.network.serve_asgi`): the request's JSON body read whole, and a JSON reply.
Shared by tests/test_judge_http.py, tests/test_judge_reads_answers.py and
tests/test_judge_limits_wired.py; and `plain_openai_server`, a plain OpenAI server."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

VERDICT = '{"score_1": 4, "score_2": 2, "ranking": 2}'


async def request_json(receive: Any) -> Any:
    """The request's body, every chunk of it, decoded as JSON."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    return json.loads(body)


async def reply_json(send: Any, payload: object) -> None:
    """A 200 whose body is `payload` as JSON (`content-type: application/json`)."""
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


def plain_openai_server(seen: list[int]) -> Any:
    """An ASGI OpenAI server whose prompt tokens count what its model sees (4 bytes a token):
    the messages of chat, the `input` of Responses; never `metadata`, as vLLM does."""

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        request = await request_json(receive)
        shown = request.get("messages") or request.get("input") or []
        prompt = 5 + sum(len(m["content"].encode()) for m in shown) // 4
        seen.append(prompt)
        if scope["path"].endswith("/chat/completions"):
            reply: dict[str, Any] = {
                "choices": [{"message": {"content": VERDICT}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 2},
            }
        else:
            reply = {
                "status": "completed",
                "output": [
                    {"type": "message", "content": [{"type": "output_text", "text": VERDICT}]}
                ],
                "usage": {
                    "input_tokens": prompt,
                    "output_tokens": 2,
                    "output_tokens_details": {"reasoning_tokens": 1},
                },
            }
        await reply_json(send, reply)

    return app
