"""`genrm-trio bench`: a load generator for `/verify` groups and `/compare` batches.

Closed loop: G workers each run one group at a time (N concurrent `/verify` requests shaped like
NeMo Gym's simple agent's body, or one `/compare` of N answers). Open loop: groups start at a fixed
arrival rate whatever the server's latency. Works against genrm-trio and against the reference
server alike: judge calls are read from genrm-trio's `/metrics` when it has them, or from the
simulated judge's `/stats`.

One job per module: ``payloads`` (the bodies sent), ``client`` (the HTTP client), ``runner``
(the run and its report), ``procfs`` (the /proc reader: a process's CPU, memory, descriptors;
the box's busy CPU), ``output`` (the command line).
"""

from __future__ import annotations

from genrm_trio.app.bench.client import HttpPool
from genrm_trio.app.bench.output import BENCH_DESCRIPTION, add_bench_arguments, run_bench_command
from genrm_trio.app.bench.payloads import answer_text, policy_response, verify_body
from genrm_trio.app.bench.runner import (
    BenchConfig,
    BenchError,
    BenchReport,
    no_group_hint,
    nothing_judged,
    raise_fd_limit,
    rollouts_mismatch,
    run_bench,
)

__all__ = [
    "BENCH_DESCRIPTION",
    "BenchConfig",
    "BenchError",
    "BenchReport",
    "HttpPool",
    "add_bench_arguments",
    "answer_text",
    "no_group_hint",
    "nothing_judged",
    "policy_response",
    "raise_fd_limit",
    "rollouts_mismatch",
    "run_bench",
    "run_bench_command",
    "verify_body",
]
