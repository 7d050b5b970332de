"""The simulator's shared core: its configuration, the calls it saw and its counters, and the
per-call decision (latency, fault, output tokens needed) that every front end acts on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, final

import trio

from genrm_trio.config import JudgeApiName
from genrm_trio.judge.base import JudgeCall
from genrm_trio.testing.faults import FAULT_KINDS, FaultKind, FaultRule
from genrm_trio.testing.judgment import JudgmentModel, call_key, judged_verdict, latent_quality
from genrm_trio.testing.ratelimit import SimLimiter, SimRateLimits
from genrm_trio.testing.verdicts import LengthModel, answer_digest, forced_need, normal_from_digest

__all__ = ["Api", "SimCall", "SimConfig", "SimStatistics", "context_refusal"]

Api = Literal["in_process"] | JudgeApiName
"""How a call reached the simulator: in process, or over HTTP by one of the judge APIs."""

DEFAULT_BUDGET_TOKENS: Final = 16384
_OCCURRENCE_CAP: Final = 65536


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
    `capacity`, when set, is how many calls are served at once, like a saturated vLLM fleet
    (`max_num_seqs` x replicas): a call's latency runs only while it is served, and the calls
    beyond the capacity wait first-in first-out (a caller that hangs up leaves the queue).
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
    capacity: int | None = None  # calls served at once; None: every call at once
    judgment: JudgmentModel | None = None  # noisy verdicts from latent qualities (testing.judgment)
    rate_limits: SimRateLimits | None = None  # a hosted API's limits (testing.ratelimit)
    # vLLM's max_model_len: a call whose prompt tokens plus output budget exceed it gets vLLM's
    # HTTP 400 (`context_refusal`), and GET /v1/models reports it (None: no window)
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.length_model is not None and not isinstance(self.length_model, LengthModel):
            raise TypeError(f"length_model must be a LengthModel, got {self.length_model!r}")
        if self.judgment is not None and not isinstance(self.judgment, JudgmentModel):
            raise TypeError(f"judgment must be a JudgmentModel, got {self.judgment!r}")
        for name in ("latency_s", "jitter_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.capacity is not None and (type(self.capacity) is not int or self.capacity < 1):
            raise ValueError("capacity must be an integer >= 1 (or None: unlimited)")
        if self.context_tokens is not None and (
            type(self.context_tokens) is not int or self.context_tokens < 1
        ):
            raise ValueError("context_tokens must be an integer >= 1 (or None: no window)")
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
    capacity: int | None = None  # SimConfig.capacity
    serving: int = 0  # calls being served now (at most `capacity`)
    max_serving: int = 0
    queued: int = 0  # calls waiting for a place (with a capacity)
    max_queued: int = 0
    busy_s: float = 0.0  # call-seconds served: utilisation = busy_s / (capacity x elapsed)
    hang_ups: int = 0  # calls whose caller went away before the answer (queued or served)
    rate_limited: int = 0  # calls answered 429 by the rate limits (not in `calls`)
    # with rate limits: the tokens the calls served were charged (prompt + max_tokens), and the
    # seconds from the first served call to the last (what a throughput is measured over)
    limited_tokens: int = 0
    limited_span_s: float = 0.0
    overflows: int = 0  # calls refused for the context window (`SimConfig.context_tokens`)


def token_count(text_length: int) -> int:
    return text_length // 4


def context_refusal(window: int, prompt_tokens: int, max_tokens: int | None) -> str | None:
    """vLLM's message refusing a request that does not fit its context window `window`
    (vLLM's texts, `vllm/entrypoints/openai/serving_engine.py`), or None when it fits. A
    request without an output budget gets what is left of the window, as in vLLM."""
    if max_tokens is None:
        if prompt_tokens < window:
            return None
        return (
            f"This model's maximum context length is {window} tokens. However, your request "
            f"has {prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
    if prompt_tokens + max_tokens <= window:
        return None
    return (
        f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
        f"maximum context length is {window} tokens and your request has {prompt_tokens} "
        f"input tokens ({max_tokens} > {window} - {prompt_tokens})."
    )


# --- the shared core --------------------------------------------------------------------------


@dataclass(slots=True)
class Decision:
    """What the simulator does with one call: when to answer and which fault (if any)."""

    delay_s: float
    fault: FaultKind | None
    rule: FaultRule
    need: int | None = None  # output tokens the verdict needs; None: any budget suffices
    verdict: tuple[int, int, int] | None = None  # the noisy judgment's; None: sim_verdict's


class SimCore:
    """Call recording, fault selection, seeded draws and counters, shared by every front end."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.calls: list[SimCall] = []
        self._rule_uses = [0] * len(config.rules)
        self._occurrences: dict[bytes, int] = {}
        self._pair_attempts: dict[bytes, int] = {}
        self._judged: dict[bytes, int] = {}  # judgment mode: times each shown content was judged
        self._random_rule = FaultRule(fault=config.fault_kind)
        self.n_calls = 0
        self.faults_by_kind: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.bad_requests = 0
        self.exhausted = 0
        self.overflows = 0
        self._places = None if config.capacity is None else trio.CapacityLimiter(config.capacity)
        self.serving = 0
        self.max_serving = 0
        self.queued = 0
        self.max_queued = 0
        self.busy_s = 0.0
        self.hang_ups = 0
        self._limiter: SimLimiter | None = None  # made in trio's clock, at the first call

    def rate_limit(self, call: JudgeCall) -> tuple[bool, list[tuple[bytes, bytes]]] | None:
        """With rate limits: whether `call` is served and its reply's rate-limit headers. It
        costs one request and its prompt tokens plus its budget (`max_output_tokens`, 0 when not
        given), as OpenAI charges them."""
        limits = self.config.rate_limits
        if limits is None:
            return None
        if self._limiter is None:
            self._limiter = SimLimiter(limits)
        tokens = token_count(prompt_length(call)) + (call.max_output_tokens or 0)
        return self._limiter.admit(tokens)

    def _need(self, call: JudgeCall) -> int | None:
        """Output tokens this call's verdict needs, or None (no length model, no marker)."""
        model = self.config.length_model
        if model is None and "[need=" not in call.response_1 and "[need=" not in call.response_2:
            return None  # skip the hashing and the attempt table
        # the unordered pair with its context: position_balance does not change the difficulty
        answers = sorted((answer_digest(call.response_1), answer_digest(call.response_2)))
        content = hashlib.sha256(b"".join(answers))
        content.update(answer_digest(call.principle or ""))
        for message in call.history:
            content.update(answer_digest(message.get("role", "")))
            content.update(answer_digest(message.get("content", "")))
        pair = content.digest()
        if len(self._pair_attempts) >= _OCCURRENCE_CAP and pair not in self._pair_attempts:
            self._pair_attempts.clear()
        attempt = self._pair_attempts.get(pair, 0)
        self._pair_attempts[pair] = attempt + 1
        forced = forced_need(call.response_1, call.response_2, attempt)
        if forced is not None or model is None:
            return forced
        seed = f"{self.config.seed}\0length\0".encode()
        z_pair = normal_from_digest(hashlib.sha256(seed + pair).digest())
        z_attempt = normal_from_digest(hashlib.sha256(seed + pair + b"%d" % attempt).digest())
        return model.need(z_pair, z_attempt)

    def _judgment(self, call: JudgeCall) -> tuple[int, int, int] | None:
        """The noisy judgment's verdict for this call (`SimConfig.judgment`), else None."""
        model = self.config.judgment
        if model is None:
            return None
        key = call_key(call)
        if len(self._judged) >= _OCCURRENCE_CAP and key not in self._judged:
            self._judged.clear()
        occurrence = self._judged.get(key, 0)
        self._judged[key] = occurrence + 1
        seed = self.config.seed
        q_first = latent_quality(seed, call.response_1)
        q_second = latent_quality(seed, call.response_2)
        return judged_verdict(model, seed, key, occurrence, q_first, q_second)

    def _draws(self, call: JudgeCall) -> tuple[float, float]:
        """Two seeded uniforms in [0, 1) for this call: (fault, jitter)."""
        if self.config.fault_rate == 0 and self.config.jitter_s == 0:
            return 1.0, 0.0  # nothing is drawn: skip the hashing and the occurrence table
        key = call_key(call)  # the same digest the judgment mode draws from
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

    def begin(self, call: JudgeCall, api: Api) -> Decision:
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
        chosen = rule if rule is not None else self._random_rule
        return Decision(delay, fault, chosen, need, self._judgment(call))

    async def serve(self, delay_s: float) -> None:
        """Wait `delay_s` while served: with a capacity, first wait for a place (FIFO: trio's
        CapacityLimiter wakes its waiters in order). A cancelled call counts as a hang-up."""
        try:
            if self._places is None:
                await self._served(delay_s)
                return
            self.queued += 1
            self.max_queued = max(self.max_queued, self.queued)
            try:
                await self._places.acquire()
            finally:
                self.queued -= 1
            try:
                await self._served(delay_s)
            finally:
                self._places.release()
        except trio.Cancelled:
            self.hang_ups += 1
            raise

    async def _served(self, delay_s: float) -> None:
        self.serving += 1
        self.max_serving = max(self.max_serving, self.serving)
        started = trio.current_time()
        try:
            await trio.sleep(delay_s)
        finally:
            self.serving -= 1
            self.busy_s += trio.current_time() - started

    def cut_off(self, decision: Decision, budget: int) -> bool:
        """Whether a verdict reply runs out of `budget` before its verdict (and count it)."""
        if decision.need is None or decision.need <= budget:
            return False
        self.exhausted += 1
        return True

    def end(self) -> None:
        self.in_flight -= 1

    def statistics(self) -> SimStatistics:
        limiter = self._limiter
        span = 0.0
        if limiter is not None and limiter.first_admitted is not None:
            assert limiter.last_admitted is not None
            span = limiter.last_admitted - limiter.first_admitted
        return SimStatistics(
            calls=self.n_calls,
            faults=sum(self.faults_by_kind.values()),
            faults_by_kind=dict(self.faults_by_kind),
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            bad_requests=self.bad_requests,
            exhausted=self.exhausted,
            overflows=self.overflows,
            capacity=self.config.capacity,
            serving=self.serving,
            max_serving=self.max_serving,
            queued=self.queued,
            max_queued=self.max_queued,
            busy_s=self.busy_s,
            hang_ups=self.hang_ups,
            rate_limited=0 if limiter is None else limiter.refused,
            limited_tokens=0 if limiter is None else limiter.tokens_admitted,
            limited_span_s=span,
        )


def prompt_length(call: JudgeCall) -> int:
    return (
        sum(len(message.get("content", "")) for message in call.history)
        + len(call.principle or "")
        + len(call.response_1)
        + len(call.response_2)
    )
