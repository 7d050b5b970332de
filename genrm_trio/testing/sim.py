"""The simulated GenRM judge (docs/embedding.md, "A judge"): deterministic verdicts, scripted
latency and faults.

A test and demo tool, never a production default. One simulator core serves three ways:

- `SimJudge`: the `Judge` protocol in-process (no sockets); sleeps with `trio.sleep`, so
  `MockClock` virtual time drives its latency.
- `sim_asgi_app()`: a plain ASGI3 app speaking both judge APIs (`POST /v1/responses`,
  `POST /v1/chat/completions`) plus `GET /v1/models` and `GET /health`.
- `serve_sim_judge()`: that app on a minimal HTTP/1.1 server (what `genrm-trio sim-judge` runs).

Verdicts are a pure function of the two answer texts: each answer gets a quality 1..5 from its
sha256 (or from a `[quality=N]` marker in the text), the scores are the qualities and the ranking
follows their difference, so both orientations of a pair always agree.

With a `LengthModel` (or a `[need=N]` marker in an answer) each attempt's verdict needs a number
of output tokens; an attempt whose budget (`max_output_tokens`, chat `max_tokens`) is below it
answers as an exhausted budget, as a reasoning judge cut off before its verdict does. See
`LengthModel` for the distribution and its presets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Literal, cast, final, get_args

import httpx
import trio

from genrm_trio.judge.base import (
    JudgeBadJSON,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTransportError,
    ReplyStatus,
)

__all__ = [
    "FAULT_KINDS",
    "LENGTH_PRESETS",
    "NEED_MARKER",
    "QUALITY_MARKER",
    "FaultKind",
    "FaultRule",
    "LengthModel",
    "Position",
    "SimCall",
    "SimConfig",
    "SimJudge",
    "SimJudgeApp",
    "SimStatistics",
    "answer_quality",
    "forced_need",
    "parse_fault_rule",
    "serve_sim_judge",
    "sim_asgi_app",
    "sim_config_from_args",
    "sim_verdict",
    "sim_verdict_text",
]

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

Api = Literal["in_process", "responses", "chat_completions"]

#: `[quality=N]` (N in 1..5) anywhere in an answer forces that answer's quality; the first wins.
QUALITY_MARKER: Final = re.compile(r"\[quality=([1-5])\]")

#: `[need=N]` (or `[need=N1/N2/...]`, one value per attempt, the last repeating) in an answer
#: forces the output tokens its pair's verdict needs, with or without a length model.
NEED_MARKER: Final = re.compile(r"\[need=([0-9]+(?:/[0-9]+)*)\]")

_MODEL_ID: Final = "genrm-sim"
_DEFAULT_BUDGET_TOKENS: Final = 16384
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
_OCCURRENCE_CAP: Final = 65536
_FILLER: Final = "Let me weigh both responses against the conversation once more. "


class _SimulatedDrop(httpx.RemoteProtocolError):
    """Raised by the ASGI app after half a body: the `drop` fault, as the client should see it."""


# --- configuration ---------------------------------------------------------------------------


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


@final
@dataclass(frozen=True, slots=True)
class LengthModel:
    """Output tokens an attempt's verdict needs: a log-normal per pair times log-normal noise per
    attempt, clipped to ``[low, high]``.

    ``need = clip(round(median * exp(pair_sigma * z_pair + attempt_sigma * z_attempt)))`` with
    standard normals drawn from sha256 of (seed, pair) and (seed, pair, attempt). The pair is the
    unordered pair of answer texts plus the history and principle, so showing it the other way
    round (``position_balance``) does not change how hard it is; the attempt is how many times the
    simulator has judged that pair before (in either order, across judge passes), so a retry of
    a pair is a fresh sample of the same difficulty, as sampling at temperature 0.6 is. The
    need does not depend on the budget: the budget only cuts a long answer off.

    ``pair_sigma`` spreads difficulty between pairs, ``attempt_sigma`` between samples of one
    pair; the marginal of one attempt is log-normal with sigma ``sqrt(pair_sigma^2 +
    attempt_sigma^2)`` (before clipping). Presets are in `LENGTH_PRESETS`.
    """

    median: float
    pair_sigma: float
    attempt_sigma: float
    low: int = 1
    high: int = 1 << 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and self.median > 0):
            raise ValueError("median must be a finite number > 0")
        for name in ("pair_sigma", "attempt_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not 1 <= self.low <= self.high:
            raise ValueError("need 1 <= low <= high")

    def need(self, z_pair: float, z_attempt: float) -> int:
        raw = self.median * math.exp(self.pair_sigma * z_pair + self.attempt_sigma * z_attempt)
        return min(self.high, max(self.low, round(raw)))


#: `validation`: the partial-masking validation run's judge (answers of 531-2,981 tokens, 1,341
#: at the 55th percentile). Log-normal sigma 0.345 overall (the range spans about 5 sigma, as
#: ~100 draws do), median 1,284 so that P(need <= 1,341) = 0.55; split as 0.32 between samples of
#: one pair (a coefficient of variation near 0.3 at temperature 0.6) and 0.13 between pairs. Most
#: of the spread is within a pair because the run's 9 of 64 failures with two attempts are below
#: even independent attempts' 0.45^2 = 20%; a larger pair share would fail more pairs twice.
#: `long_tail`: a judge that reasons for 15,000 tokens at the median with a wide spread (sigma
#: 0.61; 0.50 between samples of one pair), so a 16,384 budget is exhausted by 44% of attempts
#: and 10% need more than 32,768 (NeMo Gym PR #3303 saw 3 of 5 runs exhaust 16,384 and 2 of 4
#: exhaust 24,576 with a hosted GenRM at temperature 0.6).
LENGTH_PRESETS: Final[Mapping[str, LengthModel]] = {
    "validation": LengthModel(1284.0, 0.13, 0.32, low=531, high=2981),
    "long_tail": LengthModel(15000.0, 0.35, 0.50, low=1500, high=131072),
}


@final
@dataclass(frozen=True, slots=True)
class SimConfig:
    """Latency, jitter and faults of a simulated judge.

    Each call sleeps `latency_s` plus a seeded jitter drawn uniformly from `[0, jitter_s]`. The
    first `rules` entry that selects a call (and has `times` left) decides its fault; otherwise
    with probability `fault_rate` the call gets `fault_kind` (defaults of `FaultRule`). Seeded
    draws depend on `seed`, the call's content and how often that content was seen before, not on
    scheduling order, so they reproduce under concurrency. `api_key`, when set, is required as a
    bearer token over HTTP (401 otherwise). `record_calls=False` keeps `calls` empty (long runs).
    """

    latency_s: float = 0.0
    jitter_s: float = 0.0
    seed: int = 0
    fault_rate: float = 0.0
    fault_kind: FaultKind = "http_500"
    rules: Sequence[FaultRule] = ()
    api_key: str | None = None
    record_calls: bool = True
    sticky_faults: bool = False  # random faults depend on content only: a drawn pair always fails
    length_model: LengthModel | None = None  # output tokens a verdict needs (None: never cut)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.length_model is not None and not isinstance(self.length_model, LengthModel):
            raise TypeError(f"length_model must be a LengthModel, got {self.length_model!r}")
        for name in ("latency_s", "jitter_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.fault_kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {self.fault_kind!r}; expected one of {FAULT_KINDS}")
        for rule in self.rules:
            if not isinstance(rule, FaultRule):
                raise TypeError(f"rules must hold FaultRule objects, got {rule!r}")


@final
@dataclass(frozen=True, slots=True)
class SimCall:
    """One judge call as the simulator saw it."""

    response_1: str
    response_2: str
    principle: str | None
    history: tuple[dict[str, str], ...]
    api: Api
    fault: FaultKind | None  # the injected fault, None for a normal verdict
    started_at: float  # trio.current_time() on arrival
    max_output_tokens: int | None = None  # the budget the call asked for (None: not given)
    need: int | None = None  # output tokens its verdict needed (length model or [need=N])


@final
@dataclass(frozen=True, slots=True)
class SimStatistics:
    """A snapshot of a simulator's counters."""

    calls: int  # judge calls received (faulted ones included; /v1/models and bad requests not)
    faults: int  # calls that got a fault
    faults_by_kind: Mapping[str, int]
    in_flight: int
    max_in_flight: int
    bad_requests: int  # HTTP requests refused with 4xx before reaching the judge logic
    exhausted: int = 0  # calls whose budget was below their verdict's need (not faults)


