"""The project's JSON codec for request bodies and replies: one strict decode, one compact encode.

Pure and not HTTP-specific: a refused text raises :class:`InvalidJSON` with a short message, and
the HTTP layer maps it to its 422 item (`http/schema.py`, `decode_body`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Final, NoReturn, final

from genrm_trio.domain.model import JSONValue

__all__ = [
    "MAX_DEPTH",
    "InvalidJSON",
    "compact_json",
    "decode_json",
    "decode_json_in_steps",
    "encode_json",
    "encode_json_in_steps",
    "release_in_steps",
]

MAX_DEPTH = 512  # deepest accepted nesting of arrays and objects (docs/http-api.md, "422 lists")


@final
class InvalidJSON(ValueError):
    """A text that is not one accepted JSON value; the message says what is wrong and where."""


# --- decoding -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number out of range")
    return value


# Every float goes through `_finite_float`: 1e400 must be refused, not turned into inf, and a
# scan of the text that could skip the hook costs as much as it saves (docs/benchmarks.md,
# "Small costs behind code choices").
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
# Depth scan: structural bytes only, brackets as signed steps (+1 open, -1 close).
_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def _too_deep(raw: bytes) -> bool:
    """Whether arrays/objects nest deeper than MAX_DEPTH, brackets inside strings ignored.

    Exact for valid JSON (escapes are removed before strings are cut out); for invalid JSON the
    answer does not matter, the parser rejects it anyway. Only C-level bytes operations, plus a
    C-level running sum over the brackets outside strings.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    outside = b"".join(unescaped.translate(None, _STRUCTURE).split(b'"')[::2])
    if len(outside) <= MAX_DEPTH:
        return False
    steps = memoryview(outside.translate(_STEPS)).cast("b")
    return max(accumulate(steps)) > MAX_DEPTH


def decode_json(body: bytes | bytearray) -> JSONValue:
    """One RFC 8259 JSON value from a request body, with Python `json` string semantics.

    Raises InvalidJSON for invalid UTF-8, truncated or trailing data, NaN/Infinity literals,
    numbers that overflow a double or exceed Python's integer digit limit, and nesting deeper
    than 512. Escaped lone surrogates are accepted; duplicate keys: the last one wins.
    """
    raw = body if type(body) is bytes else bytes(body)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"JSON decode error: invalid UTF-8 at byte {exc.start}") from None
    if _too_deep(raw):
        raise InvalidJSON(f"JSON decode error: nesting deeper than {MAX_DEPTH} levels")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidJSON(f"JSON decode error: {exc.msg} at position {exc.pos}") from None
    except RecursionError:
        raise InvalidJSON("JSON decode error: nesting too deep") from None
    except ValueError as exc:
        raise InvalidJSON(f"JSON decode error: {exc}") from None


_SPACE: Final = re.compile(r"[ \t\n\r]*")
_STEP_LEVELS: Final = 2


def _member_steps(text: str, at: int, levels: int) -> tuple[JSONValue, int]:
    """The value at `at` and where it ends: a container within `levels` built member by member,
    anything deeper (or scalar) by one call of the C decoder."""
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    opening = text[at : at + 1]
    if levels == 0 or opening not in ("[", "{"):
        value: JSONValue
        value, end = _DECODER.raw_decode(text, at)
        return value, end
    closing = "]" if opening == "[" else "}"
    at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    items: list[JSONValue] = []
    members: dict[str, JSONValue] = {}
    if text.startswith(closing, at):
        return (items if opening == "[" else members), at + 1
    while True:
        if opening == "[":
            item, at = _member_steps(text, at, levels - 1)
            items.append(item)
        else:
            key, at = _DECODER.raw_decode(text, _SPACE.match(text, at).end())  # type: ignore[union-attr]
            if type(key) is not str:
                raise ValueError("an object key that is not a string")
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if not text.startswith(":", at):
                raise ValueError("no colon after an object key")
            members[key], at = _member_steps(text, at + 1, levels - 1)
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if text.startswith(",", at):
            at += 1
            continue
        if text.startswith(closing, at):
            return (items if opening == "[" else members), at + 1
        raise ValueError("no comma or closing bracket")


def decode_json_in_steps(body: bytes | bytearray) -> JSONValue:
    """:func:`decode_json`'s value, built a member at a time: the top-level container's members
    and theirs each by one call of the C decoder, instead of the whole body by one. One call
    holds the GIL from start to end, so decoding a body of millions of values in a worker thread
    still stalled the event loop for its whole length; between calls the loop gets its turn.
    Slower than one call (a Python step per member): for large bodies off the loop only. Any
    problem (or a value it cannot tell apart) is decoded again by :func:`decode_json`, whose
    error is the one raised."""
    raw = body if type(body) is bytes else bytes(body)
    try:
        text = raw.decode("utf-8")
        if _too_deep(raw):
            raise ValueError("too deep")
        value, end = _member_steps(text, 0, _STEP_LEVELS)
        if _SPACE.match(text, end).end() != len(text):  # type: ignore[union-attr]
            raise ValueError("extra data")
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return decode_json(raw)
    return value


def release_in_steps(value: object, levels: int = _STEP_LEVELS) -> None:
    """Empty `value` (a list or dict nobody else holds), its members and theirs a member at a
    time: freeing a decoded body of millions of objects by one reference drop holds the GIL
    until the last is freed, in whichever thread drops it."""
    if levels == 0:
        return
    if type(value) is list:
        while value:
            release_in_steps(value.pop(), levels - 1)
    elif type(value) is dict:
        while value:
            release_in_steps(value.popitem()[1], levels - 1)


# --- encoding -----------------------------------------------------------------------------------


_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def compact_json(value: object) -> str:
    """The project's one JSON text form (replies, packed results, the store): compact, ASCII
    (lone surrogates as ``\\uXXXX``). Raises ValueError for NaN and infinities."""
    return _ENCODER.encode(value)


def encode_json(value: JSONValue) -> bytes:
    """ASCII-safe compact JSON; lone surrogates become `\\uXXXX` escapes.

    Raises ValueError for NaN/Infinity: the engine never produces them, so that is a bug (500).
    """
    return compact_json(value).encode("ascii")


def encode_json_in_steps(members: Mapping[str, JSONValue]) -> bytes:
    """`encode_json(members)`, a member at a time: one call of the C encoder holds the GIL
    from start to end, which a million keys make long even in a worker thread."""
    return (
        b"{" + b",".join(encode_json(k) + b":" + encode_json(v) for k, v in members.items()) + b"}"
    )
