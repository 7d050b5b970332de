"""Judge requests in both APIs' shapes, a client of the simulated judge's ASGI app, and the text
of a reply: shared by tests/test_sim_judge.py and tests/test_sim_length.py."""

from __future__ import annotations

from typing import Any

import httpx

from genrm_trio.testing.asgi import SimJudgeApp


def client(app: SimJudgeApp, **kw: Any) -> httpx.AsyncClient:
    """An httpx client of the simulated judge's ASGI app, at the base URL a judge is given."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://sim.test/v1", **kw
    )


def responses_body(r1: str, r2: str, principle: str | None = None) -> dict[str, Any]:
    """A Responses API judge request for the answers `r1` and `r2`, as genrm-trio sends it."""
    metadata = {"response_1": r1, "response_2": r2}
    if principle is not None:
        metadata["principle"] = principle
    return {
        "model": "judge-x",
        "max_output_tokens": 512,
        "input": [
            {"role": "system", "content": "Be fair.", "type": "message"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is "},
                    {"type": "input_text", "text": "2+2?"},
                ],
                "type": "message",
            },
        ],
        "metadata": metadata,
    }


def chat_body(r1: str, r2: str, principle: str | None = None) -> dict[str, Any]:
    """A Chat Completions judge request for the answers `r1` and `r2`, as genrm-trio sends it."""
    messages = [
        {"role": "system", "content": "Be fair."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    if principle is not None:
        messages.append({"role": "principle", "content": principle})
    messages += [{"role": "response_1", "content": r1}, {"role": "response_2", "content": r2}]
    return {"model": "judge-x", "max_tokens": 512, "messages": messages}


def responses_text(body: dict[str, Any]) -> str:
    """The output text of a Responses API reply: its messages' output_text parts, joined."""
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