# --- deterministic verdicts -------------------------------------------------------------------


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest()


def answer_quality(text: str) -> int:
    """Quality 1..5 of one answer: its `[quality=N]` marker, else derived from its sha256."""
    marker = QUALITY_MARKER.search(text)
    if marker is not None:
        return int(marker.group(1))
    return int.from_bytes(_digest(text)[:8], "big") % 5 + 1


def forced_need(response_1: str, response_2: str, attempt: int) -> int | None:
    """The `[need=...]` marker's value for attempt number `attempt` (0-based) of a pair: the
    larger of the two answers' values (so the order shown does not matter), None without one."""
    values: list[int] = []
    for text in (response_1, response_2):
        marker = NEED_MARKER.search(text)
        if marker is not None:
            steps = marker.group(1).split("/")
            values.append(int(steps[min(attempt, len(steps) - 1)]))
    return max(values) if values else None


def _normal(digest: bytes) -> float:
    """A standard normal from 8 bytes of a digest (inverse CDF of a uniform in (0, 1))."""
    uniform = (int.from_bytes(digest[:8], "big") + 0.5) / 2**64
    return statistics.NormalDist().inv_cdf(uniform)


def sim_verdict(response_1: str, response_2: str) -> tuple[int, int, float]:
    """`(score_1, score_2, ranking)` for a pair; swapping the answers gives `(s2, s1, 7 - r)`.

    Ranking by quality difference d = q1 - q2: d >= 2 → 1, d = 1 → 2, d = -1 → 5, d <= -2 → 6.
    Equal qualities rank 3 or 4 by comparing the answers' digests, and exactly 3.5 for identical
    answers (the only non-integer ranking).
    """
    q1 = answer_quality(response_1)
    q2 = answer_quality(response_2)
    d = q1 - q2
    ranking: float
    if d >= 2:
        ranking = 1
    elif d == 1:
        ranking = 2
    elif d == -1:
        ranking = 5
    elif d <= -2:
        ranking = 6
    else:
        h1, h2 = _digest(response_1), _digest(response_2)
        ranking = 3 if h1 > h2 else 4 if h1 < h2 else 3.5
    return q1, q2, ranking


