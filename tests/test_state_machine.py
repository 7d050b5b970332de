"""The cohort state machine: transitions, guards, no-op wrappers, identity, and the diagram."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from transitions import EventData

from genrm_trio.engine import machine

ROOT = Path(__file__).resolve().parents[1]


class Model:
    """A minimal machine model recording its callbacks."""

    def __init__(self, *, full: bool = True, masked: bool = False, state: str = "collecting"):
        self.state = state
        self.full = full
        self.masked = masked
        self.events: list[tuple[str, str, str]] = []
        self.payloads: list[dict[str, object]] = []

    def is_full(self, event: EventData) -> bool:
        return self.full

    def has_masked_members(self, event: EventData) -> bool:
        return self.masked

    def on_enter_judging(self, event: EventData) -> None:
        self.events.append(("enter", "judging", event.event.name))

    def on_enter_terminal(self, event: EventData) -> None:
        self.events.append(("enter", self.state, event.event.name))
        self.payloads.append(dict(event.kwargs))

    def on_state_changed(self, event: EventData) -> None:
        assert event.transition is not None
        self.events.append(("changed", event.transition.source, event.transition.dest))


def test_happy_path_scored() -> None:
    model = Model()
    assert machine.start_judging(model)
    assert model.state == "judging"
    assert machine.publish(model, outcomes={})
    assert model.state == "scored"
    assert model.events == [
        ("enter", "judging", "start_judging"),
        ("changed", "collecting", "judging"),
        ("enter", "scored", "publish"),
        ("changed", "judging", "scored"),
    ]


def test_publish_with_masked_members_is_partially_masked() -> None:
    model = Model(masked=True)
    machine.start_judging(model)
    assert machine.publish(model, outcomes={"x": 1})
    assert model.state == "partially_masked"
    assert model.payloads == [{"outcomes": {"x": 1}}]


def test_start_judging_is_guarded_by_is_full() -> None:
    model = Model(full=False)
    assert not machine.start_judging(model)
    assert model.state == "collecting"
    assert model.events == []
    model.full = True
    assert machine.start_judging(model)


@pytest.mark.parametrize("state", ["collecting", "judging"])
def test_fail_from_active_states(state: str) -> None:
    model = Model(state=state)
    assert machine.fail(model, failure="boom")
    assert model.state == "failed"
    assert model.payloads == [{"failure": "boom"}]


@pytest.mark.parametrize("state", ["scored", "partially_masked", "failed"])
def test_terminal_states_never_change(state: str) -> None:
    """A restored cohort starts terminal; fail/publish/start are no-ops returning False."""
    model = Model(state=state)
    assert not machine.fail(model, failure="late")
    assert not machine.publish(model, outcomes={})
    assert not machine.start_judging(model)
    assert model.state == state
    assert model.events == []
    assert machine.is_terminal(state)


def test_start_comparisons_is_internal_to_collecting() -> None:
    """Collecting with comparisons in flight is still `collecting` (eager_comparisons): the
    internal transition runs no entry callback; the state-change hook sees no destination
    (`Cohort.on_state_changed` ignores it, so the state gauges stay put)."""
    model = Model(full=False)
    assert machine.start_comparisons(model)
    assert machine.start_comparisons(model)
    assert model.state == "collecting"
    assert model.events == [("changed", "collecting", None), ("changed", "collecting", None)]
    model.full = True
    assert machine.start_judging(model)
    model.events.clear()
    # once judging (or terminal), comparisons start with the evaluation: a no-op here
    assert not machine.start_comparisons(model)
    assert machine.fail(model, failure="boom")
    assert not machine.start_comparisons(model)
    assert model.events == [("enter", "failed", "fail"), ("changed", "judging", "failed")]


def test_publish_from_collecting_is_a_no_op() -> None:
    model = Model()
    assert not machine.publish(model, outcomes={})
    assert model.state == "collecting"


def test_machine_has_no_models_and_one_definition() -> None:
    """The shared machine never registers cohorts (no add_model scans)."""
    for _ in range(3):
        model = Model()
        machine.start_judging(model)
        machine.publish(model, outcomes={})
    assert machine.MACHINE.models == []
    assert set(machine.MACHINE.states) == {
        "collecting",
        "judging",
        "scored",
        "partially_masked",
        "failed",
    }
    assert set(machine.MACHINE.states) == machine.TERMINAL_STATES | machine.ACTIVE_STATES


def test_wire_vocabulary() -> None:
    assert machine.wire_phase("collecting") == "collecting"
    assert machine.wire_phase("judging") == "evaluating"
    assert machine.wire_phase("scored") == "completed"
    assert machine.wire_phase("partially_masked") == "completed"
    assert machine.wire_phase("failed") == "failed"


def test_docs_diagram_is_current() -> None:
    """docs/state-machine.md is generated from the machine definition; regenerate with
    `python -m genrm_trio.engine.machine` when this fails."""
    current = (ROOT / "docs" / "state-machine.md").read_text(encoding="utf-8")
    assert current == machine.render_markdown(), (
        "docs/state-machine.md is stale: run `python -m genrm_trio.engine.machine`"
    )


def test_diagram_comes_from_transitions_mermaid() -> None:
    text = machine.render_mermaid()
    assert "stateDiagram-v2" in text
    assert "collecting --> judging: start_judging [is_full]" in text
    assert "judging --> partially_masked: publish [has_masked_members]" in text
    assert "judging --> scored: publish [!has_masked_members]" in text
    assert "collecting --> failed: fail" in text
    assert "collecting --> collecting: start_comparisons [internal]" in text
    assert "judging --> failed: fail" in text


def test_regenerate_command(tmp_path: Path) -> None:
    out = tmp_path / "state-machine.md"
    subprocess.run(
        [sys.executable, "-m", "genrm_trio.engine.machine", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.read_text(encoding="utf-8") == machine.render_markdown()
