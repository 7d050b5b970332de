"""`make_judge`: the judge `settings.judge` describes, for the server and for embedders.

A `JudgeFleet` (judge/fleet.py) of one `HttpJudge` replica per base URL, each made by
`judge.client.make_http_judge`, the replica factory. Kept apart from the fleet so that the fleet,
which the engine imports, speaks no HTTP itself.
"""

from __future__ import annotations

from genrm_trio.config import JUDGE_API_CHOICES, ConfigError, Settings
from genrm_trio.judge.client import make_http_judge
from genrm_trio.judge.fleet import JudgeFleet
from genrm_trio.judge.network import NetworkBackend

__all__ = ["make_judge"]


def make_judge(settings: Settings, *, backend: NetworkBackend | None = None) -> JudgeFleet:
    """The judge `settings.judge` describes: a `JudgeFleet` of one `HttpJudge` per base URL,
    one replica for a single URL (so that one URL and a list are built, routed and reported one
    way); `backend` opens their connections (tests; else real TCP). Embedders use this, not
    `judge.client.make_http_judge` (one replica, the factory this calls)."""
    judge = settings.judge
    if judge.base_url is None:
        raise ConfigError("settings", "judge.base_url", "required for an HTTP judge")
    if not judge.api_chosen:
        # the default (Gym's protocol) sent to a plain OpenAI server judges answers the model
        # never sees: a URL needs its API named (docs/configuration.md, "Which judge.api")
        raise ConfigError(
            "settings", "judge.api", f"required with judge.base_url: {JUDGE_API_CHOICES}"
        )
    return JudgeFleet(
        [
            (url, make_http_judge(settings, base_url=url, backend=backend))
            for url in judge.base_urls
        ],
        max_in_flight_per_replica=judge.max_concurrency_per_replica,
        eject_after_failures=judge.eject_after_failures,
        eject_backoff_s=judge.eject_backoff_s,
        stall_after_s=judge.replica_stall_s,
        outage_probe_s=judge.outage_probe_s,
        api=judge.api,
    )
