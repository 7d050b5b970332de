"""`genrm-trio demo`: the simulated judge and the service in one process, four 16-rollout groups.

Starts the service (the real engine and HTTP app on hypercorn, 127.0.0.1, a free port) with the
in-process simulated judge, sends every rollout of every group to `POST /verify` over real HTTP,
and shows the rewards and masks as a table. One group has an answer that makes the judge fail, so
the two comparisons touching it fail and exactly their three rollouts are masked, while the other
13 keep their scores. Exits 0 only if every group came out as intended.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, final

import httpx
import trio
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from genrm_trio.app.bench.payloads import policy_response
from genrm_trio.app.serve import bind_socket, serve_app
from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.domain.exceptions import describe
from genrm_trio.engine.engine import open_engine
from genrm_trio.http.app import create_app
from genrm_trio.testing import FaultRule, SimConfig, SimJudge

ROLLOUTS: Final = 16
FAULT_MARKER: Final = "[judge-trips-here]"
FAULTY_GROUP: Final = 2  # 0-based: the third group
FAULTY_ROLLOUT: Final = 5
# Circular pairs are (i, i+1 mod N): the marked rollout 5 is in (4, 5) and (5, 6), so exactly
# those two comparisons fail and their members 4, 5 and 6 are masked.
EXPECTED_MASKED: Final = frozenset({4, 5, 6})
EXPECTED_FAILED_COMPARISONS: Final = 2
DEMO_LIMIT_S: Final = 50.0

PROMPTS: Final = (
    "Explain in two sentences why the sky is blue.",
    "What is the time complexity of binary search, and why?",
    "Give one practical tip for writing readable Python functions.",
    "Why does ice float on water?",
)

_OPENINGS: Final = (
    "In short,",
    "Put simply,",
    "The key idea:",
    "Briefly,",
    "Here is the gist:",
    "To answer directly,",
    "Roughly speaking,",
    "The main reason is that",
)
_BODIES: Final = (
    (
        "sunlight scatters off air molecules, and short blue wavelengths scatter far more than "
        "red ones (Rayleigh scattering), so blue light reaches us from every direction.",
        "air scatters blue light more strongly than red.",
        "the sky reflects the ocean.",
        "molecules in the atmosphere scatter shorter wavelengths most; our eyes see that "
        "scattered blue light across the whole sky.",
    ),
    (
        "O(log n): each step halves the remaining sorted range, so about log2(n) comparisons "
        "find the target or show it is absent.",
        "it is logarithmic because the search space halves every iteration.",
        "O(n), since it may look at every element.",
        "O(log n) on a sorted array, because one comparison discards half of the candidates.",
    ),
    (
        "give each function one job and a name that says what it returns.",
        "keep functions short, name them after what they do, and type-annotate the parameters.",
        "use global variables so every function can see the data.",
        "prefer early returns over deep nesting, and document the why rather than the how.",
    ),
    (
        "water expands as it freezes: hydrogen bonds lock the molecules into an open lattice, "
        "so ice is about 9% less dense than liquid water.",
        "ice is less dense than water because its crystal structure holds molecules further apart.",
        "ice contains trapped air bubbles that make it float.",
        "frozen water forms a hexagonal lattice that takes more volume than the liquid.",
    ),
)


def _answer(group: int, rollout: int) -> str:
    body = _BODIES[group][(rollout * 3 + group) % len(_BODIES[group])]
    text = f"{_OPENINGS[(rollout + group) % len(_OPENINGS)]} {body} (draft {rollout + 1})"
    if group == FAULTY_GROUP and rollout == FAULTY_ROLLOUT:
        text += f" {FAULT_MARKER}"
    return text


def verify_body(group: int, rollout: int, group_id: str) -> dict[str, Any]:
    """The `/verify` body of one demo rollout, shaped like NeMo Gym's simple agent's."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": PROMPTS[group], "type": "message"}],
            "tools": [],
            "parallel_tool_calls": False,
        },
        "response": policy_response(_answer(group, rollout)),
        "_ng_task_index": group,
        "_ng_group_id": group_id,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": rollout,
    }


def demo_settings() -> Settings:
    """Cohorts of 16, circular comparisons, short deadlines, quick retries."""
    return settings_from_mapping(
        {
            "num_rollouts_per_prompt": ROLLOUTS,
            "comparison_strategy": "circular",
            "cohort_collection_timeout_s": 30.0,
            "cohort_evaluation_timeout_s": 30.0,
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 1,
            "genrm_parse_retry_sleep_s": 0.01,
        },
        file="<demo>",
    )


def demo_judge() -> SimJudge:
    """The simulated judge: a little latency, and budget exhaustion on the marked answer."""
    return SimJudge(
        SimConfig(
            latency_s=0.01,
            jitter_s=0.02,
            seed=7,
            rules=(FaultRule(fault="budget_exhausted", match=FAULT_MARKER),),
        )
    )


