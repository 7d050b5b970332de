"""The cohort state machine: one `transitions` definition shared by every cohort.

States (internal names, shown by ``GET /cohorts``, Prometheus labels and docs)::

    collecting --start_comparisons (internal)--> collecting
    collecting --start_judging [is_full]--> judging
    judging --publish [has_masked_members]--> partially_masked
    judging --publish [unless has_masked_members]--> scored
    collecting | judging --fail--> failed

The wire and the logs keep the reference's words (docs/differences.md, D39): :func:`wire_phase`
maps ``judging`` → ``evaluating`` and ``scored``/``partially_masked`` → ``completed``.

Shape: a single module-level Machine used as an engine, because its cost per cohort does not
grow with live cohorts (a shared Machine's ``add_model`` scans its model list) and it holds no
per-cohort state (a Machine per cohort holds two orders of magnitude more memory).
``benchmarks/state_machine.py`` measures the three shapes; docs/benchmarks.md ("Cohort state
machine") keeps the figures.

So a single module-level :data:`MACHINE` is built with ``model=None`` and never learns about
cohorts: the typed wrappers :func:`start_comparisons`, :func:`start_judging`, :func:`publish` and
:func:`fail` call ``MACHINE.events[name].trigger(cohort, ...)``. Callbacks are named by string and
resolved on the cohort passed in, conditions included, so there is no per-cohort registration,
no ``add_model`` list scan and no per-cohort ``Machine``. Every callback receives the
``EventData`` (``send_event=True``). Models must use identity equality (``transitions``
compares models with ``==`` in ``add_model``/``remove_model``; cohorts never rely on it, but
they keep identity equality so that containers never confuse two cohorts with equal content).

A wrapper called from a state the trigger does not leave is a no-op returning False: that is how
"fail only from the expected phase" and "a late result for a failed cohort is discarded" are
expressed. A restored cohort simply starts with ``state`` set to its terminal state.

``python -m genrm_trio.engine.machine`` rewrites ``docs/state-machine.md`` from this definition
(transitions' Mermaid output; no Graphviz binary), and a test fails when the file is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from transitions import EventData, Machine

__all__ = [
    "ACTIVE_STATES",
    "MACHINE",
    "STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "CohortModel",
    "State",
    "can",
    "fail",
    "is_terminal",
    "publish",
    "render_markdown",
    "render_mermaid",
    "start_comparisons",
    "start_judging",
    "wire_phase",
]

State = Literal["collecting", "judging", "scored", "partially_masked", "failed"]
WirePhase = Literal["collecting", "evaluating", "completed", "failed"]

ACTIVE_STATES: Final = frozenset({"collecting", "judging"})
TERMINAL_STATES: Final = frozenset({"scored", "partially_masked", "failed"})

_WIRE: Final[dict[str, WirePhase]] = {
    "collecting": "collecting",
    "judging": "evaluating",
    "scored": "completed",
    "partially_masked": "completed",
    "failed": "failed",
}

STATES: Final[list[dict[str, Any]]] = [
    {"name": "collecting"},
    {"name": "judging", "on_enter": ["on_enter_judging"]},
    {"name": "scored", "on_enter": ["on_enter_terminal"], "final": True},
    {"name": "partially_masked", "on_enter": ["on_enter_terminal"], "final": True},
    {"name": "failed", "on_enter": ["on_enter_terminal"], "final": True},
]

TRANSITIONS: Final[list[dict[str, Any]]] = [
    # Collecting with comparisons in flight (eager_comparisons) is still `collecting`: the
    # internal transition is the machine's consent to start them, and `fail` cancels them with
    # the cohort.
    {
        "trigger": "start_comparisons",
        "source": "collecting",
        "dest": None,
    },
    {
        "trigger": "start_judging",
        "source": "collecting",
        "dest": "judging",
        "conditions": ["is_full"],
    },
    {
        "trigger": "publish",
        "source": "judging",
        "dest": "partially_masked",
        "conditions": ["has_masked_members"],
    },
    {
        "trigger": "publish",
        "source": "judging",
        "dest": "scored",
        "unless": ["has_masked_members"],
    },
    {"trigger": "fail", "source": ["collecting", "judging"], "dest": "failed"},
]

_COMMON: Final[dict[str, Any]] = {
    "states": STATES,
    "transitions": TRANSITIONS,
    "initial": "collecting",
    "auto_transitions": False,
    "send_event": True,
    "after_state_change": "on_state_changed",
}

MACHINE: Final = Machine(model=None, **_COMMON)
"""The one machine. Never call ``add_model`` on it: use the typed wrappers below."""

# trigger name -> states it may leave; the wrappers check this before triggering.
_SOURCES: Final[dict[str, frozenset[str]]] = {
    name: frozenset(event.transitions) for name, event in MACHINE.events.items()
}
_START: Final = MACHINE.events["start_judging"]
_START_COMPARISONS: Final = MACHINE.events["start_comparisons"]
_PUBLISH: Final = MACHINE.events["publish"]
_FAIL: Final = MACHINE.events["fail"]


class CohortModel(Protocol):
    """What a model of :data:`MACHINE` provides: the state attribute and the named callbacks."""

    state: str

    def is_full(self, event: EventData) -> bool: ...

    def has_masked_members(self, event: EventData) -> bool: ...

    def on_enter_judging(self, event: EventData) -> None: ...

    def on_enter_terminal(self, event: EventData) -> None: ...

    def on_state_changed(self, event: EventData) -> None: ...


def can(model: CohortModel, trigger: str) -> bool:
    """Whether ``trigger`` may leave the model's current state (conditions not evaluated)."""
    return model.state in _SOURCES[trigger]


