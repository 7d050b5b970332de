"""Parsing a GenRM judge's output into a verdict (docs/scoring.md section 7; D2, D3, D11). Pure.

The candidate search is the reference's: JSON objects inside ```json fences first (the first valid
one wins), else the last valid top-level object anywhere in the text.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, final

__all__ = [
    "MAX_BRACES",
    "SCORE_KEYS",
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


SCORE_KEYS: Final = ("score_1", "score_2", "ranking")
"""The keys of a verdict object, one of which any candidate holds."""

_SCORE_BOUNDS: Final = (1.0, 5.0)
_RANKING_BOUNDS: Final = (1.0, 6.0)
_PREVIEW_CHARS: Final = 200

MAX_BRACES: Final = 1_000_000
"""The most "{" a judge's output may hold and still be searched for a verdict (a verdict needs a
handful; docs/reliability.md, "What is bounded")."""

# The reference pattern is r"```json\s*([\s\S]*?)\s*```". Its two \s* only trim whitespace, which
# never changes the brace spans inside, and they make long whitespace runs backtrack
# quadratically; without them the same fences close at the same backticks.
_FENCE: Final = re.compile(r"```json([\s\S]*?)```", re.IGNORECASE)

# ---------------------------------------------------------------------------------------------
# Brace scanner. The reference restarts a character-by-character scan at every "{", which is
# quadratic on text like "{{{{...". This computes the same spans in one pass: scans that are in
# the same string state move in lockstep, so they are tracked together with a shared depth offset.

_SPECIAL: Final = re.compile(r'[{}"\\]')


@final
class _Track:
    """Unfinished scans sharing one string state; a scan's depth is its key plus `offset`.

    A scan is named by its ordinal, the count of "{" before it. The scans a track opened itself
    (while outside a string) are a stack of two arrays, `keys` and `starts` (ordinals): a new
    scan is always the shallowest (depth 1, every other one deeper), and a closing brace closes
    the shallowest, so keys only fall along the stack and the one to close is the last. Eight
    bytes a value, and no dict to grow: a reply of 4 M unclosed braces held 400 MB in a dict of
    them, and its resize held the GIL for 86 ms at a time. Scans that came from another track
    (`_merge`) are in `pending`: a key to an ordinal, or to a list of them once tracks that met
    share the key. `size` counts every scan, so `_merge` re-keys the track with fewer."""

    __slots__ = ("keys", "offset", "pending", "size", "starts")

    def __init__(self) -> None:
        self.offset = 0
        self.keys = array("q")
        self.starts = array("q")
        self.pending: dict[int, int | list[int]] = {}
        self.size = 0


def _add(pending: dict[int, int | list[int]], key: int, starts: int | list[int]) -> None:
    held = pending.get(key)
    if held is None:
        pending[key] = starts
        return
    joined = held if isinstance(held, list) else [held]
    if isinstance(starts, list):
        joined.extend(starts)
    else:
        joined.append(starts)
    pending[key] = joined


def _merge(into: _Track | None, track: _Track | None) -> _Track | None:
    """Join two tracks that reached the same state, re-keying the one with fewer scans (so each
    scan is re-keyed O(log n) times in all). Sizing them by keys instead was quadratic: text
    like `{\\"{\\"…` piles every scan onto one key, and that one key was re-keyed each time."""
    if into is None or not into.size:
        return track if track is not None and track.size else None
    if track is None or not track.size:
        return into
    big, small = (into, track) if into.size >= track.size else (track, into)
    shift = small.offset - big.offset
    pending = big.pending
    keys, starts = small.keys, small.starts
    if len(keys) == 1:  # the common case (a scan just opened), without a zip's set-up
        _add(pending, keys[0] + shift, starts[0])
    elif keys:
        for key, start in zip(keys, starts, strict=False):  # equal lengths
            _add(pending, key + shift, start)
    for key, held in small.pending.items():
        _add(pending, key + shift, held)
    big.size += small.size
    return big


def _span_ends(text: str, braces: int) -> tuple[array[int], array[int]]:
    """Every "{" of `text` (`braces` of them) in order: its index, and the index of the "}"
    that closes its scan (-1 when the scan never balances).

    One pass over the special characters with three tracks (outside a string, inside one, just
    after a backslash inside one). A brace changes no track's state, so it costs a stack step;
    only a quote or a backslash moves tracks between states. Linear in the text (issue #40:
    the per-character state dict this replaced cost about 1.7 s per MB of braces). Memory is
    16 bytes per "{" here, both arrays sized once (a dict of the closed spans took about 160
    bytes each; docs/benchmarks.md, "Verdict parsing")."""
    positions = array("q", bytes(8 * braces))
    ends = array("q", [-1]) * braces
    ordinal = 0
    out: _Track | None = None
    inside: _Track | None = None
    escaped: _Track | None = None
    previous = -1
    for match in _SPECIAL.finditer(text):
        k = match.start()
        ch = match.group()
        if escaped is not None and k > previous + 1:
            # an ordinary character between specials consumed the escape
            inside, escaped = _merge(inside, escaped), None
        previous = k
        if ch == "{":
            if escaped is not None:  # an escaped brace: the escape is consumed
                inside, escaped = _merge(inside, escaped), None
            if out is None:
                out = _Track()
            out.offset += 1
            out.keys.append(1 - out.offset)  # a new scan, at depth 1
            out.starts.append(ordinal)
            out.size += 1
            positions[ordinal] = k
            ordinal += 1
        elif ch == "}":
            if escaped is not None:
                inside, escaped = _merge(inside, escaped), None
            if out is not None:
                out.offset -= 1
                key = -out.offset  # the scans now at depth 0
                if out.keys and out.keys[-1] == key:
                    out.keys.pop()
                    ends[out.starts.pop()] = k
                    out.size -= 1
                closed = out.pending.pop(key, None) if out.pending else None
                if isinstance(closed, int):
                    ends[closed] = k
                    out.size -= 1
                elif closed is not None:
                    for scan in closed:
                        ends[scan] = k
                    out.size -= len(closed)
                # an emptied `out` is kept for the next "{" (`_merge` drops empty tracks)
        elif ch == '"':
            # outside → inside, inside → outside, after a backslash → inside (the quote is
            # escaped)
            out, inside, escaped = inside, _merge(out, escaped), None
        else:  # a backslash: escapes inside a string, ordinary outside
            inside, escaped = escaped, inside
    return positions, ends


def _top_level_spans(text: str, braces: int | None = None) -> tuple[array[int], array[int]]:
    """Start and end of each top-level balanced span, in order: a scan that starts inside an
    accepted span is never visited (the reference resumes after the span's end). `braces`: the
    count of "{" in `text`, when the caller has it."""
    positions, ends = _span_ends(text, text.count("{") if braces is None else braces)
    span_starts, span_ends = array("q"), array("q")
    resume = 0
    for start, end in zip(positions, ends, strict=True):
        if end >= 0 and start >= resume:
            span_starts.append(start)
            span_ends.append(end)
            resume = end + 1
    return span_starts, span_ends


def find_json_spans(text: str) -> list[str]:
    """Top-level balanced, string-aware `{...}` spans as the reference scanner finds them."""
    span_starts, span_ends = _top_level_spans(text)
    return [text[start : end + 1] for start, end in zip(span_starts, span_ends, strict=True)]


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
    for index, key in enumerate(SCORE_KEYS):
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


def _search(
    text: str, candidate: Callable[[dict[str, Any]], Verdict | None], needles: tuple[str, ...]
) -> Verdict | None:
    """First valid candidate inside ```json fences, else the last valid one in the whole text.

    A span holding none of `needles` (the keys every candidate needs) and no backslash (which
    could spell a key as `\\u` escapes) cannot be a candidate and is never decoded or copied: a
    reply of a million empty objects costs one scan, not a million decodes. A text with more
    than `MAX_BRACES` "{" is not searched (`VerdictParseError`): the scan's memory is 16 bytes a
    brace and 16 more a top-level span, so this bounds it (about 35 MB) and its time (about a
    second)."""
    braces = text.count("{")
    if braces > MAX_BRACES:
        raise VerdictParseError(
            f"GenRM output holds {braces:,} '{{' (more than {MAX_BRACES:,}): not searched for a "
            f"verdict: {_preview(text)}"
        )

    def found_in(body: str, start: int, end: int) -> Verdict | None:
        stop = end + 1
        if body.find("\\", start, stop) < 0 and all(
            body.find(needle, start, stop) < 0 for needle in needles
        ):
            return None
        obj = _decode_object(body[start:stop])
        return None if obj is None else candidate(obj)

    for fence in _FENCE.finditer(text):
        body = fence.group(1)
        for start, end in zip(*_top_level_spans(body), strict=True):
            found = found_in(body, start, end)
            if found is not None:
                return found
    span_starts, span_ends = _top_level_spans(text, braces)
    for start, end in zip(reversed(span_starts), reversed(span_ends), strict=True):
        found = found_in(text, start, end)
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
        if not any(key in obj for key in SCORE_KEYS):
            return None
        return _triple(obj, defaults, validate_range)

    verdict = _search(text, candidate, SCORE_KEYS)
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

    verdict = _search(text, candidate, ("rubric_evaluations",))
    if verdict is None:
        ids = ",".join(str(i) for i in sorted(expected))
        raise VerdictParseError(
            f"No rubric verdict covering rubric ids [{ids}] found in GenRM output: {_preview(text)}"
        )
    return verdict
