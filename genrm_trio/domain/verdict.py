"""Parsing a GenRM judge's output into a verdict (docs/scoring.md section 7; D2, D3, D11). Pure.

The candidate search is the reference's: JSON objects inside ```json fences first (the first valid
one wins), else the last valid top-level object anywhere in the text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, final

__all__ = [
    "Verdict",
    "VerdictParseError",
    "find_json_spans",
    "parse_overall",
    "parse_overall_lenient",
    "parse_rubric",
]


class Verdict(NamedTuple):
    """One judged comparison: both answers' scores (1-5) and the ranking (1-6, 1 = first better)."""

    score_1: float
    score_2: float
    ranking: float


class VerdictParseError(ValueError):
    """The judge's output holds no valid verdict."""


_SCORE_KEYS: Final = ("score_1", "score_2", "ranking")
_SCORE_BOUNDS: Final = (1.0, 5.0)
_RANKING_BOUNDS: Final = (1.0, 6.0)
_PREVIEW_CHARS: Final = 200

# The reference pattern is r"```json\s*([\s\S]*?)\s*```". Its two \s* only trim whitespace, which
# never changes the brace spans inside, and they make long whitespace runs backtrack
# quadratically; without them the same fences close at the same backticks.
_FENCE: Final = re.compile(r"```json([\s\S]*?)```", re.IGNORECASE)

# ---------------------------------------------------------------------------------------------
# Brace scanner. The reference restarts a character-by-character scan at every "{", which is
# quadratic on text like "{{{{...". This computes the same spans in one pass: scans that are in
# the same string state move in lockstep, so they are tracked together with a shared depth offset.

_SPECIAL: Final = re.compile(r'[{}"\\]')
_OUT, _IN, _ESC = 0, 1, 2  # string state before a character: outside, inside, after a backslash


@final
class _Track:
    """Unfinished scans sharing one string state; a scan's depth is its key plus `offset`."""

    __slots__ = ("offset", "pending")

    def __init__(self) -> None:
        self.offset = 0
        self.pending: dict[int, list[int]] = {}


def _next_state(state: int, ch: str) -> int:
    if state == _ESC:
        return _IN
    if ch == '"':
        return _IN if state == _OUT else _OUT
    if ch == "\\" and state == _IN:
        return _ESC
    return state


def _merge(into: _Track | None, track: _Track) -> _Track:
    """Join two tracks that reached the same state, re-keying the smaller one."""
    if into is None:
        return track
    big, small = (into, track) if len(into.pending) >= len(track.pending) else (track, into)
    shift = small.offset - big.offset
    for key, starts in small.pending.items():
        big.pending.setdefault(key + shift, []).extend(starts)
    return big


def _span_ends(text: str) -> dict[int, int]:
    """For every "{" whose scan balances, the index of the "}" that closes it."""
    ends: dict[int, int] = {}
    tracks: dict[int, _Track] = {}
    previous = -1
    for match in _SPECIAL.finditer(text):
        k = match.start()
        ch = match.group()
        if k > previous + 1 and _ESC in tracks:
            # An ordinary character between specials consumed the escape.
            tracks[_IN] = _merge(tracks.get(_IN), tracks.pop(_ESC))
        previous = k
        if ch == "{":
            out = tracks.setdefault(_OUT, _Track())
            out.pending.setdefault(-out.offset, []).append(k)  # a new scan at depth 0
        moved: dict[int, _Track] = {}
        for state, track in tracks.items():
            if state == _OUT and ch == "{":
                track.offset += 1
            elif state == _OUT and ch == "}":
                track.offset -= 1
                for start in track.pending.pop(-track.offset, ()):
                    ends[start] = k
            if track.pending:
                nxt = _next_state(state, ch)
                moved[nxt] = _merge(moved.get(nxt), track)
        tracks = moved
    return ends


def find_json_spans(text: str) -> list[str]:
    """Top-level balanced, string-aware `{...}` spans as the reference scanner finds them."""
    ends = _span_ends(text)
    spans: list[str] = []
    resume = 0
    for start in sorted(ends):
        if start >= resume:  # starts inside an accepted span are never visited
            spans.append(text[start : ends[start] + 1])
            resume = ends[start] + 1
    return spans


# ---------------------------------------------------------------------------------------------
# Candidates


def _decode_object(span: str) -> dict[str, Any] | None:
    try:
        value = json.loads(span)
    except (ValueError, RecursionError):  # bad JSON, >4300-digit ints, absurd nesting
        return None
    return value if isinstance(value, dict) else None


