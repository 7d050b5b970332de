"""genrm-trio: GenRM pairwise-comparison rewards for RL rollout groups, on trio.

The library surface: open an engine on a judge and feed it `/verify` and `/compare` inputs::

    async with open_engine(settings, judge) as engine:
        outcome = await engine.verify(VerifyInput(...))   # Scored | Masked | GroupFailed

Names are imported lazily (PEP 562), so ``import genrm_trio.config`` does not load the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from genrm_trio.engine import Engine, EngineStatistics, open_engine
    from genrm_trio.model import (
        CohortView,
        CompareFailed,
        CompareInput,
        CompareResult,
        GroupFailed,
        Masked,
        MemberOutcome,
        RequestRejected,
        Scored,
        VerifyInput,
    )

__version__ = "0.1.0"

_EXPORTS = {
    "Engine": "genrm_trio.engine",
    "EngineStatistics": "genrm_trio.engine",
    "open_engine": "genrm_trio.engine",
    "CohortView": "genrm_trio.model",
    "CompareFailed": "genrm_trio.model",
    "CompareInput": "genrm_trio.model",
    "CompareResult": "genrm_trio.model",
    "GroupFailed": "genrm_trio.model",
    "Masked": "genrm_trio.model",
    "MemberOutcome": "genrm_trio.model",
    "RequestRejected": "genrm_trio.model",
    "Scored": "genrm_trio.model",
    "VerifyInput": "genrm_trio.model",
}

__all__ = [
    "CohortView",
    "CompareFailed",
    "CompareInput",
    "CompareResult",
    "Engine",
    "EngineStatistics",
    "GroupFailed",
    "Masked",
    "MemberOutcome",
    "RequestRejected",
    "Scored",
    "VerifyInput",
    "__version__",
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