_QUALITY_WORDS: Final = {
    1: "is largely incorrect",
    2: "has significant errors",
    3: "is partially correct",
    4: "is mostly correct",
    5: "is correct and complete",
}


def _verdict_json(score_1: object, score_2: object, ranking: object) -> str:
    return f'{{"score_1": {score_1}, "score_2": {score_2}, "ranking": {ranking}}}'


def _format_ranking(ranking: float) -> str:
    return str(int(ranking)) if float(ranking).is_integer() else str(ranking)


def _verdict_prose(q1: int, q2: int, ranking: float) -> str:
    if ranking < 3.5:
        which = "Response 1 is better."
    elif ranking > 3.5:
        which = "Response 2 is better."
    else:
        which = "The responses are equally good."
    return (
        f"Response 1 {_QUALITY_WORDS[q1]} (quality {q1}/5). "
        f"Response 2 {_QUALITY_WORDS[q2]} (quality {q2}/5). {which}"
    )


def sim_verdict_text(response_1: str, response_2: str) -> str:
    """The judge's full answer: one line of reasoning, then a fenced json verdict (parsed as
    docs/scoring.md, "Overall verdict", says)."""
    q1, q2, ranking = sim_verdict(response_1, response_2)
    verdict = _verdict_json(q1, q2, _format_ranking(ranking))
    return f"{_verdict_prose(q1, q2, ranking)}\n\n```json\n{verdict}\n```"


def _fault_text(kind: FaultKind | None, rule: FaultRule, response_1: str, response_2: str) -> str:
    """The answer text of the text-level faults (and of normal and slow verdicts)."""
    if kind == "empty":
        return ""
    if kind == "garbage":
        return "I have carefully compared both responses and I cannot decide between them."
    q1, q2, ranking = sim_verdict(response_1, response_2)
    prose = _verdict_prose(q1, q2, ranking)
    if kind == "nan":
        return f"{prose}\n\n```json\n{_verdict_json('NaN', q2, _format_ranking(ranking))}\n```"
    if kind == "out_of_range":
        return f"{prose}\n\n```json\n{_verdict_json(9, q2, _format_ranking(ranking))}\n```"
    text = sim_verdict_text(response_1, response_2)
    if kind == "huge":
        repeats = rule.huge_chars // len(_FILLER) + 1
        return (_FILLER * repeats)[: rule.huge_chars] + "\n\n" + text
    return text


