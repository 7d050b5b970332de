"""The state file's lock (an exclusive `flock`, taken by `open_store`): which process holds it,
and a check that a server runs before it starts anything else.

A second server on the same `--state` file must stop with one line before it logs its start-up
report or probes its judge, and the line must say who holds the file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Final

from genrm_trio.store.errors import StoreError

__all__ = ["IN_USE", "check_not_in_use", "in_use_message", "lock_holder"]

IN_USE: Final = "in use by another genrm-trio process"
_COMMAND_CHARS: Final = 160


def lock_holder(path: str, locks: str | None = None) -> int | None:
    """The PID holding a `flock` on `path`, from /proc/locks (`locks`: its text, for tests);
    None when no holder is listed or the system has no /proc/locks."""
    try:
        stat = os.stat(path)
        text = Path("/proc/locks").read_text() if locks is None else locks
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; "1: -> FLOCK ..." is a waiter
    wanted = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def in_use_message(path: str, locks: str | None = None) -> str:
    """`in use by another genrm-trio process`, with the holder's PID and command line when the
    system tells them."""
    pid = lock_holder(path, locks)
    if pid is None:
        return IN_USE
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return f"{IN_USE} (pid {pid})"
    command = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    if len(command) > _COMMAND_CHARS:
        command = command[: _COMMAND_CHARS - 1] + "…"
    return f"{IN_USE} (pid {pid}: {command})" if command else f"{IN_USE} (pid {pid})"


def check_not_in_use(path: str) -> None:
    """Raise the StoreError `open_store` would raise for a file another process holds, now.

    Takes the lock for a moment and lets it go (closing the descriptor releases it); a file that
    does not exist yet is held by nobody and is not created here. `open_store` locks the file
    again for good, so a process that takes it in between still gets the same error there."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return  # absent, or unreadable: `open_store` reports what is wrong with it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreError(path, in_use_message(path)) from None
    except OSError:
        return
    finally:
        os.close(fd)
