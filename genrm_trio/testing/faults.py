"""The simulated judge's faults: which comparisons a `FaultRule` selects, and how each fault
kind answers (its text, its HTTP status and body, the drop and not-JSON messages).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Final, Literal, final, get_args

from genrm_trio.testing.verdicts import (
    FILLER,
    format_ranking,
    sim_verdict,
    sim_verdict_text,
    verdict_json,
    verdict_prose,
    verdict_text,
)

__all__ = ["FAULT_KINDS", "FaultKind", "FaultRule", "Position"]

FaultKind = Literal[
    "budget_exhausted",
    "http_500",
    "http_429",
    "http_401",
    "http_error",
    "drop",
    "empty",
    "garbage",
    "nan",
    "out_of_range",
    "slow",
    "not_json",
    "huge",
]
FAULT_KINDS: Final[tuple[str, ...]] = get_args(FaultKind)

Position = Literal["first", "second", "either", "both"]
_POSITIONS: Final[tuple[str, ...]] = get_args(Position)


@final
@dataclass(frozen=True, slots=True)
class FaultRule:
    """Inject `fault` into comparisons whose answers contain `match`.

    `position` says where `match` must appear: `first` (in response_1), `second` (in
    response_2), `either`, or `both`. An empty `match` selects every comparison. With `times`
    set, only the first `times` matching calls get the fault; later ones pass through (the judge
    "recovers"). The remaining fields parametrise single kinds and are ignored by the others.
    """

    fault: FaultKind
    match: str = ""
    position: Position = "either"
    times: int | None = None
    status: int = 503  # http_error only
    retry_after_s: float | None = None  # Retry-After on HTTP faults; http_429 defaults to 1 s
    body: str | None = None  # HTTP fault body; default depends on the status
    delay_s: float = 3600.0  # slow: extra latency (default outlasts the 1800 s attempt deadline)
    huge_chars: int = 200_000  # huge: characters of prose before the verdict

    def __post_init__(self) -> None:
        if self.fault not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.fault!r}; expected one of {FAULT_KINDS}")
        if self.position not in _POSITIONS:
            raise ValueError(f"unknown position {self.position!r}; expected one of {_POSITIONS}")
        if self.times is not None and self.times < 0:
            raise ValueError("times must be >= 0")
        if not 100 <= self.status <= 599:
            raise ValueError("status must be an HTTP status code")
        if self.retry_after_s is not None and not (
            math.isfinite(self.retry_after_s) and self.retry_after_s >= 0
        ):
            raise ValueError("retry_after_s must be a finite number >= 0")
        if not (math.isfinite(self.delay_s) and self.delay_s >= 0):
            raise ValueError("delay_s must be a finite number >= 0")
        if self.huge_chars < 0:
            raise ValueError("huge_chars must be >= 0")

    def selects(self, response_1: str, response_2: str) -> bool:
        """Whether this rule's content and position select the pair (ignoring `times`)."""
        in_1 = self.match in response_1
        in_2 = self.match in response_2
        if self.position == "first":
            return in_1
        if self.position == "second":
            return in_2
        if self.position == "both":
            return in_1 and in_2
        return in_1 or in_2


def fault_text(
    kind: FaultKind | None,
    rule: FaultRule,
    response_1: str,
    response_2: str,
    verdict: tuple[int, int, float] | None = None,
) -> str:
    """The answer text of the text-level faults (and of normal and slow verdicts): the given
    ``verdict`` (a noisy judgment's), else `sim_verdict`'s."""
    if kind == "empty":
        return ""
    if kind == "garbage":
        return "I have carefully compared both responses and I cannot decide between them."
    q1, q2, ranking = verdict if verdict is not None else sim_verdict(response_1, response_2)
    prose = verdict_prose(q1, q2, ranking)
    if kind == "nan":
        return f"{prose}\n\n```json\n{verdict_json('NaN', q2, format_ranking(ranking))}\n```"
    if kind == "out_of_range":
        return f"{prose}\n\n```json\n{verdict_json(9, q2, format_ranking(ranking))}\n```"
    text = (
        verdict_text(q1, q2, ranking)
        if verdict is not None
        else sim_verdict_text(response_1, response_2)
    )
    if kind == "huge":
        repeats = rule.huge_chars // len(FILLER) + 1
        return (FILLER * repeats)[: rule.huge_chars] + "\n\n" + text
    return text


def default_body(status: int) -> str:
    if status == 401:
        return '{"error": "unauthorized"}'
    if status == 429:
        return '{"error": "rate limited"}'
    if status == 500:
        return "judge unavailable"
    return "judge offline"


@dataclass(frozen=True, slots=True)
class HTTPFault:
    status: int
    body: bytes
    retry_after_s: float | None


def http_fault(kind: FaultKind, rule: FaultRule) -> HTTPFault | None:
    if kind == "http_500":
        status = 500
    elif kind == "http_429":
        status = 429
    elif kind == "http_401":
        status = 401
    elif kind == "http_error":
        status = rule.status
    else:
        return None
    retry_after = rule.retry_after_s
    if retry_after is None and kind == "http_429":
        retry_after = 1.0
    body = rule.body if rule.body is not None else default_body(status)
    return HTTPFault(status, body.encode(), retry_after)


def not_json_message(body: str) -> str:
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return str(error)
    raise AssertionError("not_json body decoded")  # pragma: no cover


NOT_JSON_BODY: Final = "<html><body>judge says hello, not JSON</body></html>"
DROP_MESSAGE: Final = "peer closed connection without sending complete message body"