def _tokens(text_length: int) -> int:
    return text_length // 4


def _default_body(status: int) -> str:
    if status == 401:
        return '{"error": "unauthorized"}'
    if status == 429:
        return '{"error": "rate limited"}'
    if status == 500:
        return "judge unavailable"
    return "judge offline"


@dataclass(frozen=True, slots=True)
class _HTTPFault:
    status: int
    body: bytes
    retry_after_s: float | None


def _http_fault(kind: FaultKind, rule: FaultRule) -> _HTTPFault | None:
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
    body = rule.body if rule.body is not None else _default_body(status)
    return _HTTPFault(status, body.encode(), retry_after)


def _not_json_message(body: str) -> str:
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return str(error)
    raise AssertionError("not_json body decoded")  # pragma: no cover


_NOT_JSON_BODY: Final = "<html><body>judge says hello, not JSON</body></html>"
_DROP_MESSAGE: Final = "peer closed connection without sending complete message body"


# --- the shared core --------------------------------------------------------------------------


@dataclass(slots=True)
class _Decision:
    """What the simulator does with one call: when to answer and which fault (if any)."""

    delay_s: float
    fault: FaultKind | None
    rule: FaultRule
    need: int | None = None  # output tokens the verdict needs; None: any budget suffices


class _Core:
    """Call recording, fault selection, seeded draws and counters, shared by every front end."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.calls: list[SimCall] = []
        self._rule_uses = [0] * len(config.rules)
        self._occurrences: dict[bytes, int] = {}
        self._pair_attempts: dict[bytes, int] = {}
        self._random_rule = FaultRule(fault=config.fault_kind)
        self.n_calls = 0
        self.faults_by_kind: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.bad_requests = 0
        self.exhausted = 0

    def _need(self, call: JudgeCall) -> int | None:
        """Output tokens this call's verdict needs, or None (no length model, no marker)."""
        model = self.config.length_model
        if model is None and "[need=" not in call.response_1 and "[need=" not in call.response_2:
            return None  # skip the hashing and the attempt table
        # the unordered pair with its context: position_balance does not change the difficulty
        answers = sorted((_digest(call.response_1), _digest(call.response_2)))
        content = hashlib.sha256(b"".join(answers))
        content.update(_digest(call.principle or ""))
        for message in call.history:
            content.update(_digest(message.get("role", "")))
            content.update(_digest(message.get("content", "")))
        pair = content.digest()
        if len(self._pair_attempts) >= _OCCURRENCE_CAP and pair not in self._pair_attempts:
            self._pair_attempts.clear()
        attempt = self._pair_attempts.get(pair, 0)
        self._pair_attempts[pair] = attempt + 1
        forced = forced_need(call.response_1, call.response_2, attempt)
        if forced is not None or model is None:
            return forced
        seed = f"{self.config.seed}\0length\0".encode()
        z_pair = _normal(hashlib.sha256(seed + pair).digest())
        z_attempt = _normal(hashlib.sha256(seed + pair + b"%d" % attempt).digest())
        return model.need(z_pair, z_attempt)

    def _draws(self, call: JudgeCall) -> tuple[float, float]:
        """Two seeded uniforms in [0, 1) for this call: (fault, jitter)."""
        if self.config.fault_rate == 0 and self.config.jitter_s == 0:
            return 1.0, 0.0  # nothing is drawn: skip the hashing and the occurrence table
        content = hashlib.sha256()
        for part in (call.response_1, call.response_2, call.principle or ""):
            content.update(_digest(part))
        for message in call.history:
            content.update(_digest(message.get("role", "")))
            content.update(_digest(message.get("content", "")))
        key = content.digest()
        if len(self._occurrences) >= _OCCURRENCE_CAP and key not in self._occurrences:
            self._occurrences.clear()
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        draw = hashlib.sha256(f"{self.config.seed}\0{occurrence}\0".encode() + key).digest()
        fault_draw = int.from_bytes(draw[:8], "big") / 2**64
        if self.config.sticky_faults:
            # a pair's fate ignores how often it was seen, so its retries fail too
            first = hashlib.sha256(f"{self.config.seed}\0{0}\0".encode() + key).digest()
            fault_draw = int.from_bytes(first[:8], "big") / 2**64
        return fault_draw, int.from_bytes(draw[8:16], "big") / 2**64

    def begin(self, call: JudgeCall, api: Api) -> _Decision:
        """Record a call and decide its fate; pair with `end()` once it is answered."""
        config = self.config
        fault_draw, jitter_draw = self._draws(call)
        rule: FaultRule | None = None
        for index, candidate in enumerate(config.rules):
            if not candidate.selects(call.response_1, call.response_2):
                continue
            if candidate.times is not None and self._rule_uses[index] >= candidate.times:
                continue
            self._rule_uses[index] += 1
            rule = candidate
            break
        if rule is None and config.fault_rate > 0 and fault_draw < config.fault_rate:
            rule = self._random_rule
        fault = rule.fault if rule is not None else None
        # drawn for every call, so a faulted attempt still counts as a sample of its pair
        need = self._need(call)
        if fault not in (None, "slow"):
            need = None  # a fault decides the reply; only verdicts have a length
        delay = config.latency_s + jitter_draw * config.jitter_s
        if fault == "slow" and rule is not None:
            delay += rule.delay_s
        self.n_calls += 1
        if fault is not None:
            self.faults_by_kind[fault] = self.faults_by_kind.get(fault, 0) + 1
        if config.record_calls:
            self.calls.append(
                SimCall(
                    response_1=call.response_1,
                    response_2=call.response_2,
                    principle=call.principle,
                    history=tuple(dict(message) for message in call.history),
                    api=api,
                    fault=fault,
                    started_at=trio.current_time(),
                    max_output_tokens=call.max_output_tokens,
                    need=need,
                )
            )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return _Decision(delay, fault, rule if rule is not None else self._random_rule, need)

    def cut_off(self, decision: _Decision, budget: int) -> bool:
        """Whether a verdict reply runs out of `budget` before its verdict (and count it)."""
        if decision.need is None or decision.need <= budget:
            return False
        self.exhausted += 1
        return True

    def end(self) -> None:
        self.in_flight -= 1

    def statistics(self) -> SimStatistics:
        return SimStatistics(
            calls=self.n_calls,
            faults=sum(self.faults_by_kind.values()),
            faults_by_kind=dict(self.faults_by_kind),
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            bad_requests=self.bad_requests,
            exhausted=self.exhausted,
        )


