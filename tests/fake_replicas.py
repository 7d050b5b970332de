"""Fake judge replicas. Their address side, shared by the fleet tests (tests/test_fleet.py,
tests/test_fleet_queue.py, tests/test_judge_outage.py): a replica named `name` serves at
`http://name:8000/v1` on the Responses path and has nothing to close; each test module's
subclass gives `attempt` (and `probe`) the behaviour it scripts. And a replica's statistics
(`ReplicaStats`), as the fleet reports them, for the tests of `GET /judge/replicas`, `/readyz`,
`top` and the per-replica series (tests/test_http_app.py, tests/test_top.py,
tests/test_metrics.py, tests/test_monitoring.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from genrm_trio.judge.base import ReplicaStats

IN_SERVICE = ReplicaStats(
    replica="",
    url="",
    calls=40,
    failures=0,
    in_flight=0,
    ejected=False,
    ejections=0,
    consecutive_failures=0,
    stalls=0,
    back_in_s=None,
    latency_sum_s=2.0,
    latency_count=40,
    last_error=None,
)


def replica_stats(label: str, **fields: Any) -> ReplicaStats:
    """The statistics of replica `label` (`host:port`, at `http://label/v1`): in service, 40
    calls answered in 50 ms each, unless `fields` say otherwise."""
    return dataclasses.replace(IN_SERVICE, replica=label, url=f"http://{label}/v1", **fields)


class NamedReplica:
    """A fake replica's URL, endpoint, path and close, from its `name`."""

    name: str

    @property
    def url(self) -> str:
        return f"http://{self.name}:8000/v1"

    @property
    def endpoint(self) -> str:
        return f"{self.name}:8000"

    @property
    def path(self) -> str:
        return "/v1/responses"

    async def aclose(self) -> None:
        """Nothing to close: no connection is ever opened."""


def fleet_entries(*replicas: NamedReplica) -> list[tuple[str, Any]]:
    """The `(url, judge)` list `JudgeFleet` takes, in the order given."""
    return [(replica.url, replica) for replica in replicas]