def _number(value: Any, bounds: tuple[float, float] | None) -> float | None:
    """`value` as a finite float, or None; with `bounds` (D2) booleans and out-of-range fail."""
    if bounds is not None and isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number):
        return None
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        return None
    return number


def _triple(obj: dict[str, Any], defaults: Verdict | None, validate_range: bool) -> Verdict | None:
    """The three scores of `obj`; missing keys take `defaults` (never range-checked) or fail."""
    bounds = (_SCORE_BOUNDS, _SCORE_BOUNDS, _RANKING_BOUNDS)
    values: list[float] = []
    for index, key in enumerate(_SCORE_KEYS):
        if key in obj:
            number = _number(obj[key], bounds[index] if validate_range else None)
        elif defaults is not None:
            number = _number(defaults[index], None)
        else:
            return None
        if number is None:
            return None
        values.append(number)
    return Verdict(*values)


def _search(text: str, candidate: Callable[[dict[str, Any]], Verdict | None]) -> Verdict | None:
    """First valid candidate inside ```json fences, else the last valid one in the whole text."""
    for fence in _FENCE.finditer(text):
        for span in find_json_spans(fence.group(1)):
            obj = _decode_object(span)
            found = None if obj is None else candidate(obj)
            if found is not None:
                return found
    for span in reversed(find_json_spans(text)):
        obj = _decode_object(span)
        found = None if obj is None else candidate(obj)
        if found is not None:
            return found
    return None


def _preview(text: str) -> str:
    return text[:_PREVIEW_CHARS] + "..." if len(text) > _PREVIEW_CHARS else text


# ---------------------------------------------------------------------------------------------
# Public parsers


def parse_overall(
    text: str, *, default_score: float, default_ranking: float, validate_range: bool
) -> Verdict:
    """The overall verdict (strict); raises `VerdictParseError` when there is none."""
    defaults = Verdict(default_score, default_score, default_ranking)

    def candidate(obj: dict[str, Any]) -> Verdict | None:
        inner = obj.get("overall")
        if isinstance(inner, dict):
            obj = inner
        if not any(key in obj for key in _SCORE_KEYS):
            return None
        return _triple(obj, defaults, validate_range)

    verdict = _search(text, candidate)
    if verdict is None:
        raise VerdictParseError(f"No parseable JSON found in GenRM output: {_preview(text)}")
    return verdict


def parse_overall_lenient(
    text: str, *, default_score: float, default_ranking: float, validate_range: bool = False
) -> Verdict:
    """`parse_overall`, but the defaults instead of an error (the reference's non-strict mode)."""
    try:
        return parse_overall(
            text,
            default_score=default_score,
            default_ranking=default_ranking,
            validate_range=validate_range,
        )
    except VerdictParseError:
        return Verdict(default_score, default_score, default_ranking)


def parse_rubric(text: str, *, expected_ids: Sequence[int], validate_range: bool) -> Verdict:
    """The mean over `rubric_evaluations` covering exactly `expected_ids` (D11); else an error."""
    expected = frozenset(expected_ids)

    def candidate(obj: dict[str, Any]) -> Verdict | None:
        entries = obj.get("rubric_evaluations")
        if not isinstance(entries, list) or not entries or len(entries) != len(expected):
            return None
        seen: set[int] = set()
        triples: list[Verdict] = []
        for entry in entries:
            if not isinstance(entry, dict):
                return None
            rubric_id = entry.get("rubric_id")
            # bool is an int subclass but never a rubric id; duplicates and strangers fail.
            if isinstance(rubric_id, bool) or not isinstance(rubric_id, int):
                return None
            if rubric_id not in expected or rubric_id in seen:
                return None
            seen.add(rubric_id)
            triple = _triple(entry, None, validate_range)
            if triple is None:
                return None
            triples.append(triple)
        mean = Verdict(*(sum(column) / len(triples) for column in zip(*triples, strict=True)))
        # Finite entries can still sum past the float range when ranges are not enforced.
        return mean if all(math.isfinite(value) for value in mean) else None

    verdict = _search(text, candidate)
    if verdict is None:
        ids = ",".join(str(i) for i in sorted(expected))
        raise VerdictParseError(
            f"No rubric verdict covering rubric ids [{ids}] found in GenRM output: {_preview(text)}"
        )
    return verdict
