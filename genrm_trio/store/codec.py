"""How record fields are held in SQLite columns, and read back (pure).

Texts that may hold lone surrogates (keys, group ids, failure messages) are UTF-8 BLOBs encoded
with ``surrogatepass``; an attempt beyond int64 is its exact decimal text; a cohort's members are
one :func:`~genrm_trio.domain.records.members_json` text.
"""

from __future__ import annotations

from typing import Final

from genrm_trio.domain.records import MemberRecord, members_from_json

_INT64_MAX: Final = 2**63 - 1


def text_column(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def column_text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    if isinstance(value, str):
        return value
    raise TypeError(f"expected text, got {type(value).__name__}")


def optional_text_column(text: str | None) -> bytes | None:
    return None if text is None else text_column(text)


def optional_column_text(value: object) -> str | None:
    return None if value is None else column_text(value)


def int_column(number: int) -> int | str:
    """An attempt as SQLite can hold it: beyond int64 as its exact decimal text."""
    return number if -_INT64_MAX - 1 <= number <= _INT64_MAX else str(number)


def column_int(value: object) -> int:
    if type(value) is int:
        return value
    if isinstance(value, str | bytes) and column_text(value).lstrip("-").isdigit():
        return int(column_text(value))
    raise TypeError(f"expected an integer, got {value!r}")


def column_members(text: object) -> dict[int, MemberRecord]:
    """A ``members`` column (see :func:`members_json`); raises ValueError or TypeError."""
    if text is None:
        return {}
    return members_from_json(column_text(text))
