"""Rate limits, pure: the rate-limit headers of a judge's reply and the token bucket that paces
calls (docs/configuration.md, "A judge with rate limits"). No clock of its own: every function
takes the time it works at, so the judge's limiter (judge/limits.py) and the simulated judge
(testing/ratelimit.py) run the same arithmetic in trio's clock, real or virtual.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

__all__ = [
    "CallBuckets",
    "RateLimitHeaders",
    "TokenBucket",
    "format_duration",
    "parse_duration",
    "parse_rate_limit_headers",
    "parse_retry_after",
]

_UNIT_SECONDS: Final = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|h|m|s)")

RATE_LIMIT_PREFIX: Final = b"x-ratelimit-"
_ROUNDING: Final = 1e-9


def parse_duration(text: str | None) -> float | None:
    """Seconds of an OpenAI reset header: a Go-style duration ("1s", "6m0s", "20ms", "1h2m3.5s")
    or a plain number of seconds; None when absent or unreadable."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    total = 0.0
    at = 0
    for match in _PART.finditer(text):
        if match.start() != at:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        at = match.end()
    return total if at == len(text) and at > 0 else None


def format_duration(seconds: float) -> str:
    """`seconds` as OpenAI writes a reset header: "20ms" below a second, else "1s", "6m0s"."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    rest_text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{rest_text}s" if minutes else f"{rest_text}s"


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date, against the
    wall-clock time `now` (epoch seconds); None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


@final
@dataclass(frozen=True, slots=True)
class RateLimitHeaders:
    """What one reply said of the judge's rate limits (every field None when not said)."""

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None  # until the request budget is full again
    reset_tokens_s: float | None = None
    retry_after_s: float | None = None  # retry-after-ms, else retry-after

    def exhausted_for(self) -> float | None:
        """Seconds until a budget that this reply says is spent (remaining 0) is refilled, the
        longer of the two; None when neither is spent or says when."""
        waits = [
            reset
            for remaining, reset in (
                (self.remaining_requests, self.reset_requests_s),
                (self.remaining_tokens, self.reset_tokens_s),
            )
            if remaining == 0 and reset is not None
        ]
        return max(waits) if waits else None


def parse_rate_limit_headers(
    headers: Sequence[tuple[bytes, bytes]], *, now: float
) -> RateLimitHeaders | None:
    """The rate-limit headers of a raw header list (names in any case): OpenAI's
    `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, `retry-after-ms` and `retry-after`
    (`now`: the wall clock, for an HTTP date). None when the reply carries none of them, so a
    judge that sends none (vLLM) costs one pass over its headers."""
    found: dict[bytes, str] = {}
    for name, value in headers:
        lower = name.lower()
        if lower.startswith(RATE_LIMIT_PREFIX) or lower in (b"retry-after", b"retry-after-ms"):
            found.setdefault(lower, value.decode("latin-1"))
    if not found:
        return None
    retry_ms = _count(found.get(b"retry-after-ms"))
    retry_after = (
        retry_ms / 1000.0
        if retry_ms is not None
        else parse_retry_after(found.get(b"retry-after"), now=now)
    )
    return RateLimitHeaders(
        limit_requests=_count(found.get(b"x-ratelimit-limit-requests")),
        limit_tokens=_count(found.get(b"x-ratelimit-limit-tokens")),
        remaining_requests=_count(found.get(b"x-ratelimit-remaining-requests")),
        remaining_tokens=_count(found.get(b"x-ratelimit-remaining-tokens")),
        reset_requests_s=parse_duration(found.get(b"x-ratelimit-reset-requests")),
        reset_tokens_s=parse_duration(found.get(b"x-ratelimit-reset-tokens")),
        retry_after_s=retry_after,
    )


@final
class TokenBucket:
    """A token bucket: `capacity` tokens, refilled at `rate` per second, starting full.

    A cost above the capacity is granted when the bucket is full and leaves it below zero, so
    that one call larger than a minute's budget waits its share instead of forever."""

    __slots__ = ("at", "capacity", "level", "rate")

    def __init__(self, capacity: float, rate: float, now: float) -> None:
        if capacity <= 0 or rate <= 0:
            raise ValueError("a token bucket needs a capacity and a rate above 0")
        self.capacity = capacity
        self.rate = rate
        self.level = capacity
        self.at = now

    @classmethod
    def per_minute(cls, limit: float, now: float) -> TokenBucket:
        """A per-minute limit: `limit` tokens, refilled over a minute (OpenAI's model)."""
        return cls(limit, limit / 60.0, now)

    def refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
            self.at = now

    def wait(self, cost: float, now: float) -> float:
        """Seconds from `now` until `cost` can be taken (0: now)."""
        self.refill(now)
        need = min(cost, self.capacity) - self.level
        # within rounding of the clock's floats, it is there: a client and a server that
        # computed the same refill must agree
        return 0.0 if need <= _ROUNDING * self.capacity else need / self.rate

    def take(self, cost: float, now: float) -> None:
        self.refill(now)
        self.level -= cost

    def set_level(self, level: float, now: float) -> None:
        """What the server says is left (a reply's remaining budget), as of `now`."""
        self.refill(now)
        self.level = min(self.capacity, level)


@final
class CallBuckets:
    """The buckets a call is charged to: one request from `requests`, its tokens from `tokens`
    (None: no limit of that kind). The judge's limiter keeps one for the configured limits and
    one per replica (learned from its headers); the simulated judge one for what it enforces."""

    __slots__ = ("requests", "tokens")

    def __init__(
        self, requests: TokenBucket | None = None, tokens: TokenBucket | None = None
    ) -> None:
        self.requests = requests
        self.tokens = tokens

    def wait(self, tokens: int | None, now: float) -> float:
        """Seconds from `now` until a call of `tokens` fits both buckets (0: now); `tokens`
        None: its tokens are not counted (the request alone)."""
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.wait(1, now)
        if self.tokens is not None and tokens is not None:
            wait = max(wait, self.tokens.wait(tokens, now))
        return wait

    def take(self, tokens: int, now: float) -> None:
        """Charge a call of `tokens`."""
        if self.requests is not None:
            self.requests.take(1, now)
        if self.tokens is not None:
            self.tokens.take(tokens, now)
