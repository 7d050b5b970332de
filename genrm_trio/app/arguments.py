"""What every `genrm-trio` command shares: the program name, its one-line stderr messages, the
server URL the client commands default to, the metavars of flag values, the argparse types
of numeric flags (each rejects a value with a message saying what it takes; cli.py's parser
reports it as a usage error: the command's usage line, then `genrm-trio COMMAND: error: argument
--flag: message`), and `write_atomically` for the files the commands write."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_SERVER_URL",
    "METAVARS",
    "PROG",
    "finite_number",
    "non_negative",
    "port_number",
    "positive",
    "positive_int",
    "probability",
    "say",
    "seconds_within",
    "write_atomically",
]

PROG: Final = "genrm-trio"
DEFAULT_SERVER_URL: Final = "http://127.0.0.1:8100"
"""Where `top`, `bench` and `checkpoint` find the server without `--url` (serve's default port)."""
METAVARS: Final = frozenset(
    {
        "URL",
        "FILE",
        "HOST",
        "PORT",
        "HOST:PORT",
        "NAME",
        "N",
        "SECONDS",
        "MS",
        "DURATION",
        "FRACTION",
        "NUMBER",
        "RATE",
        "PID",
        "VAR",
        "KIND[,KEY=VALUE...]",
    }
)
"""One metavar style for every command: a flag's value is named by its kind (`--api-key-env VAR`
wherever it appears); tests/test_cli.py holds every flag to this vocabulary."""


def say(line: str) -> None:
    """One line on stderr, prefixed with the program name."""
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None


def _int(value: str, what: str = "an integer") -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {value!r}") from None


def port_number(value: str) -> int:
    number = _int(value, "a port number")
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535 (0 picks a free port), got {number}")
    return number


def positive_int(value: str) -> int:
    number = _int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def finite_number(value: str) -> float:
    number = _float(value)
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {value}")
    return number


def non_negative(value: str) -> float:
    number = _float(value)
    if not (math.isfinite(number) and number >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return number


def positive(value: str) -> float:
    number = _float(value)
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return number


def probability(value: str) -> float:
    """A probability: a number within [0, 1]."""
    number = non_negative(value)
    if number > 1:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {value}")
    return number


def seconds_within(low: float, high: float) -> Callable[[str], float]:
    """A number of seconds within [low, high]."""

    def seconds(value: str) -> float:
        number = _float(value)
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(
                f"must be within [{low:g}, {high:g}] seconds, got {value}"
            )
        return number

    return seconds


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` whole: a reader (or a crash) sees the old file
    or the new one, never a part (a temporary file beside it, flushed to disk, then renamed)."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