def _prompt_length(call: JudgeCall) -> int:
    return (
        sum(len(message.get("content", "")) for message in call.history)
        + len(call.principle or "")
        + len(call.response_1)
        + len(call.response_2)
    )


# --- in-process judge -------------------------------------------------------------------------


@final
class SimJudge:
    """The simulated judge as an in-process `Judge` (no HTTP): see the module docstring."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self._core = _Core(config if config is not None else SimConfig())

    @property
    def config(self) -> SimConfig:
        return self._core.config

    @property
    def endpoint(self) -> str:
        return "sim:0"

    @property
    def path(self) -> str:
        return "/v1/responses"

    @property
    def calls(self) -> list[SimCall]:
        """Every call received so far, in arrival order (empty if `record_calls` is off)."""
        return self._core.calls

    def statistics(self) -> SimStatistics:
        return self._core.statistics()

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        decision = self._core.begin(call, "in_process")
        try:
            await trio.sleep(decision.delay_s)
            return self._reply(call, decision)
        finally:
            self._core.end()

    def _reply(self, call: JudgeCall, decision: _Decision) -> JudgeReply:
        fault, rule = decision.fault, decision.rule
        input_tokens = _tokens(_prompt_length(call))
        if fault == "drop":
            raise JudgeTransportError("RemoteProtocolError", _DROP_MESSAGE)
        if fault == "not_json":
            raise JudgeBadJSON(_not_json_message(_NOT_JSON_BODY))
        if fault is not None:
            http = _http_fault(fault, rule)
            if http is not None:
                raise JudgeHTTPError(http.status, http.body, http.retry_after_s)
        budget = call.max_output_tokens or _DEFAULT_BUDGET_TOKENS
        if fault == "budget_exhausted" or self._core.cut_off(decision, budget):
            return JudgeReply(ReplyStatus.BUDGET_EXHAUSTED, "", input_tokens, budget)
        text = _fault_text(fault, rule, call.response_1, call.response_2)
        status = ReplyStatus.COMPLETED if text.strip() else ReplyStatus.UNUSABLE
        tokens = decision.need if decision.need is not None else _tokens(len(text))
        return JudgeReply(status, text, input_tokens, tokens)

    async def aclose(self) -> None:
        return None


# --- ASGI app ---------------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _history_content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") in ("input_text", "output_text", "text")
            and isinstance(part.get("text"), str)
        )
    return ""


def _responses_call(body: Mapping[str, Any]) -> JudgeCall:
    raw_input = body.get("input", [])
    history: list[dict[str, str]] = []
    if isinstance(raw_input, str):
        history.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        for item in raw_input:
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                continue
            role = item.get("role", "user")
            history.append(
                {
                    "role": role if isinstance(role, str) else "user",
                    "content": _history_content(item.get("content")),
                }
            )
    else:
        raise _BadRequest(400, "input must be a string or a list")
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        raise _BadRequest(400, "metadata with response_1 and response_2 is required")
    response_1, response_2 = metadata.get("response_1"), metadata.get("response_2")
    if not isinstance(response_1, str) or not isinstance(response_2, str):
        raise _BadRequest(400, "metadata.response_1 and metadata.response_2 must be strings")
    principle = metadata.get("principle")
    if principle is not None and not isinstance(principle, str):
        raise _BadRequest(400, "metadata.principle must be a string")
    return JudgeCall(history, response_1, response_2, principle)


def _chat_call(body: Mapping[str, Any]) -> JudgeCall:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
    ):
        raise _BadRequest(400, "messages must be a list of objects with a role")
    roles = [m["role"] for m in messages]
    if roles[-2:] != ["response_1", "response_2"]:
        raise _BadRequest(400, "messages must end with roles response_1, response_2")
    head = messages[:-2]
    principle: str | None = None
    if head and head[-1]["role"] == "principle":
        principle = _history_content(head[-1].get("content"))
        head = head[:-1]
    special = {"principle", "response_1", "response_2"}
    if any(m["role"] in special for m in head):
        raise _BadRequest(400, "principle, response_1, response_2 must come last, in that order")
    history = [{"role": m["role"], "content": _history_content(m.get("content"))} for m in head]
    return JudgeCall(
        history,
        _history_content(messages[-2].get("content")),
        _history_content(messages[-1].get("content")),
        principle,
    )


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", errors="surrogatepass")


def _responses_body(
    request: Mapping[str, Any], n: int, text: str, budget: bool, usage: tuple[int, int]
) -> dict[str, Any]:
    if budget:
        output: list[dict[str, Any]] = [
            {
                "type": "reasoning",
                "id": f"rs_sim_{n}",
                "summary": [{"type": "summary_text", "text": _FILLER}],
            }
        ]
    else:
        output = [
            {
                "type": "message",
                "id": f"msg_sim_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
    model = request.get("model")
    return {
        "id": f"resp_sim_{n}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model if isinstance(model, str) else _MODEL_ID,
        "status": "incomplete" if budget else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if budget else None,
        "output": output,
        # openai's `Response` requires these (NeMo Gym's openai_model validates every upstream
        # reply with it, so without them a Gym `genrm_model` in front of this judge answers 500).
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        },
    }


def _chat_body(
    request: Mapping[str, Any], n: int, text: str, budget: bool, usage: tuple[int, int]
) -> dict[str, Any]:
    model = request.get("model")
    return {
        "id": f"chatcmpl-sim-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model if isinstance(model, str) else _MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _FILLER if budget else text},
                "finish_reason": "length" if budget else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        },
    }


def _budget_tokens(request: Mapping[str, Any], api: Api) -> int:
    value = request.get("max_output_tokens" if api == "responses" else "max_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return _DEFAULT_BUDGET_TOKENS


def _format_retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


@final
class SimJudgeApp:
    """The simulated judge as an ASGI3 app (both judge APIs); `sim` exposes calls and counters.

    Routes: `POST /v1/responses`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.
    The `drop` fault sends the headers (with a Content-Length) and half the body, then raises
    an `httpx.RemoteProtocolError` subclass: the server closes the connection (the client's
    httpx raises `RemoteProtocolError`), and
    `httpx.ASGITransport` hands the exception to the client as it is.
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.sim = SimJudge(config)
        self._core = self.sim._core
        self._n = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        else:  # websocket: refuse
            raise RuntimeError(f"unsupported ASGI scope type {kind!r}")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if path == "/health":
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
                return
            await _respond(send, 200, b'{"status": "ok"}')
            return
        if path == "/stats" and method == "GET":
            # counters for load generators (genrm-trio bench --judge-stats-url)
            stats = self.sim.statistics()
            await _respond(send, 200, _json_bytes(dataclasses.asdict(stats)))
            return
        api: Api
        if path == "/v1/responses":
            api = "responses"
        elif path == "/v1/chat/completions":
            api = "chat_completions"
        elif path == "/v1/models":
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
            elif not self._authorised(scope):
                await _respond(send, 401, _default_body(401).encode())
            else:
                await _respond(send, 200, _MODELS_BODY)
            return
        else:
            await _respond(send, 404, _json_bytes({"error": f"no route {path}"}))
            return
        if method != "POST":
            await _respond(send, 405, _json_bytes({"error": "method not allowed"}))
            return
        try:
            if not self._authorised(scope):
                raise _BadRequest(401, "unauthorized")
            raw = await _read_body(receive)
            if raw is None:  # the client went away before sending the body
                return
            try:
                request = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise _BadRequest(400, f"body is not JSON: {error}") from error
            if not isinstance(request, dict):
                raise _BadRequest(400, "body must be a JSON object")
            call = _responses_call(request) if api == "responses" else _chat_call(request)
            asked = request.get("max_output_tokens" if api == "responses" else "max_tokens")
            if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
                call = dataclasses.replace(call, max_output_tokens=asked)
        except _BadRequest as error:
            self._core.bad_requests += 1
            await _respond(send, error.status, _json_bytes({"error": str(error)}))
            return
        self._n += 1
        await self._judge(api, request, call, self._n, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        key = self._core.config.api_key
        if key is None:
            return True
        expected = f"Bearer {key}".encode()
        return any(
            name.lower() == b"authorization" and value == expected
            for name, value in scope.get("headers", [])
        )

    async def _judge(
        self,
        api: Api,
        request: Mapping[str, Any],
        call: JudgeCall,
        n: int,
        receive: Receive,
        send: Send,
    ) -> None:
        decision = self._core.begin(call, api)
        try:
            if not await _sleep_unless_disconnected(decision.delay_s, receive):
                return
            fault, rule = decision.fault, decision.rule
            http = _http_fault(fault, rule) if fault is not None else None
            if http is not None:
                extra: list[tuple[bytes, bytes]] = []
                if http.retry_after_s is not None:
                    extra.append((b"retry-after", _format_retry_after(http.retry_after_s).encode()))
                await _respond(send, http.status, http.body, extra)
                return
            if fault == "not_json":
                await _respond(send, 200, _NOT_JSON_BODY.encode(), content_type=b"text/plain")
                return
            limit = _budget_tokens(request, api)
            budget = fault == "budget_exhausted" or self._core.cut_off(decision, limit)
            text = "" if budget else _fault_text(fault, rule, call.response_1, call.response_2)
            if budget:
                out_tokens = limit
            elif decision.need is not None:
                out_tokens = decision.need
            else:
                out_tokens = _tokens(len(text))
            usage = (_tokens(_prompt_length(call)), out_tokens)
            make = _responses_body if api == "responses" else _chat_body
            body = _json_bytes(make(request, n, text, budget, usage))
            if fault == "drop":
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": body[: len(body) // 2],
                        "more_body": True,
                    }
                )
                # A real server closes the connection (its client sees the body cut short);
                # under httpx.ASGITransport the exception reaches the client as it is.
                raise _SimulatedDrop(
                    f"{_DROP_MESSAGE} (received {len(body) // 2} bytes, expected {len(body)})"
                )
            await _respond(send, 200, body)
        finally:
            self._core.end()


