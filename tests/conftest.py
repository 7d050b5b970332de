"""Fixtures shared by test modules (helpers they import live in procs.py, judges.py, ...)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """main() configures the `genrm_trio` logger; put it back afterwards."""
    logger = logging.getLogger("genrm_trio")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]
