"""The retention rule shared by the registry and the store (docs/durable-state.md, "Retention")."""

from __future__ import annotations

from genrm_trio.config import Settings
from genrm_trio.domain.retention import Retention


def test_of_settings() -> None:
    rule = Retention.of(Settings(cohort_result_ttl_s=60.0, max_terminal_cohorts=3))
    assert (rule.ttl_s, rule.cap) == (60.0, 3)


def test_a_record_stamped_exactly_ttl_ago_has_expired() -> None:
    rule = Retention(ttl_s=60.0, cap=10)
    assert rule.horizon(100.0) == 40.0
    assert rule.expired(40.0, 100.0)
    assert not rule.expired(40.5, 100.0)
    assert rule.expired(0.0, 100.0)


def test_no_ttl_expires_nothing() -> None:
    rule = Retention(ttl_s=None, cap=10)
    assert rule.horizon(1e12) is None
    assert not rule.expired(0.0, 1e12)


def test_excess_over_the_cap() -> None:
    rule = Retention(ttl_s=None, cap=3)
    assert [rule.excess(n) for n in (0, 3, 4, 10)] == [0, 0, 1, 7]
