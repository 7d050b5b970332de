"""Real `genrm-trio` processes for tests and benchmarks: start one, read its `listening on`
line, signal it, stop it by its PID.

One harness for both (tests/procs.py, benchmarks/run_suite.py and benchmarks/soak.py build on
it). A process's stderr goes to a file, so a caller can scrape everything it logged; its stdout
is a pipe whose first line is `listening on http://HOST:PORT`. Synchronous: call it through
`trio.to_thread.run_sync` from async code. Every wait is bounded.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["START_TIMEOUT_S", "Proc", "StartError", "command", "start", "terminate"]

START_TIMEOUT_S: Final = 30.0
_LISTENING: Final = "listening on http://"


class StartError(RuntimeError):
    """The process exited, or printed something else, before its listening line."""


def command() -> list[str]:
    """How to run `genrm-trio` from this interpreter's environment."""
    script = Path(sys.executable).with_name("genrm-trio")
    if script.exists():
        return [str(script)]
    found = shutil.which("genrm-trio")
    return [found] if found else [sys.executable, "-m", "genrm_trio.app.cli"]


@dataclass
class Proc:
    """One started process: its `listening on` URL and the file its stderr goes to."""

    popen: subprocess.Popen[bytes]
    url: str
    stderr_path: Path
    stdout_extra: list[bytes] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def port(self) -> int:
        return int(self.url.rpartition(":")[2])

    def log(self) -> str:
        """Everything the process wrote to stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    def stdout_rest(self) -> bytes:
        """Whatever stdout holds after the listening line (read once the process ended)."""
        assert self.popen.stdout is not None
        if self.popen.poll() is not None:
            self.stdout_extra.append(self.popen.stdout.read())
        return b"".join(self.stdout_extra)

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for the exit code; SIGKILL after `timeout` (the code is then
        negative: -9)."""
        return terminate(self.popen, timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=15)

    def close(self) -> None:
        """Kill if still running and close the pipe (idempotent)."""
        self.kill()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def terminate(popen: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """Stop a process started here by its PID: SIGTERM, SIGKILL after `timeout`; its exit code
    (negative for a signal: -9 when it had to be killed). Any process a test or benchmark
    starts, `genrm-trio` or not (a busy loop, py-spy, the reference server)."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
    try:
        return popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait(timeout=15)


def _read_listening_line(popen: subprocess.Popen[bytes], timeout: float) -> str:
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    buffer = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StartError(f"no listening line within {timeout}s (got {buffer!r})")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise StartError(f"process exited before listening (rc={popen.wait(5)})")
        buffer += chunk
    line = buffer.partition(b"\n")[0].decode(errors="replace")
    if not line.startswith(_LISTENING):
        raise StartError(f"unexpected first line {line!r}")
    return line.removeprefix("listening on ")


def start(
    args: Sequence[str],
    log_path: Path,
    *,
    program: Sequence[str] | None = None,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = START_TIMEOUT_S,
) -> Proc:
    """Run `PREFIX PROGRAM ARGS` (PROGRAM defaults to `genrm-trio`, PREFIX to nothing, e.g.
    `taskset -c 0`) and wait for its `listening on http://H:P` line; stderr is appended to
    `log_path`. A process that does not get there is killed, and StartError raised."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [*prefix, *(program or command()), *args]
    with log_path.open("ab") as err:
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=full_env, cwd=cwd)
    try:
        url = _read_listening_line(popen, timeout)
    except BaseException:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=15)
        assert popen.stdout is not None
        popen.stdout.close()
        raise
    return Proc(popen, url, log_path)
