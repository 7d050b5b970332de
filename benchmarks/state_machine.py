"""Micro-benchmark of three ways to drive cohorts through the `transitions` state machine.

    python benchmarks/state_machine.py [--live 2000] [--rounds 3000]

Shapes:
- engine: the module-level ``MACHINE`` of genrm_trio.engine.machine, driven through its typed
  wrappers (``MACHINE.events[name].trigger(model)``; the chosen shape);
- shared: one ``Machine`` with ``add_model``/``remove_model`` per cohort, measured while
  ``--live`` other cohorts are registered (both calls scan the model list);
- per-cohort: a new ``Machine(model=cohort)`` per cohort.

For each: microseconds per lifecycle (create + start_judging + publish [+ remove]) and the
memory retained per live cohort (tracemalloc, ``--live`` cohorts left in ``collecting``).
docs/benchmarks.md ("Cohort state machine") keeps its figures.
"""

from __future__ import annotations

import argparse
import gc
import timeit
import tracemalloc
from collections.abc import Callable
from typing import Any

from transitions import EventData, Machine

from genrm_trio.engine import machine as m


class _Model:
    """A cohort stand-in with the callbacks the machine names; identity equality."""

    __slots__ = ("__dict__", "full", "masked", "state")

    def __init__(self) -> None:
        self.state = "collecting"
        self.full = True
        self.masked = False

    def is_full(self, event: EventData) -> bool:
        return self.full

    def has_masked_members(self, event: EventData) -> bool:
        return self.masked

    def on_enter_judging(self, event: EventData) -> None:
        pass

    def on_enter_terminal(self, event: EventData) -> None:
        pass

    def on_state_changed(self, event: EventData) -> None:
        pass


_COMMON: dict[str, Any] = {
    "states": m.STATES,
    "transitions": m.TRANSITIONS,
    "initial": "collecting",
    "auto_transitions": False,
    "send_event": True,
    "after_state_change": "on_state_changed",
}


def _engine_lifecycle() -> _Model:
    model = _Model()
    m.start_judging(model)
    m.publish(model)
    return model


def _engine_create() -> Any:
    return _Model()


def _make_shared() -> tuple[Callable[[], Any], Callable[[], Any], Machine]:
    shared = Machine(model=None, **_COMMON)

    def lifecycle() -> Any:
        model = _Model()
        shared.add_model(model)
        model.start_judging()  # type: ignore[attr-defined]
        model.publish()  # type: ignore[attr-defined]
        shared.remove_model(model)
        return model

    def create() -> Any:
        model = _Model()
        shared.add_model(model)
        return model

    return lifecycle, create, shared


def _per_cohort_lifecycle() -> Any:
    model = _Model()
    Machine(model=model, **_COMMON)
    model.start_judging()  # type: ignore[attr-defined]
    model.publish()  # type: ignore[attr-defined]
    return model


def _per_cohort_create() -> Any:
    model = _Model()
    return (model, Machine(model=model, **_COMMON))


def _time_per_call(fn: Callable[[], Any], rounds: int) -> float:
    """Best of five runs of ``rounds`` calls, in microseconds per call (robust to a busy box)."""
    return min(timeit.repeat(fn, number=rounds, repeat=5)) / rounds * 1e6


def _retained_kib(create: Callable[[], Any], live: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    keep = [create() for _ in range(live)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del keep
    return (after - before) / live / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=2000, help="live cohorts while measuring")
    parser.add_argument("--rounds", type=int, default=3000, help="lifecycles timed per shape")
    args = parser.parse_args()

    rows: list[tuple[str, float, float]] = []
    rows.append(
        (
            "engine (module-level MACHINE)",
            _time_per_call(_engine_lifecycle, args.rounds),
            _retained_kib(_engine_create, args.live),
        )
    )

    lifecycle, create, shared = _make_shared()
    live_models = [create() for _ in range(args.live)]  # the list add/remove must scan
    shared_us = _time_per_call(lifecycle, max(1, args.rounds // 10))
    for model in live_models:
        shared.remove_model(model)
    _, create2, _ = _make_shared()
    rows.append(
        (f"shared add_model ({args.live} live)", shared_us, _retained_kib(create2, args.live))
    )

    rows.append(
        (
            "per-cohort Machine",
            _time_per_call(_per_cohort_lifecycle, max(1, args.rounds // 10)),
            _retained_kib(_per_cohort_create, args.live),
        )
    )

    model = _Model()

    def one_trigger() -> None:
        model.state = "collecting"
        m.start_judging(model)

    trigger_us = _time_per_call(one_trigger, args.rounds)

    print(f"{'shape':40} {'us/lifecycle':>14} {'KiB/cohort':>12}")
    for name, us, kib in rows:
        print(f"{name:40} {us:14.1f} {kib:12.2f}")
    print(f"one guarded start_judging trigger (engine shape): {trigger_us:.1f} us")


if __name__ == "__main__":
    main()
