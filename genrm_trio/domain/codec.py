"""The project's JSON codec for request bodies and replies: one strict decode, one compact encode.

Pure and not HTTP-specific: a refused text raises :class:`InvalidJSON` with a short message, and
the HTTP layer maps it to its 422 item (`http/schema.py`, `decode_body`).
"""

from __future__ import annotations

import json
import math
from itertools import accumulate
from typing import Final, NoReturn, final

from genrm_trio.domain.model import JSONValue

__all__ = ["MAX_DEPTH", "InvalidJSON", "compact_json", "decode_json", "encode_json"]

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
