"""`genrm-trio` whose durable store stalls on demand: a disk whose fsync never returns.

    python tests/stalled_serve.py FLAG serve --config ... --state PATH

Once the file FLAG exists, every WAL fsync of the store blocks its thread for good (it touches
FLAG.stalled first, so a test knows the stall began). Everything else is the real `genrm-trio`
command line; tests/test_shutdown.py starts it as a real process.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from genrm_trio.app.cli import run
from genrm_trio.store.sqlite import SqliteStore


def stall_once_flagged(flag: Path) -> None:
    fsync_wal = SqliteStore._fsync_wal

    def stalling_fsync_wal(self: SqliteStore) -> None:
        if flag.exists():
            flag.with_name(flag.name + ".stalled").touch()
            threading.Event().wait()  # never returns
        fsync_wal(self)

    SqliteStore._fsync_wal = stalling_fsync_wal  # type: ignore[method-assign]


if __name__ == "__main__":
    stall_once_flagged(Path(sys.argv.pop(1)))
    run()
