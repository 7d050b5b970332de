"""Property: eager comparisons change when comparisons run, never what a group gets.

Random groups (size, strategy, judge passes, position balance, fixed baseline, attempts, judge
slots), random arrival orders and times, and random verdict outcomes per shown pair (a verdict,
a judge failure, an unparsable reply, a first attempt answered 503 with or without a
`Retry-After`, at any point of collection) with random latencies, each run with
`eager_comparisons: true` and `false` in virtual time: every member gets the same reply (rows,
rewards, masks and per-group metrics; only the eager row's own share of comparisons done early is
added), and every comparison is judged the same number of times.
"""

from __future__ import annotations

from typing import Any

from eager_scenarios import run, scenarios
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from genrm_trio.domain.model import Scored
from genrm_trio.engine.evaluation import EAGER_RATE_KEY


@hsettings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_eager_starts_give_every_member_the_same_reply(scenario: dict[str, Any]) -> None:
    eager, eager_calls = run(scenario, True)
    later, later_calls = run(scenario, False)
    assert sorted(eager) == sorted(later) == list(range(scenario["n"]))
    assert eager_calls == later_calls
    for index, reply in eager.items():
        if isinstance(reply, Scored):
            result = dict(reply.result)
            rate = result.pop(EAGER_RATE_KEY)
            assert isinstance(rate, float) and 0.0 <= rate <= 1.0
            other = later[index]
            assert isinstance(other, Scored) and EAGER_RATE_KEY not in other.result
            assert result == other.result  # rewards, texts and per-group metrics, bit for bit
        else:
            assert reply == later[index]  # the same mask reason or group failure
