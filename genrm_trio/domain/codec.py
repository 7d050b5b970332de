"""The project's JSON codec for request bodies and replies: one strict decode, one compact encode.

Pure and not HTTP-specific: a refused text raises :class:`InvalidJSON` with a short message, and
the HTTP layer maps it to its 422 item (`http/schema.py`, `decode_body`).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Container, Mapping
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
    "pack_members",
    "release_in_steps",
    "split_object_in_steps",
    "values_at_most",
    "values_outside_strings_at_most",
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
_DEPTH_CHUNK: Final = 1 << 16


def _unescaped(raw: bytes) -> bytes:
    """`raw` without its escaped backslashes and quotes, so that its quotes delimit strings."""
    return raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw


def _too_deep(raw: bytes) -> bool:
    """Whether arrays/objects nest deeper than MAX_DEPTH, brackets inside strings ignored.

    Exact for valid JSON (escapes are removed before strings are cut out); for invalid JSON the
    answer does not matter, the parser rejects it anyway. C-level bytes operations over the
    whole body, then, 65,536 structural bytes at a time, the strings cut out and a C-level
    running sum over the brackets left: one split of a whole body of 500,000 rows made 3
    million parts in one call that held the GIL 86 ms, and one `max(accumulate(...))` over
    3.9 million brackets 78 ms.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False
    structure = _unescaped(raw).translate(None, _STRUCTURE)
    depth = 0
    inside = False  # whether the chunk starts inside a string
    for start in range(0, len(structure), _DEPTH_CHUNK):
        parts = structure[start : start + _DEPTH_CHUNK].split(b'"')
        outside = b"".join(parts[1::2] if inside else parts[::2])
        inside ^= len(parts) % 2 == 0  # an odd number of quotes
        steps = memoryview(outside.translate(_STEPS)).cast("b")
        if max(accumulate(steps, initial=depth)) > MAX_DEPTH:
            return True
        depth += sum(steps)
    return False


_COUNT_CHUNK: Final = 1 << 22


def values_at_most(body: bytes) -> int:
    """An upper bound on the values in a JSON text: every value but the first follows a `,`, a
    `:` or an opening bracket (strings holding those characters only raise it). C-speed counts,
    4 MiB at a time (one count of a 60 MiB body held the GIL about 20 ms)."""
    size = len(body)
    return 1 + sum(
        body.count(mark, start, start + _COUNT_CHUNK)
        for start in range(0, size, _COUNT_CHUNK)
        for mark in (b",", b":", b"[", b"{")
    )


def values_outside_strings_at_most(body: bytes, limit: int) -> int:
    """:func:`values_at_most` without what strings hold, for texts whose strings may be long:
    the marks inside strings are not counted once the plain count passes `limit` (a judge's
    verdict text can hold a million braces). Past `limit`, the answer is only known to exceed
    it. Single C calls of at most about 20 ms for 32 MiB, and no list of more than 2 × `limit`
    + 2 parts."""
    rough = values_at_most(body)
    if rough <= limit:
        return rough
    unescaped = _unescaped(body)
    strings = unescaped.count(b'"') // 2
    if strings > limit:  # each string is a value (a key counts, as its `{` or `,` does above)
        return strings
    return values_at_most(b"".join(unescaped.split(b'"')[::2]))


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


def _space_end(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]


def _key_at(text: str, at: int) -> tuple[str, int, int, int]:
    """The object key at `at` (after any space): it, where it starts and ends, and where its
    value starts."""
    key_start = _space_end(text, at)
    key, key_end = _DECODER.raw_decode(text, key_start)
    if type(key) is not str:
        raise ValueError("an object key that is not a string")
    at = _space_end(text, key_end)
    if not text.startswith(":", at):
        raise ValueError("no colon after an object key")
    return key, key_start, key_end, _space_end(text, at + 1)


def _after_member(text: str, at: int, closing: str) -> tuple[int, bool]:
    """Past the `,` or `closing` that follows a member ending at `at`: where the next member
    (or space before it) starts, or where the container ends, and whether it closed."""
    at = _space_end(text, at)
    if text.startswith(",", at):
        return at + 1, False
    if text.startswith(closing, at):
        return at + 1, True
    raise ValueError("no comma or closing bracket")


def _member_steps(text: str, at: int, levels: int, build: bool = True) -> tuple[JSONValue, int]:
    """The value at `at` and where it ends: a container within `levels` built member by member,
    anything deeper (or scalar) by one call of the C decoder. Without `build`, the value is
    only checked (each member decoded and dropped) and None is returned for it."""
    at = _space_end(text, at)
    opening = text[at : at + 1]
    if levels == 0 or opening not in ("[", "{"):
        value: JSONValue
        value, end = _DECODER.raw_decode(text, at)
        return (value if build else None), end
    closing = "]" if opening == "[" else "}"
    items: list[JSONValue] = []
    members: dict[str, JSONValue] = {}
    built = (items if opening == "[" else members) if build else None
    at = _space_end(text, at + 1)
    closed = text.startswith(closing, at)
    at += closed
    while not closed:
        if opening == "[":
            item, at = _member_steps(text, at, levels - 1, build)
            if build:
                items.append(item)
        else:
            key, _, _, value_start = _key_at(text, at)
            item, at = _member_steps(text, value_start, levels - 1, build)
            if build:
                members[key] = item
        at, closed = _after_member(text, at, closing)
    return built, at


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
        if _space_end(text, end) != len(text):
            raise ValueError("extra data")
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return decode_json(raw)
    return value


