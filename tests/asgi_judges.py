"""The two ends of a small ASGI judge written in a test (served over the in-memory network by
`genrm_trio.testing.network.serve_asgi`): the request's JSON body read whole, and a JSON reply.
Shared by tests/test_judge_http.py and tests/test_judge_reads_answers.py."""

from __future__ import annotations

import json
from typing import Any


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
