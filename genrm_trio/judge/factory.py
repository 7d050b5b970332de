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

__all__ = ["ANSWER_PROBE_S", "make_judge"]

ANSWER_PROBE_S = 30.0
"""The answer probe of a replica waits at most this long (less when judge_request_timeout_s is):
one output token, but a loaded judge queues it."""


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
    # the GenRM roles go to the model with judge.prompt genrm and an API that sends messages
    sends_roles = judge.prompt == "genrm" and judge.api != "genrm_model"
    twins = []
    if sends_roles and judge.probe:
        # the same replicas with the instruct prompt: the answer probe tells by them whether a
        # refusal is the roles' (judge/answer_probe.py)
        instruct = settings.model_copy(
            update={"judge": judge.model_copy(update={"prompt": "instruct"})}
        )
        twins = [
            make_http_judge(instruct, base_url=url, backend=backend) for url in judge.base_urls
        ]
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
        sends_roles=sends_roles,
        # judge.probe: Gym's model servers start beside this one (and have no /models)
        answer_probe_s=min(ANSWER_PROBE_S, settings.judge_request_timeout_s)
        if judge.probe
        else None,
        instruct_twins=twins,
    )
