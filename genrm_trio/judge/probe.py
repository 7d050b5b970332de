"""The start-up probe: before serving, one `GET {base_url}/models` to each judge replica, so a
judge that cannot be reached (a refused port, a TLS certificate not trusted, a wrong token) or
that does not serve the configured model is named in the log at once instead of in the first
failed judge calls; and one line on the proxy variables judge connections do not use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, final

import httpx
import trio

from genrm_trio.config import Settings
from genrm_trio.judge.base import PROBE_LIMIT_S, one_line
from genrm_trio.judge.client import Redactor, transport_error
from genrm_trio.judge.network import NetworkBackend
from genrm_trio.judge.pool import judge_pool
from genrm_trio.judge.tls import proxy_variables_set

# The probe's lines are part of `genrm-trio serve`'s start-up and have always been logged as
# "genrm_trio.serve": operators filter on that name, and so do the tests (caplog).
log = logging.getLogger("genrm_trio.serve")

__all__ = [
    "PROBE_LIMIT_S",
    "ProbeReport",
    "log_proxy_use",
    "probe_judge",
    "served_window",
    "with_context_window",
]

PROBE_IDS_SHOWN: Final = 8
"""At most this many of the judge's model ids are named in the model-mismatch warning."""

PROBE_ID_CHARS: Final = 80
"""Each named id is cut at this many characters."""


def _served_ids(body: bytes) -> list[str] | None:
    """The `id`s of an OpenAI `GET /models` reply (`{"data": [{"id": ...}, ...]}`), if it is one."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    return [
        entry["id"]
        for entry in data
        if isinstance(entry, dict) and isinstance(entry.get("id"), str)
    ]


def served_window(body: bytes, model: object) -> int | None:
    """The context window a `GET /models` reply states, as vLLM and SGLang do (`max_model_len`
    of the entry whose `id` is `model`; of the first entry when no model is configured or none
    has that id), or None."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    entries = [entry for entry in data if isinstance(entry, dict)]
    chosen = next((entry for entry in entries if entry.get("id") == model), None)
    if chosen is None and entries:
        chosen = entries[0]
    window = chosen.get("max_model_len") if chosen is not None else None
    if isinstance(window, int) and not isinstance(window, bool) and window >= 1:
        return window
    return None


def with_context_window(settings: Settings, windows: Sequence[int]) -> Settings:
    """`settings` with `judge.context_tokens` set to the smallest window the probe read, when
    the key is not set (a configured window wins: the operator may keep a margin of their own)."""
    if settings.judge.context_tokens is not None or not windows:
        return settings
    window = min(windows)
    log.info("judge context window: %d tokens (max_model_len from GET /models)", window)
    judge = settings.judge.model_copy(update={"context_tokens": window})
    return settings.model_copy(update={"judge": judge})


def _check_model(settings: Settings, body: bytes) -> None:
    """Warn once when the configured judge model is not one the judge says it serves."""
    model = settings.judge_create_params.get("model")
    if not isinstance(model, str):
        return  # no model configured: the judge picks (or refuses), nothing to compare
    served = _served_ids(body)
    if served is None or model in served:
        return
    key = (
        "judge.model" if settings.judge.model is not None else "genrm_responses_create_params.model"
    )
    shown = ", ".join(repr(name[:PROBE_ID_CHARS]) for name in served[:PROBE_IDS_SHOWN])
    if len(served) > PROBE_IDS_SHOWN:
        shown += f", … ({len(served) - PROBE_IDS_SHOWN} more)"
    log.warning(
        "judge probe: %s %r is not among the models the judge serves (%s); judge calls naming "
        "it will likely fail",
        key,
        model[:PROBE_ID_CHARS],
        shown or "none",
    )


@final
@dataclass(frozen=True, slots=True)
class ProbeReport:
    """What the start-up probe found: whether every replica answered 2xx, and the base URLs
    whose connection could not be opened (refused, a name that does not resolve): those are
    down from the start (`JudgeFleet.down_from_start`)."""

    answered: bool
    unreachable: tuple[str, ...] = ()
    # the context window each replica that answered states (`served_window`), for
    # `with_context_window`
    windows: tuple[int, ...] = ()