@final
@dataclass(slots=True)
class GroupResult:
    """The replies of one group, by rollout index."""

    index: int
    rows: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def faulty(self) -> bool:
        return self.index == FAULTY_GROUP

    @property
    def failed_comparisons(self) -> int:
        """Failed comparisons of the group, from a scored row's failed-comparison rate."""
        for i, row in self.rows.items():
            rate = row.get("genrm_failed_comparison_rate_per_group")
            if i not in self.masked and isinstance(rate, int | float):
                return round(rate * ROLLOUTS)  # circular: C = N comparisons
        return 0

    @property
    def masked(self) -> set[int]:
        return {i for i, row in self.rows.items() if row.get("mask_sample") is True}

    def problems(self) -> list[str]:
        """Why this group did not come out as intended (empty when it did)."""
        found = list(self.errors)
        if len(self.rows) != ROLLOUTS:
            found.append(f"{len(self.rows)} of {ROLLOUTS} rollouts answered")
        expected = EXPECTED_MASKED if self.faulty else frozenset()
        if self.masked != expected:
            found.append(f"masked {sorted(self.masked)}, expected {sorted(expected)}")
        wanted = EXPECTED_FAILED_COMPARISONS if self.faulty else 0
        if self.rows and self.failed_comparisons != wanted:
            found.append(f"{self.failed_comparisons} failed comparisons, expected {wanted}")
        for i, row in sorted(self.rows.items()):
            reward = row.get("reward")
            if not isinstance(reward, int | float) or not math.isfinite(reward):
                found.append(f"rollout {i}: reward {reward!r} is not a finite number")
            elif i in self.masked:
                if row.get("failure_kind") != "judge_failed" or reward != 0.0:
                    found.append(f"rollout {i}: masked row is not a judge_failed failsafe row")
            elif row.get("mask_sample") is not False or row.get("failure_kind") is not None:
                found.append(f"rollout {i}: scored row carries a failure")
            elif self.faulty:
                rate = row.get("genrm_masked_rollout_rate_per_group")
                if rate != len(EXPECTED_MASKED) / ROLLOUTS:
                    found.append(f"rollout {i}: masked rollout rate {rate!r}")
        return found


@final
@dataclass(frozen=True, slots=True)
class DemoOutcome:
    groups: Sequence[GroupResult]
    judge_calls: int
    seconds: float
    log_lines: Sequence[str]

    def problems(self) -> list[str]:
        return [f"group {g.index + 1}: {p}" for g in self.groups for p in g.problems()]


async def _run_group(
    client: httpx.AsyncClient, group: int, on_reply: Any, result: GroupResult
) -> None:
    group_id = f"demo-{uuid.uuid4().hex[:12]}-g{group + 1}"

    async def one(rollout: int) -> None:
        try:
            response = await client.post("/verify", json=verify_body(group, rollout, group_id))
        except httpx.HTTPError as exc:
            result.errors.append(f"rollout {rollout}: {type(exc).__name__}: {exc}")
        else:
            if response.status_code == 200:
                result.rows[rollout] = response.json()
            else:
                result.errors.append(
                    f"rollout {rollout}: HTTP {response.status_code} {response.text[:200]}"
                )
        on_reply()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for rollout in range(ROLLOUTS):
            nursery.start_soon(one, rollout)
    result.seconds = time.perf_counter() - start


async def run_demo_groups(
    *, groups: int = len(PROMPTS), progress: Progress | None = None
) -> DemoOutcome:
    """Serve on 127.0.0.1 (free port) with the simulated judge and score `groups` groups."""
    settings = demo_settings()
    judge = demo_judge()
    results = [GroupResult(index=g) for g in range(groups)]
    task = progress.add_task("rollouts scored", total=groups * ROLLOUTS) if progress else None

    def on_reply() -> None:
        if progress is not None and task is not None:
            progress.advance(task)

    start = time.perf_counter()
    with trio.fail_after(DEMO_LIMIT_S):
        async with open_engine(settings, judge) as engine:
            app = create_app(engine, settings)
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                port = await nursery.start(
                    partial(
                        serve_app,
                        app,
                        bind_socket("127.0.0.1", 0),
                        shutdown_trigger=stop.wait,
                        grace_s=1.0,
                    )
                )
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}",
                    timeout=40.0,
                    trust_env=False,
                    limits=httpx.Limits(max_connections=ROLLOUTS),
                ) as client:
                    for result in results:
                        await _run_group(client, result.index, on_reply, result)
                        if progress is not None:
                            progress.console.print(_group_line(result))
                stop.set()
    return DemoOutcome(
        groups=results,
        judge_calls=judge.statistics().calls,
        seconds=time.perf_counter() - start,
        log_lines=(),
    )


def _group_line(result: GroupResult) -> str:
    masked = sorted(result.masked)
    scored = len(result.rows) - len(masked)
    text = f"group {result.index + 1}: {scored} scored, {len(masked)} masked"
    if masked:
        text += f" (rollouts {', '.join(map(str, masked))})"
    if result.errors:
        text += f", {len(result.errors)} errors"
    return f"{text} in {result.seconds:.2f}s"


