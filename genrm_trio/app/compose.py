"""Composing the engine with the durable store: what a service runs at start and at stop.

:func:`durable_engine` opens the store of ``settings.state_path`` (none when unset), loads it
into a fresh engine with :func:`restore_from_store`, and closes both in order. This is
application wiring: the store stays below the engine and knows nothing of it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from genrm_trio.config import Settings
from genrm_trio.engine.engine import Engine, open_engine
from genrm_trio.store.sqlite import SqliteStore, open_store

if TYPE_CHECKING:
    from genrm_trio.domain.checkpoint import RestoreReport
    from genrm_trio.judge.base import Judge
    from genrm_trio.metrics import Metrics

__all__ = ["durable_engine", "restore_from_store"]

# The store's logger: these lines are the store's start-up report, and operators filter on it.
log = logging.getLogger("genrm_trio.store")


async def restore_from_store(engine: Engine, store: SqliteStore) -> RestoreReport:
    """Load ``store`` (docs/durable-state.md) and restore its records into a fresh ``engine``.

    Restoring records the store itself handed out writes nothing back: they keep their stored
    timestamps, so retention continues across restarts.
    """
    state = await store.load()
    try:
        report = await engine.restore_records(
            state.records,
            state.watermarks,
            age_s=state.record_ages,
            watermark_age_s=state.watermark_ages,
        )
    finally:
        store.end_adoption()
    log.info(
        "durable state %s: restored %d cohort records (%d interrupted by the restart) and %d "
        "watermarks; discarded %d expired, %d over the cap, %d unfinished legacy cohorts",
        store.path,
        report.added,
        state.interrupted,
        len(state.watermarks),
        state.expired,
        state.evicted,
        state.dropped_open,
    )
    for conflict in report.conflicts:
        log.warning("durable state %s: not restored: %s", store.path, conflict)
    return report


@asynccontextmanager
async def durable_engine(
    settings: Settings, judge: Judge, *, metrics: Metrics | None = None
) -> AsyncIterator[Engine]:
    """``open_engine`` with the durable store of ``settings.state_path`` (none when unset).

    The state loads before the engine is yielded; on exit the engine closes first (its last
    terminal commits land), then the store.
    """
    if settings.state_path is None:
        async with open_engine(settings, judge, metrics=metrics) as engine:
            yield engine
        return
    async with (
        open_store(settings.state_path, settings) as store,
        open_engine(settings, judge, metrics=metrics, store=store) as engine,
    ):
        await restore_from_store(engine, store)
        yield engine
