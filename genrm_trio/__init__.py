"""genrm-trio: GenRM pairwise-comparison rewards for RL rollout groups, on trio.

The library surface: open an engine on a judge and feed it `/verify` and `/compare` inputs::

    settings = load_settings("genrm.yaml")             # or Settings.model_validate({...})
    judge = make_judge(settings)                       # or genrm_trio.testing.SimJudge() in tests
    async with open_engine(settings, judge) as engine:
        outcome = await engine.verify(VerifyInput(...))   # Scored | Masked | GroupFailed
    await judge.aclose()                               # the engine never closes the judge

docs/embedding.md has a complete example. Names are imported lazily (PEP 562), so
``import genrm_trio.config`` does not load the engine, and nothing loads httpx until asked.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrm_trio.config import ConfigError, Settings, load_settings
    from genrm_trio.domain.model import (
        CohortView,
        CompareFailed,
        CompareInput,
        CompareResult,
        GroupFailed,
        Masked,
        MemberOutcome,
        Rejection,
        RequestRejected,
        Scored,
        VerifyInput,
    )
    from genrm_trio.engine.engine import Engine, EngineStatistics, open_engine
    from genrm_trio.judge.base import Judge, JudgeCall, JudgeReply, ReplyStatus
    from genrm_trio.judge.factory import make_judge
    from genrm_trio.judge.fleet import JudgeFleet

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "genrm_trio.config",
    "Settings": "genrm_trio.config",
    "load_settings": "genrm_trio.config",
    "Judge": "genrm_trio.judge.base",
    "JudgeCall": "genrm_trio.judge.base",
    "JudgeReply": "genrm_trio.judge.base",
    "ReplyStatus": "genrm_trio.judge.base",
    "JudgeFleet": "genrm_trio.judge.fleet",
    "make_judge": "genrm_trio.judge.factory",
    "Engine": "genrm_trio.engine.engine",
    "EngineStatistics": "genrm_trio.engine.engine",
    "open_engine": "genrm_trio.engine.engine",
    "CohortView": "genrm_trio.domain.model",
    "CompareFailed": "genrm_trio.domain.model",
    "CompareInput": "genrm_trio.domain.model",
    "CompareResult": "genrm_trio.domain.model",
    "GroupFailed": "genrm_trio.domain.model",
    "Masked": "genrm_trio.domain.model",
    "MemberOutcome": "genrm_trio.domain.model",
    "Rejection": "genrm_trio.domain.model",
    "RequestRejected": "genrm_trio.domain.model",
    "Scored": "genrm_trio.domain.model",
    "VerifyInput": "genrm_trio.domain.model",
}

__all__ = [
    "CohortView",
    "CompareFailed",
    "CompareInput",
    "CompareResult",
    "ConfigError",
    "Engine",
    "EngineStatistics",
    "GroupFailed",
    "Judge",
    "JudgeCall",
    "JudgeFleet",
    "JudgeReply",
    "Masked",
    "MemberOutcome",
    "Rejection",
    "ReplyStatus",
    "RequestRejected",
    "Scored",
    "Settings",
    "VerifyInput",
    "__version__",
    "load_settings",
    "make_judge",
    "open_engine",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'genrm_trio' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