_MODELS_BODY: Final = _json_bytes(
    {"object": "list", "data": [{"id": _MODEL_ID, "object": "model", "owned_by": "genrm-trio"}]}
)


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY_BYTES:
            raise _BadRequest(413, "body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _sleep_unless_disconnected(delay_s: float, receive: Receive) -> bool:
    """Sleep `delay_s`; False if the client disconnected meanwhile (then nothing is sent)."""
    if delay_s <= 0:
        return True
    disconnected = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        await trio.sleep(delay_s)
        nursery.cancel_scope.cancel()
    return not disconnected


async def _respond(
    send: Send,
    status: int,
    body: bytes,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    content_type: bytes | None = None,
) -> None:
    if content_type is None:
        content_type = b"application/json" if body.startswith(b"{") else b"text/plain"
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *extra_headers,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def sim_asgi_app(config: SimConfig | None = None) -> SimJudgeApp:
    """A fresh simulated-judge ASGI app (its own counters; `app.sim` is its `SimJudge`)."""
    return SimJudgeApp(config)


# --- serving ----------------------------------------------------------------------------------


async def serve_sim_judge(
    config: SimConfig | SimJudgeApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the simulated judge until cancelled, on :mod:`genrm_trio.testing.server` (a minimal
    HTTP/1.1 server: the judge's own CPU per call must not stretch the latencies a benchmark
    measures).

    `task_status.started()` reports the bound port (useful with `port=0`). Pass a `SimJudgeApp`
    instead of a config to keep a handle on its calls and counters.
    """
    from genrm_trio.testing.server import serve_h1

    app = config if isinstance(config, SimJudgeApp) else SimJudgeApp(config)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(partial(serve_h1, app, host=host, port=port, backlog=4096))
        task_status.started(bound)


# --- command-line mapping ---------------------------------------------------------------------


def parse_fault_rule(spec: str) -> FaultRule:
    """Parse `KIND[,key=value...]` into a FaultRule (the `--fault` flag of `sim-judge`).

    Keys: match, position, times, status, retry_after, body, delay (seconds), chars. Example:
    `http_500,match=[fail],position=first,times=1`. Values cannot contain commas.
    Raises ValueError with a readable message.
    """
    kind, *pairs = spec.split(",")
    kind = kind.strip()
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault {kind!r}; expected one of {', '.join(FAULT_KINDS)}")
    fields: dict[str, Any] = {}
    names = {
        "match": ("match", str),
        "position": ("position", str),
        "times": ("times", int),
        "status": ("status", int),
        "retry_after": ("retry_after_s", float),
        "body": ("body", str),
        "delay": ("delay_s", float),
        "chars": ("huge_chars", int),
    }
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise ValueError(f"bad fault option {pair!r}; expected one of {', '.join(names)}=…")
        name, convert = names[key]
        try:
            fields[name] = convert(value)
        except ValueError as error:
            raise ValueError(f"bad value for {key}: {value!r}") from error
    return FaultRule(fault=cast(FaultKind, kind), **fields)


def sim_config_from_args(
    *,
    latency_ms: float = 0.0,
    jitter_ms: float = 0.0,
    seed: int = 0,
    fault_rate: float = 0.0,
    fault_kind: str = "http_500",
    faults: Sequence[str] = (),
    api_key: str | None = None,
    record_calls: bool = False,
    sticky_faults: bool = False,
    length_model: str | None = None,
) -> SimConfig:
    """Build a SimConfig from `sim-judge` flags (milliseconds, `--fault` specs). ValueError if bad.

    `record_calls` defaults to False here: a long-running server should not keep every call.
    """
    if fault_kind not in FAULT_KINDS:
        raise ValueError(
            f"unknown fault kind {fault_kind!r}; expected one of {', '.join(FAULT_KINDS)}"
        )
    if length_model is not None and length_model not in LENGTH_PRESETS:
        raise ValueError(
            f"unknown length model {length_model!r}; expected one of {', '.join(LENGTH_PRESETS)}"
        )
    return SimConfig(
        latency_s=latency_ms / 1000.0,
        jitter_s=jitter_ms / 1000.0,
        seed=seed,
        fault_rate=fault_rate,
        fault_kind=cast(FaultKind, fault_kind),
        rules=tuple(parse_fault_rule(spec) for spec in faults),
        api_key=api_key,
        record_calls=record_calls,
        sticky_faults=sticky_faults,
        length_model=None if length_model is None else LENGTH_PRESETS[length_model],
    )
