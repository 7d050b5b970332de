"""Style control: Markdown and emoji density of an answer (docs/scoring.md, "(c) Style density
penalty", D1). Pure."""

from __future__ import annotations

import re
from typing import Any

import regex

__all__ = ["count_style_elements", "strip_code_blocks", "style_density"]

_CODE_BLOCK = re.compile(r"```[\s\S]*?```")
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)
_ORDERED = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_UNORDERED = re.compile(r"^\s*[-*+]\s", re.MULTILINE)
_BOLD_STARS = re.compile(r"\*\*[^*\n]+\*\*")
_BOLD_UNDERSCORES = re.compile(r"__[^_\n]+__")
_PICTOGRAPHIC: Any = regex.compile(r"\p{Extended_Pictographic}")


def strip_code_blocks(text: str) -> str:
    """Remove fenced code spans: three backticks up to the next three backticks, across lines."""
    return _CODE_BLOCK.sub("", text)


def count_style_elements(answer: str) -> dict[str, int]:
    """Markdown style elements outside fenced code (Arena-Hard + emoji; docs/scoring.md, D1).

    Keys: ``headers``, ``ordered_lists``, ``unordered_lists``, ``bold``, ``emoji``. Emoji are
    non-ASCII code points with Extended_Pictographic=Yes, counted per code point: CJK, Hangul,
    kana and the plain arrows U+2190–U+2193 count 0; ©, ®, ™, ‼ count 1 each.
    """
    text = strip_code_blocks(answer)
    emoji = sum(1 for ch in _PICTOGRAPHIC.findall(text) if ord(ch) > 0x7F)
    return {
        "headers": len(_HEADER.findall(text)),
        "ordered_lists": len(_ORDERED.findall(text)),
        "unordered_lists": len(_UNORDERED.findall(text)),
        "bold": len(_BOLD_STARS.findall(text)) + len(_BOLD_UNDERSCORES.findall(text)),
        "emoji": emoji,
    }


def style_density(answer: str) -> float:
    """Style elements per character of the stripped code-free answer; 0.0 when that is empty.

    As in the reference, the elements are counted on the code-free text (code removal is applied
    to it again inside :func:`count_style_elements`, a no-op except for pathological fences).
    """
    code_free = strip_code_blocks(answer)
    length = len(code_free.strip())
    if length <= 0:
        return 0.0
    return sum(count_style_elements(code_free).values()) / length
