"""Answers, reasoning, judge history and digests taken from requests, and the client's ids as
messages show them.

The rules: docs/scoring.md "What the judge is shown" and docs/architecture.md "Keys, digests and
replay".

Pure functions over plain JSON data; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

__all__ = [
    "ALLOWED_ROLES",
    "EMPTY_ANSWER_PLACEHOLDER",
    "ID_LOGGED_LIMIT",
    "ID_SHOWN_LIMIT",
    "HistoryError",
    "answer_text",
    "digest_text",
    "judge_text",
    "normalize_history",
    "printable",
    "printable_lines",
    "prompt_digest",
    "reasoning_text",
    "response_digest",
    "shown_id",
]

ALLOWED_ROLES: Final = frozenset({"user", "assistant", "system", "developer"})
EMPTY_ANSWER_PLACEHOLDER: Final = "None"
_HISTORY_TEXT_PARTS: Final = frozenset({"input_text", "output_text"})
_ROLE_PREVIEW_CHARS: Final = 60
# A group id or cohort key shows at most this many characters in a message (a 409/503 detail, a
# stored failure): with the message around it, well inside failure_reason's 2,000.
ID_SHOWN_LIMIT: Final = 1000
# A cohort key shows at most this many characters in a log line or a repr (one line per cohort).
ID_LOGGED_LIMIT: Final = 160


class HistoryError(ValueError):
    """A conversation-history item the judge request cannot carry (D16: a 422 at the wire)."""


def _output_items(response: object, item_type: str) -> list[dict[str, Any]]:
    """The dict items of `response["output"]` whose `type` is `item_type`."""
    if not isinstance(response, dict):
        return []
    output = response.get("output")
    if not isinstance(output, list):
        return []
    return [item for item in output if isinstance(item, dict) and item.get("type") == item_type]


def _is_one_of(value: object, names: frozenset[str]) -> bool:
    # JSON may put a list or object here, which a frozenset lookup would reject as unhashable.
    return isinstance(value, str) and value in names


def _texts(parts: object, part_types: frozenset[str] | None) -> str:
    """Concatenate the string `text` of dict parts, keeping only `part_types` when given."""
    if not isinstance(parts, list):
        return ""
    return "".join(
        part["text"]
        for part in parts
        if isinstance(part, dict)
        and isinstance(part.get("text"), str)
        and (part_types is None or _is_one_of(part.get("type"), part_types))
    )


def answer_text(response: object) -> str:
    """The concatenated `output_text` parts of every message item of a Responses object."""
    output_text = frozenset({"output_text"})
    return "".join(
        _texts(item.get("content"), output_text) for item in _output_items(response, "message")
    )


def reasoning_text(response: object) -> str:
    """The concatenated summary texts of every reasoning item of a Responses object."""
    return "".join(
        _texts(item.get("summary"), None) for item in _output_items(response, "reasoning")
    )


def judge_text(answer: str) -> str:
    """What the judge is shown for an answer: the answer, or "None" when it is blank."""
    return answer if answer.strip() else EMPTY_ANSWER_PLACEHOLDER


def _history_content(content: object) -> str:
    """A message's content as one string: as is, or its input/output text parts joined."""
    if isinstance(content, str):
        return content
    return _texts(content, _HISTORY_TEXT_PARTS)


def _history_role(item: dict[str, Any], index: int) -> str:
    """The item's role (default "user"); anything outside `ALLOWED_ROLES` is a `HistoryError`."""
    role = item.get("role", "user")
    if isinstance(role, str) and role in ALLOWED_ROLES:
        return role
    shown = repr(role)
    if len(shown) > _ROLE_PREVIEW_CHARS:  # never echo a huge value back in full
        shown = shown[:_ROLE_PREVIEW_CHARS] + "..."
    allowed = ", ".join(sorted(ALLOWED_ROLES))
    raise HistoryError(f"input[{index}] has unsupported role {shown}; allowed roles: {allowed}")


def normalize_history(input: object) -> list[dict[str, str]]:
    """`responses_create_params.input` as judge history: message items as role/content pairs."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    if not isinstance(input, list):
        return []
    history: list[dict[str, str]] = []
    for index, item in enumerate(input):
        # A null type is an omitted field of a dumped model, so it counts as absent.
        if not isinstance(item, dict) or item.get("type") not in (None, "message"):
            continue
        role = _history_role(item, index)
        history.append({"role": role, "content": _history_content(item.get("content"))})
    return history


def _sha256_ascii(encoded: str) -> str:
    # ensure_ascii output escapes lone surrogates as \udXXX, so ASCII encoding cannot fail.
    return hashlib.sha256(encoded.encode("ascii")).hexdigest()


def prompt_digest(input: object, principle: str | None) -> str:
    """SHA-256 hex of the prompt as the reference hashes it (default separators, sorted keys)."""
    return _sha256_ascii(json.dumps({"input": input, "principle": principle}, sort_keys=True))


def response_digest(response: object) -> str:
    """SHA-256 hex of the whole response payload in compact, sorted, ASCII-escaped JSON."""
    return _sha256_ascii(
        json.dumps(response, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    )


def digest_text(s: str) -> str:
    """SHA-256 hex of a string's UTF-8 bytes, lone surrogates kept (the baseline key suffix)."""
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()


def shown_id(identifier: str, limit: int = ID_SHOWN_LIMIT) -> str:
    """``identifier`` quoted as ``repr`` quotes it, for a message or a log line.

    A longer one is cut: its first ``limit`` characters as quoted (escapes count), then its whole
    length, so that a client's 10,000-character group id cannot make a 409 or
    503 detail, a stored failure or a log line that long (docs/http-api.md, "Other statuses")."""
    if len(identifier) <= limit:
        shown = repr(identifier)
        if len(shown) <= limit + 2:
            return shown
    head = repr(identifier[:limit])
    if len(head) > limit + 2:  # escapes made it longer: cut the quoted text itself
        head = head[: limit + 1] + head[0]
    return f"{head}… ({len(identifier)} characters)"


_UNPRINTABLE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]"
)
"""What a terminal acts on or hides instead of showing: C0 and C1 controls (ESC starts the
sequences that set a window title, clear the screen or write the clipboard), line and paragraph
separators, zero-width and bidirectional formatting characters."""


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every character of `_UNPRINTABLE` written as its ``\\xNN`` / ``\\uNNNN``
    escape: how a client's or a judge's string reaches a terminal (`genrm-trio top`) or a log
    line. One pass, linear."""
    return _UNPRINTABLE.sub(_escaped, text)


def printable_lines(text: str) -> str:
    """`printable` that keeps ``text``'s line breaks: a traceback, a page of ``/metrics``."""
    return "\n".join(printable(line) for line in text.split("\n"))
