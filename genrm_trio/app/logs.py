"""Where genrm-trio's log records go: one handler on the `genrm_trio` logger, one line per record
(`HH:MM:SS LEVEL logger: message`, docs/operations.md "Logs")."""

from __future__ import annotations

import logging
import sys
from typing import IO, Any, final

from genrm_trio.domain.text import printable, printable_lines

__all__ = ["EscapingFormatter", "configure_logging"]


@final
class _StdHandler(logging.StreamHandler[IO[str]]):
    """Writes to whatever `sys.stderr` (or `sys.stdout`) is at emit time, so redirection and
    test capture work."""

    def __init__(self, to_stdout: bool) -> None:
        self.to_stdout = to_stdout
        super().__init__(sys.stdout if to_stdout else sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stdout if self.to_stdout else sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


@final
class EscapingFormatter(logging.Formatter):
    """One line per record, whatever it quotes: control characters of the message (a client's
    group id, a judge's error text) are escaped (`printable`), so no log line can hold a
    terminal escape sequence or a forged second line. A traceback keeps its line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return printable_lines(stack_info)


def configure_logging(level: int = logging.INFO, *, stdout: bool = False) -> None:
    """Send `genrm_trio.*` records to stderr (or stdout), once per process."""
    logger = logging.getLogger("genrm_trio")
    logger.setLevel(level)
    if not any(isinstance(handler, _StdHandler) for handler in logger.handlers):
        handler = _StdHandler(stdout)
        handler.setFormatter(
            EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        logger.addHandler(handler)
