"""Property: eager comparisons give every member the same reply under the graph keys too
(`mask_policy: component`, `aggregator_method: bradley_terry`, issue #21), which were built apart
from eager starts (issue #20): the masking and the fit read the comparisons in plan order, never
in the order they finished.

The scenarios, the scripted judge and the run are tests/eager_scenarios.py's, as for
tests/test_engine_eager_properties.py; only the settings gain the two keys.
"""

from __future__ import annotations

from typing import Any, get_args

from eager_scenarios import run, scenarios
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from genrm_trio.config import AggregatorMethod, MaskPolicy
from genrm_trio.domain.model import Masked, Scored
from genrm_trio.domain.scoring import BT_LOG_LIKELIHOOD
from genrm_trio.engine.evaluation import EAGER_RATE_KEY


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.sampled_from(get_args(MaskPolicy)),  # every value the settings accept
    st.sampled_from(get_args(AggregatorMethod)),
)
def test_eager_starts_give_the_same_reply_under_component_masking_and_bradley_terry(
    scenario: dict[str, Any], mask_policy: str, method: str
) -> None:
    keys = {"mask_policy": mask_policy, "aggregator_method": method}
    eager, eager_calls = run(scenario, True, **keys)
    later, later_calls = run(scenario, False, **keys)
    assert sorted(eager) == sorted(later) == list(range(scenario["n"]))
    assert eager_calls == later_calls
    for index, reply in eager.items():
        other = later[index]
        if isinstance(reply, Scored):
            result = dict(reply.result)
            assert 0.0 <= result.pop(EAGER_RATE_KEY) <= 1.0
            assert isinstance(other, Scored)
            assert result == other.result  # rewards and per-group metrics, bit for bit
            # the keys reached the scoring: the fit's own metric is there exactly under BT
            assert (BT_LOG_LIKELIHOOD in result) == (method == "bradley_terry")
        else:
            assert reply == other
            if isinstance(reply, Masked) and mask_policy == "component":
                assert "connected component" in reply.reason