def results_table(outcome: DemoOutcome) -> Table:
    """Rewards by rollout (rows) and group (columns); masked rows say `masked`, not 0.0."""
    table = Table(title="Rewards per rollout and group")
    table.add_column("rollout", justify="right")
    for result in outcome.groups:
        label = f"group {result.index + 1}"
        if result.faulty:
            label += "\n(judge faults)"
        table.add_column(label, justify="right")
    for rollout in range(ROLLOUTS):
        cells = [str(rollout)]
        for result in outcome.groups:
            row = result.rows.get(rollout)
            if row is None:
                cells.append("[red]error[/red]")
            elif row.get("mask_sample") is True:
                cells.append("[bold red]masked[/bold red]")
            else:
                cells.append(f"{row.get('reward', float('nan')):.3f}")
        table.add_row(*cells)
    table.add_section()
    table.add_row("scored", *[str(len(r.rows) - len(r.masked)) for r in outcome.groups])
    table.add_row("masked", *[str(len(r.masked)) for r in outcome.groups])
    return table


def explanation(outcome: DemoOutcome) -> str:
    masked = ", ".join(map(str, sorted(EXPECTED_MASKED)))
    kept = ROLLOUTS - len(EXPECTED_MASKED)
    return (
        f"[bold]Partial masking.[/bold] In group {FAULTY_GROUP + 1} the judge could not finish "
        f"the {EXPECTED_FAILED_COMPARISONS} comparisons that involve rollout {FAULTY_ROLLOUT} "
        f"(simulated output-budget exhaustion on every attempt). Only the rollouts of those "
        f"comparisons ({masked}) are masked: their rows carry mask_sample: true, failure_kind: "
        f"judge_failed and a placeholder reward 0.0. The other {kept} keep their rewards, each "
        "still averaged over both of its comparisons. Before partial masking, one failed "
        f"comparison masked all {ROLLOUTS} rollouts of the group.\n\n"
        "[bold]Trainer requirement.[/bold] The placeholder 0.0 is not a score: a group-relative "
        "trainer must leave masked rows out of the group baseline, or they shift their siblings' "
        "advantages. NeMo RL: env.should_mask_flagged_samples: true and "
        "grpo.masked_reward_policy: exclude_infra (or exclude)."
    )


_ROLLOUT_INDEX: Final = re.compile(r"rollout_index=(\d+)")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@final
class _Collect(logging.Handler):
    """Keeps the dropped-comparison and masked-rollout log lines to show them after the table."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("GenRM dropped comparison", "GenRM masked one rollout")):
            self.lines.append(message)


def run_demo(*, verbose: bool = False, console: Console | None = None) -> int:
    """Run the demo and print its report; 0 only if every group came out as intended."""
    console = console or Console()
    logger = logging.getLogger("genrm_trio")
    saved = (logger.level, logger.propagate)
    collect = _Collect()
    logger.addHandler(collect)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = verbose
    if verbose:
        from genrm_trio.app.logs import configure_logging

        configure_logging(logging.INFO)
    console.print(
        f"[bold]genrm-trio demo[/bold]: simulated judge + service on 127.0.0.1, "
        f"{len(PROMPTS)} groups of {ROLLOUTS} rollouts sent to POST /verify over HTTP "
        f"(group {FAULTY_GROUP + 1} has an answer that makes the judge fail)."
    )
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            outcome = trio.run(partial(run_demo_groups, progress=progress))
    except Exception as exc:  # the demo's own failure report, not a traceback: every error
        console.print(f"[bold red]demo FAILED[/bold red]: {escape(describe(exc))}")
        return 1
    finally:
        logger.removeHandler(collect)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
    outcome = DemoOutcome(outcome.groups, outcome.judge_calls, outcome.seconds, collect.lines)
    console.print(results_table(outcome))
    failed = sum(g.failed_comparisons for g in outcome.groups)
    console.print(
        f"{len(outcome.groups) * ROLLOUTS} rollouts in {len(outcome.groups)} groups scored in "
        f"{outcome.seconds:.2f}s with {outcome.judge_calls} simulated judge calls "
        f"({failed} comparisons failed)."
    )
    if outcome.log_lines:
        console.print("[bold]The server logged[/bold] (WARNING, shortened):")
        masked_lines = [line for line in outcome.log_lines if line.startswith("GenRM masked")]
        for line in outcome.log_lines:
            if not line.startswith("GenRM masked"):
                console.print(f"  {escape(_shorten(line, 150))}")
        if masked_lines:
            indexes = ", ".join(
                match.group(1)
                for line in masked_lines
                if (match := _ROLLOUT_INDEX.search(line)) is not None
            )
            console.print(
                f"  GenRM masked one rollout of key=… ({len(masked_lines)} lines: "
                f"rollout_index={indexes})"
            )
    console.print(Panel(explanation(outcome), expand=False))
    problems = outcome.problems()
    if problems:
        console.print("[bold red]demo FAILED[/bold red]: not every group came out as intended:")
        for problem in problems:
            console.print(f"  - {escape(problem)}")
        return 1
    console.print("[bold green]demo OK[/bold green]: every group came out as intended.")
    return 0
