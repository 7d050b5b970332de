"""The address side of a fake judge replica, shared by the fleet tests (tests/test_fleet.py,
tests/test_fleet_queue.py, tests/test_judge_outage.py): a replica named `name` serves at
`http://name:8000/v1` on the Responses path and has nothing to close. Each test module's
subclass gives `attempt` (and `probe`) the behaviour it scripts."""

from __future__ import annotations

from typing import Any


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