_PACK_CHUNK_CHARS: Final = 1 << 20


@final
class _Packer:
    """An object's members as sent (`"key":value` texts), zlib-compressed as they come: the
    packed object is never whole in memory, and no single call handles all of it."""

    def __init__(self) -> None:
        self._compressor = zlib.compressobj(1)
        self._parts: list[bytes] = []
        self._pending: list[str] = ["{"]
        self._pending_chars = 1
        self._separator = ""

    def add(self, key_text: str, value_text: str) -> None:
        self._pending.append(f"{self._separator}{key_text}:{value_text}")
        self._separator = ","
        self._pending_chars += len(key_text) + len(value_text) + 2
        if self._pending_chars >= _PACK_CHUNK_CHARS:
            self._flush()

    def _flush(self) -> None:
        self._parts.append(self._compressor.compress("".join(self._pending).encode("utf-8")))
        self._pending.clear()
        self._pending_chars = 0

    def packed(self) -> bytes:
        self._pending.append("}")
        self._flush()
        self._parts.append(self._compressor.flush())
        return b"".join(self._parts)


def pack_members(members: Mapping[str, JSONValue]) -> bytes:
    """`members` as zlib-compressed JSON, as :func:`split_object_in_steps` packs them."""
    packer = _Packer()
    for key, value in members.items():
        packer.add(compact_json(key), compact_json(value))
    return packer.packed()


def split_object_in_steps(
    body: bytes | bytearray, *, keep: Container[str], pack_all_but: Container[str]
) -> tuple[JSONValue, bytes]:
    """A JSON object body read a member at a time (:func:`decode_json_in_steps`'s checks and
    errors), kept in two forms: the members whose key is in `keep`, decoded, and every member
    whose key is not in `pack_all_but`, packed: a zlib-compressed JSON object of their texts as
    sent, in their order (duplicates too, so that decoding it gives what decoding the body
    would have). The other members are only checked: decoded a member at a time and dropped.
    A body of a million members never becomes a dict of them (a resize of one held the GIL for
    tens of milliseconds, the dict and its copies hundreds of MB). A body that is not an object
    is returned decoded, with an empty object packed."""
    raw = body if type(body) is bytes else bytes(body)
    try:
        text = raw.decode("utf-8")
        if _too_deep(raw):
            raise ValueError("too deep")
        at = _space_end(text, 0)
        if not text.startswith("{", at):
            return decode_json_in_steps(raw), pack_members({})
        kept: dict[str, JSONValue] = {}
        packer = _Packer()
        at = _space_end(text, at + 1)
        closed = text.startswith("}", at)
        at += closed
        while not closed:
            key, key_start, key_end, value_start = _key_at(text, at)
            kept_value = key in keep
            value, value_end = _member_steps(text, value_start, _STEP_LEVELS - 1, kept_value)
            if key not in pack_all_but:
                packer.add(text[key_start:key_end], text[value_start:value_end])
            if kept_value:
                kept[key] = value
            at, closed = _after_member(text, value_end, "}")
        if _space_end(text, at) != len(text):
            raise ValueError("extra data")
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        value = decode_json(raw)  # its error is the one raised; a value is split as decoded
        if type(value) is not dict:
            return value, pack_members({})
        rest = {key: item for key, item in value.items() if key not in pack_all_but}
        return {key: item for key, item in value.items() if key in keep}, pack_members(rest)
    return kept, packer.packed()


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


def encode_json_in_steps(value: JSONValue, levels: int = _STEP_LEVELS) -> bytes:
    """`encode_json(value)`, its containers within `levels` a member at a time (their keys are
    strings, as decoded JSON's are): one call of the C encoder holds the GIL from start to end,
    which a million keys make long even in a worker thread. Written into one buffer as it goes
    (a list of a million encoded members took 230 MB)."""
    out = bytearray()
    _encode_steps(value, levels, out)
    return bytes(out)


def _encode_steps(value: JSONValue, levels: int, out: bytearray) -> None:
    if levels == 0 or type(value) not in (dict, list):
        out += encode_json(value)
    elif type(value) is dict:
        out += b"{"
        for index, (key, item) in enumerate(value.items()):
            if index:
                out += b","
            out += encode_json(key)
            out += b":"
            _encode_steps(item, levels - 1, out)
        out += b"}"
    else:
        assert type(value) is list
        out += b"["
        for index, item in enumerate(value):
            if index:
                out += b","
            _encode_steps(item, levels - 1, out)
        out += b"]"
