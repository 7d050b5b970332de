"""Test tools: the simulated GenRM judge (docs/embedding.md, "A judge"), in process and as an HTTP
server, with deterministic verdicts, scripted latency and faults. Never a production default.

One simulator core (`core`) serves three ways:

- `SimJudge` (`judge`): the `Judge` protocol in-process (no sockets); sleeps with `trio.sleep`,
  so `MockClock` virtual time drives its latency.
- `sim_asgi_app()` (`asgi`): a plain ASGI3 app speaking both judge APIs (`POST /v1/responses`,
  `POST /v1/chat/completions`) plus `GET /v1/models` and `GET /health`.
- `serve_sim_judge()` (`asgi`): that app on a minimal HTTP/1.1 server (`server`; what
  `genrm-trio sim-judge` runs).

Verdicts (`verdicts`) are a pure function of the two answer texts: each answer gets a quality
1..5 from its sha256 (or from a `[quality=N]` marker in the text), the scores are the qualities
and the ranking follows their difference, so both orientations of a pair always agree.

With a `LengthModel` (or a `[need=N]` marker in an answer) each attempt's verdict needs a number
of output tokens; an attempt whose budget (`max_output_tokens`, chat `max_tokens`) is below it
answers as an exhausted budget, as a reasoning judge cut off before its verdict does. See
`LengthModel` for the distribution and its presets. `FaultRule` (`faults`) scripts the faults;
`flags` maps the `sim-judge` command's flags onto a `SimConfig`. `PolicyStandIn` (`policy`,
`sim-judge --policy`) answers ordinary policy requests too, so one server can be both models of a
GPU-free NeMo Gym trial. `procs` starts real `genrm-trio` processes for the tests and the
benchmarks (one harness for both).

Nothing in the library imports this package; only the app layer (`genrm-trio sim-judge`,
`--judge sim`, the demo) does.
"""

from __future__ import annotations

from genrm_trio.testing.asgi import serve_sim_judge, sim_asgi_app
from genrm_trio.testing.core import SimConfig
from genrm_trio.testing.faults import FaultRule
from genrm_trio.testing.judge import SimJudge
from genrm_trio.testing.policy import PolicyStandIn
from genrm_trio.testing.verdicts import LengthModel

__all__ = [
    "FaultRule",
    "LengthModel",
    "PolicyStandIn",
    "SimConfig",
    "SimJudge",
    "serve_sim_judge",
    "sim_asgi_app",
]
