"""Who holds the state file: the /proc/locks reading behind the one-line clash error."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from genrm_trio.store.errors import StoreError
from genrm_trio.store.lock import IN_USE, check_not_in_use, in_use_message, lock_holder


def _locks_line(path: Path, pid: int, *, waiter: bool = False) -> str:
    stat = os.stat(path)
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    arrow = "-> " if waiter else ""
    return f"7: {arrow}FLOCK  ADVISORY  WRITE {pid} {device} 0 EOF"


def test_the_holder_is_read_from_proc_locks(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    path.write_bytes(b"")
    other = tmp_path / "other"
    other.write_bytes(b"")
    locks = "\n".join(
        [
            "1: POSIX  ADVISORY  WRITE 11 00:00:1 0 EOF",
            _locks_line(other, 22),
            _locks_line(path, 33, waiter=True),
            _locks_line(path, 44),
        ]
    )
    assert lock_holder(str(path), locks) == 44
    assert lock_holder(str(path), "") is None
    assert lock_holder(str(tmp_path / "absent"), locks) is None


def test_the_message_names_the_holder_and_its_command(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    path.write_bytes(b"")
    mine = os.getpid()
    command = Path(f"/proc/{mine}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ")
    shown = command.decode()
    if len(shown) > 160:
        shown = shown[:159] + "…"
    assert in_use_message(str(path), _locks_line(path, mine)) == f"{IN_USE} (pid {mine}: {shown})"
    assert in_use_message(str(path), "") == IN_USE


def test_the_early_check_sees_a_held_file_and_leaves_a_free_one_alone(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    check_not_in_use(str(path))  # absent: nobody holds it, and it is not created
    assert not path.exists()
    path.write_bytes(b"")
    check_not_in_use(str(path))
    check_not_in_use(str(path))  # the check let its own lock go
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StoreError) as caught:
            check_not_in_use(str(path))
    finally:
        os.close(fd)
    assert caught.value.path == str(path)
    assert caught.value.message.startswith(f"{IN_USE} (pid {os.getpid()}: ")
