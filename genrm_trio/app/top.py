"""`genrm-trio top [--url URL]`: a live terminal view of one running server (docs/operations.md,
"Watching it").

Each tick `fetch` reads `/metrics`, `/cohorts` and `/judge/replicas` (with the bearer token of
`--api-key-env` when given) into a `Snapshot`, or a `FetchFailed` naming why not; `top_frame`
turns the snapshots into a frame. On a terminal the frame is redrawn in place (rich `Live`, the
alternate screen); otherwise each frame is printed after the last, like `top -b`. Ctrl-C leaves
with exit code 0. `--once` samples twice, `--interval` apart, and prints one frame with the rates
between the two samples; exit 0 if the server answered, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any, Final

import httpx
from rich.console import Console, RenderableType
from rich.live import Live

from genrm_trio.app.arguments import DEFAULT_SERVER_URL, say, seconds_within
from genrm_trio.app.top_frame import FetchFailed, Snapshot, Watcher, frame, parse_metrics
from genrm_trio.domain.text import printable, printable_lines

__all__ = ["MAX_REPLY_BYTES", "add_top_arguments", "fetch", "run_top"]

MAX_REPLY_BYTES: Final = 64 * 2**20
"""The most of one reply top reads (`/cohorts` of a full server is a few MiB)."""
REQUEST_TIMEOUT_S: Final = 5.0
_REASON_CHARS: Final = 300


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_SERVER_URL, metavar="URL", help="server base URL")
    parser.add_argument(
        "--api-key-env", metavar="VAR", help="variable holding the server's bearer token"
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        type=seconds_within(0.1, 3600),
        default=1.0,
        help="seconds between frames (with --once: between its two samples)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print one frame and exit (0 if the server answered)"
    )


class _Refused(Exception):
    """A reply top cannot use; its message is the frame's reason."""


def _get(client: httpx.Client, path: str) -> bytes:
    with client.stream("GET", path) as response:
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_REPLY_BYTES:
                raise _Refused(f"{path}: reply larger than {MAX_REPLY_BYTES} bytes")
        if response.status_code != 200:
            detail = bytes(body[:_REASON_CHARS]).decode("utf-8", "replace")
            try:
                parsed = json.loads(body)
            except ValueError:
                pass
            else:
                if isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
                    detail = parsed["detail"][:_REASON_CHARS]
            hint = " (give --api-key-env)" if response.status_code == 401 else ""
            raise _Refused(f"{path}: HTTP {response.status_code}: {detail}{hint}")
        return bytes(body)


def _printable_json(value: Any) -> Any:
    """`value` with every string in it (keys too) `printable`: a client's group id or a judge's
    error text must not reach the operator's terminal as escape sequences."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [_printable_json(item) for item in value]
    if isinstance(value, dict):
        return {printable(str(k)): _printable_json(v) for k, v in value.items()}
    return value


def _json_list(path: str, data: bytes) -> list[dict[str, Any]]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise _Refused(f"{path}: the reply is not JSON") from None
    if not (isinstance(value, list) and all(isinstance(item, dict) for item in value)):
        raise _Refused(f"{path}: the reply is not a list of objects")
    return [_printable_json(item) for item in value]


def fetch(
    client: httpx.Client, clock: Callable[[], float] = time.monotonic
) -> Snapshot | FetchFailed:
    """One look at the server behind `client` (its base_url): never raises for what the server
    or the network does."""
    at = clock()
    try:
        metrics = _get(client, "/metrics")
        cohorts = _json_list("/cohorts", _get(client, "/cohorts"))
        replicas = _json_list("/judge/replicas", _get(client, "/judge/replicas"))
        text = printable_lines(metrics.decode("utf-8", "replace"))
        try:
            series = parse_metrics(text)
        except ValueError as exc:
            raise _Refused(f"/metrics: not Prometheus text ({exc})") from None
    except _Refused as exc:
        return FetchFailed(at, printable(str(exc)))
    except httpx.HTTPError as exc:
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        where = str(client.base_url).rstrip("/")
        return FetchFailed(at, printable(f"cannot reach {where}: {reason}"[:_REASON_CHARS]))
    return Snapshot(at, series, cohorts, replicas)


def open_client(url: str, token: str | None) -> httpx.Client:
    headers = {"accept": "application/json, text/plain"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return httpx.Client(
        base_url=url.rstrip("/"),
        headers=headers,
        timeout=REQUEST_TIMEOUT_S,
        trust_env=False,
        follow_redirects=False,
    )


def run_top(args: argparse.Namespace) -> int:
    """Run `genrm-trio top`; returns the exit code."""
    token: str | None = None
    if args.api_key_env:
        token = os.environ.get(args.api_key_env, "")
        if not token:
            say(f"top: environment variable {args.api_key_env} is unset or empty")
            return 2
    url: str = args.url
    if not url.startswith(("http://", "https://")):
        say(f"top: --url must start with http:// or https://, got {url!r}")
        return 2
    console = Console()
    watcher = Watcher(url)
    try:
        with open_client(url, token) as client:

            def tick() -> tuple[RenderableType, bool]:
                result = fetch(client)
                return frame(watcher.update(result, time.time())), isinstance(result, Snapshot)

            if args.once:
                # two samples --interval apart, so that the frame has rates; one when the first
                # finds the server down
                shown, answered = tick()
                if answered:
                    time.sleep(args.interval)
                    shown, answered = tick()
                console.print(shown)
                return 0 if answered else 1
            next_at = time.monotonic()
            if console.is_terminal:
                with Live(console=console, screen=True, auto_refresh=False) as live:
                    while True:
                        live.update(tick()[0], refresh=True)
                        next_at = _sleep_until(next_at + args.interval)
            while True:
                console.print(tick()[0])
                console.rule()
                next_at = _sleep_until(next_at + args.interval)
    except KeyboardInterrupt:
        return 0


def _sleep_until(deadline: float) -> float:
    """Sleep until `deadline` (monotonic); a late tick starts the next interval from now."""
    now = time.monotonic()
    if deadline <= now:
        return now
    time.sleep(deadline - now)
    return deadline
