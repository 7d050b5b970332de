"""The simulated judge's rate limits, as a hosted API enforces them (`genrm-trio sim-judge --rpm
--tpm`): token buckets of a minute's requests and tokens, charged when a call arrives (one request;
its prompt tokens plus its `max_tokens`, as OpenAI counts them), 429 when either is short, and the
`x-ratelimit-*` headers on every reply. How a 429 says when to come back is chosen
(`RETRY_AFTER_FORMS`): `retry-after` seconds, `retry-after-ms`, `retry-after` as an HTTP date,
only the `x-ratelimit-reset-*` headers, or nothing at all (a bare 429).
"""

from __future__ import annotations

import email.utils
import math
import time
from dataclasses import dataclass
from typing import Final, Literal, assert_never, final, get_args

import trio

from genrm_trio.domain.ratelimit import CallBuckets, TokenBucket, format_duration

__all__ = ["RETRY_AFTER_FORMS", "RetryAfterForm", "SimLimiter", "SimRateLimits"]

RetryAfterForm = Literal["seconds", "ms", "date", "reset", "none"]
RETRY_AFTER_FORMS: Final[tuple[RetryAfterForm, ...]] = get_args(RetryAfterForm)

RATE_LIMITED_BODY: Final = (
    b'{"error": {"message": "Rate limit reached; please try again later.", '
    b'"type": "requests", "code": "rate_limit_exceeded"}}'
)


@final
@dataclass(frozen=True, slots=True)
class SimRateLimits:
    """A hosted judge's limits: `requests_per_minute` and `tokens_per_minute` (None: none of
    that kind); `headers`: send the `x-ratelimit-*` headers (on every reply and on a 429);
    `retry_after`: how a 429 says when (`RETRY_AFTER_FORMS`)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    headers: bool = True
    retry_after: RetryAfterForm = "seconds"

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 (or None: no limit)")
        if self.retry_after not in RETRY_AFTER_FORMS:
            raise ValueError(f"retry_after must be one of {RETRY_AFTER_FORMS}")


@final
class SimLimiter:
    """The buckets of one simulated judge (`SimRateLimits`), in trio's clock."""

    def __init__(self, limits: SimRateLimits) -> None:
        now = trio.current_time()
        self.limits = limits
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        self._buckets = CallBuckets(
            None if rpm is None else TokenBucket.per_minute(rpm, now),
            None if tpm is None else TokenBucket.per_minute(tpm, now),
        )
        self.refused = 0  # 429 replies
        self.admitted = 0
        self.tokens_admitted = 0
        self.first_admitted: float | None = None  # trio time of the first call served
        self.last_admitted: float | None = None

    def admit(self, tokens: int) -> tuple[bool, list[tuple[bytes, bytes]]]:
        """(whether a call of `tokens` is served, the headers of its reply)."""
        now = trio.current_time()
        wait = self._buckets.wait(tokens, now)
        served = wait <= 0.0
        if served:
            self.admitted += 1
            self.tokens_admitted += tokens
            if self.first_admitted is None:
                self.first_admitted = now
            self.last_admitted = now
            self._buckets.take(tokens, now)
        else:
            self.refused += 1
        headers = self._headers(now) if self.limits.headers else []
        if not served:
            headers += self._retry_after(wait)
        return served, headers

    def _headers(self, now: float) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        buckets = self._buckets
        for kind, bucket in ((b"requests", buckets.requests), (b"tokens", buckets.tokens)):
            if bucket is None:
                continue
            bucket.refill(now)
            left = max(0, math.floor(bucket.level))
            full_in = (bucket.capacity - bucket.level) / bucket.rate
            headers += [
                (b"x-ratelimit-limit-" + kind, b"%d" % int(bucket.capacity)),
                (b"x-ratelimit-remaining-" + kind, b"%d" % left),
                (b"x-ratelimit-reset-" + kind, format_duration(full_in).encode()),
            ]
        return headers

    def _retry_after(self, wait: float) -> list[tuple[bytes, bytes]]:
        form = self.limits.retry_after
        match form:
            case "seconds":
                return [(b"retry-after", b"%d" % max(1, math.ceil(wait)))]
            case "ms":
                return [(b"retry-after-ms", b"%d" % math.ceil(wait * 1000))]
            case "date":
                when = email.utils.formatdate(time.time() + math.ceil(wait), usegmt=True)
                return [(b"retry-after", when.encode())]
            case "reset" | "none":
                return []
            case _:
                assert_never(form)