async def probe_judge(
    settings: Settings, token: str | None, *, backend: NetworkBackend | None = None
) -> ProbeReport:
    """The start-up probe (docs/configuration.md, "Command line"): one `GET {base_url}/models`
    per replica; a failure only warns (a replica that cannot be connected to is down from the
    start: the caller tells the fleet).

    Bounded by min(5 s, judge_request_timeout_s); a fleet's replicas are probed concurrently.
    Never POSTs and is not a judge call in any metric. Reports whether every replica answered 2xx.
    A 2xx listing models (`data[].id`) that does not include the configured model (`judge.model`,
    else a `model` in `genrm_responses_create_params`) logs one warning naming it and the served
    ids. Skipped (False) with `judge.probe: false`.
    """
    urls = settings.judge.base_urls
    if not urls:
        return ProbeReport(answered=False)
    if not settings.judge.probe:
        log.info("judge %s: not probed (judge.probe: false)", ", ".join(urls))
        return ProbeReport(answered=False)
    answered: list[bool] = []
    unreachable: list[str] = []
    windows: list[int] = []
    async with trio.open_nursery() as nursery:
        for base_url in urls:
            nursery.start_soon(
                _probe_one, settings, token, base_url, answered, unreachable, backend, windows
            )
    return ProbeReport(
        answered=len(answered) == len(urls) and all(answered),
        unreachable=tuple(url for url in urls if url in unreachable),
        windows=tuple(windows),
    )


async def _probe_one(
    settings: Settings,
    token: str | None,
    base_url: str,
    answered: list[bool],
    unreachable: list[str],
    backend: NetworkBackend | None,
    windows: list[int],
) -> None:
    # The probe goes through a pool made as the judge calls' own are (`judge_pool`: TLS trust
    # from judge.ca_file or SSL_CERT_FILE/SSL_CERT_DIR, the reply cap), so that it fails where
    # and as they would. httpx parses the URL and names the failures, as for the calls.
    url = base_url.rstrip("/") + "/models"
    target = httpx.URL(url)
    limit = min(PROBE_LIMIT_S, settings.judge_request_timeout_s)
    headers = [
        (b"host", target.netloc),
        (b"accept", b"application/json"),
        (b"accept-encoding", b"identity"),
        (b"connection", b"close"),
    ]
    if token is not None:
        headers.append((b"authorization", b"Bearer " + token.encode("latin-1")))
    pool = judge_pool(base_url, settings.judge, backend=backend)
    problem: str
    try:
        with trio.fail_after(limit):
            status, _, body = await pool.exchange((b"GET", target.raw_path, headers, b""))
    except trio.TooSlowError:
        problem = f"TimeoutError: no reply within {limit:g}s"
    except httpx.HTTPError as exc:
        # named as a judge call's failure would be, and redacted as one
        error = transport_error(exc, Redactor(token))
        problem = error.describe()
        if not error.reached:
            unreachable.append(base_url)
    else:
        if 200 <= status <= 299:
            log.info("judge probe GET %s: HTTP %d", url, status)
            _check_model(settings, body)
            window = served_window(body, settings.judge_create_params.get("model"))
            if window is not None:
                windows.append(window)
            answered.append(True)
            return
        problem = f"HTTP {status}"
    finally:
        # bounded: the probe's pool close drops its connection; one second caps it anyway
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
            await pool.aclose()
    log.warning("judge probe GET %s failed: %s; serving anyway", url, one_line(problem, 500))
    answered.append(False)


def log_proxy_use() -> None:
    """One start-up line on proxies: genrm-trio connects to the judge directly and does not use
    HTTP_PROXY / HTTPS_PROXY / ALL_PROXY (a WARNING when one is set, so nobody relies on it)."""
    names = proxy_variables_set()
    if names:
        log.warning(
            "judge: connecting directly; the proxy variables %s are set but not used "
            "(genrm-trio does not go through HTTP proxies)",
            ", ".join(names),
        )
    else:
        log.info("judge: connecting directly (proxy variables are not used)")