def start_comparisons(model: CohortModel) -> bool:
    """collecting → collecting (internal): comparisons may start before the group is complete.
    False from any other state (then they start with the group's evaluation)."""
    if model.state not in _SOURCES["start_comparisons"]:
        return False
    return bool(_START_COMPARISONS.trigger(model))


def start_judging(model: CohortModel) -> bool:
    """collecting → judging when every member is present; False otherwise (state unchanged)."""
    if model.state not in _SOURCES["start_judging"]:
        return False
    return bool(_START.trigger(model))


def publish(model: CohortModel, **payload: Any) -> bool:
    """judging → partially_masked | scored. False (late result discarded) from any other state.

    ``payload`` reaches every callback as ``event.kwargs``.
    """
    if model.state not in _SOURCES["publish"]:
        return False
    return bool(_PUBLISH.trigger(model, **payload))


def fail(model: CohortModel, **payload: Any) -> bool:
    """collecting | judging → failed. A no-op returning False once the cohort is terminal."""
    if model.state not in _SOURCES["fail"]:
        return False
    return bool(_FAIL.trigger(model, **payload))


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES


def wire_phase(state: str) -> WirePhase:
    """The reference's word for a state (docs/differences.md, D39), for replies and log lines."""
    return _WIRE[state]


# --- the diagram ---------------------------------------------------------------------------------


class _DiagramModel:
    state = "collecting"


def render_mermaid() -> str:
    """The Mermaid ``stateDiagram-v2`` of :data:`MACHINE`'s definition, from transitions itself."""
    from transitions.extensions import GraphMachine

    graph_machine = GraphMachine(
        model=_DiagramModel(),
        graph_engine="mermaid",
        title="genrm-trio cohort",
        show_conditions=True,
        **_COMMON,
    )
    graph = graph_machine.get_graph()
    source = graph.source if hasattr(graph, "source") else str(graph)
    lines = [line.rstrip() for line in str(source).splitlines()]
    # The initial state is styled "active" for the dummy model; a definition has no active state.
    lines = [
        line.replace("s_active", "s_default") if line.lstrip().startswith("Class ") else line
        for line in lines
    ]
    return "\n".join(lines).strip() + "\n"


def render_markdown() -> str:
    """The whole of ``docs/state-machine.md``."""
    rows = "\n".join(f"| `{state}` | `{_WIRE[state]}` |" for state in _WIRE)
    return (
        "# Cohort state machine\n\n"
        "<!-- Generated by `python -m genrm_trio.engine.machine` from genrm_trio/engine/machine.py;"
        " do not edit. tests/test_state_machine.py fails when this file is stale. -->\n\n"
        "Every cohort of `/verify` moves through this machine (one shared `transitions.Machine`;"
        " see [architecture.md](architecture.md#the-state-machine) for the measured choice)."
        " A cohort restored from a checkpoint or the durable store starts in its terminal"
        " state.\n\n"
        "```mermaid\n"
        f"{render_mermaid()}"
        "```\n\n"
        "Internal state names appear in `GET /cohorts`, Prometheus labels and these docs; replies"
        " and log lines use the reference's words"
        " ([differences.md](differences.md#requests-and-replies), D39):\n\n"
        "| state | wire / log word |\n|---|---|\n"
        f"{rows}\n\n"
        "- `start_comparisons` is internal to `collecting` (no state change): with"
        " `eager_comparisons: true` (the default) each comparison starts as soon as both of its"
        " members are present, while the group still collects. Such a cohort is `collecting`"
        " with comparisons in flight; they run in the cohort's scope, so"
        " `fail` (collection deadline, supersession, shutdown) cancels them, and they keep"
        " running through `start_judging`"
        " ([configuration.md](configuration.md#cohorts-and-deadlines)).\n"
        "- `start_judging` is guarded by `is_full` (all N rollout indices present).\n"
        "- `publish` goes to `partially_masked` when at least one member was masked alone"
        " ([differences.md](differences.md#partial-masking-and-the-trainer-requirement)), else to"
        " `scored`; from any state but `judging` it is a no-op, so a late"
        " result of a superseded or failed cohort is discarded.\n"
        "- `fail` leaves `collecting` or `judging` (collection deadline, supersession, shutdown,"
        " non-judge error, evaluation deadline, every member masked); it is a no-op once the"
        " cohort is terminal.\n"
        "- Entering a terminal state records the outcome and the terminal record; waiters are"
        " released only after that record is committed to the durable store"
        " ([durable-state.md](durable-state.md#durability-when-is-a-reply-safe)).\n"
    )


DOC_PATH: Final = Path(__file__).resolve().parents[2] / "docs" / "state-machine.md"


def main(argv: list[str] | None = None) -> int:
    """Rewrite docs/state-machine.md (or the path given) from the definition."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DOC_PATH
    path.write_text(render_markdown(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
