"""What bench sends: `/verify` bodies shaped like NeMo Gym's simple agent's, policy responses,
and deterministic answers of an exact size."""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["answer_text", "policy_response", "verify_body"]

# Every Responses create-params key the simple agent sends, mostly null (docs/http-api.md).
_AGENT_CREATE_PARAMS: dict[str, Any] = {
    "background": None,
    "context_management": None,
    "conversation": None,
    "include": None,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "metadata": None,
    "model": None,
    "moderation": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": None,
    "safety_identifier": None,
    "service_tier": None,
    "store": None,
    "stream": None,
    "stream_options": None,
    "temperature": None,
    "text": None,
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": None,
    "top_p": None,
    "truncation": None,
    "user": None,
}

_WORDS = (
    "the answer follows from the constraint because each step preserves the invariant and the "
    "final value is reached after checking every case carefully so the result holds in general"
).split()


def answer_text(group: int, rollout: int, chars: int) -> str:
    """A deterministic answer of exactly `chars` characters, different per rollout."""
    words: list[str] = [f"[g{group}r{rollout}]"]
    length = len(words[0]) + 1
    index = group * 31 + rollout * 7
    while length < chars:
        word = _WORDS[index % len(_WORDS)]
        words.append(word)
        length += len(word) + 1
        index = index * 1103515245 + 12345 & 0x7FFFFFFF
    return " ".join(words)[:chars]


def policy_response(text: str) -> dict[str, Any]:
    """A Responses API object like the policy model returns, with one message."""
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "created_at": 1_700_000_000.0,
        "model": "policy",
        "object": "response",
        "output": [
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            # every usage field: the reference server validates the response strictly
            "input_tokens": 64,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": max(1, len(text) // 4),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 64 + max(1, len(text) // 4),
        },
    }


def verify_body(
    *, task: int, rollout: int, group_id: str, attempt: int, prompt: str, answer: str
) -> dict[str, Any]:
    """A `/verify` body shaped like the simple agent's."""
    params = dict(_AGENT_CREATE_PARAMS)
    params["input"] = [{"role": "user", "content": prompt, "type": "message", "phase": None}]
    return {
        "responses_create_params": params,
        "response": policy_response(answer),
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "_ng_group_id": group_id,
        "_ng_group_attempt": attempt,
    }
