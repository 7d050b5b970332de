#!/usr/bin/env python3
"""NeMo Gym 0.7.0 runs genrm-trio for real: docs/operations.md's GPU-free trial, as written.

The commands are the fenced bash blocks after `<!-- gym-trial:NAME -->` in docs/operations.md
("A GPU-free trial"), read from there at every run so that page cannot drift from what works.
Each terminal of the page is a bash of its own (a session and process group, so that a Ctrl-C
is a SIGINT to the whole group, as a terminal sends it), started with the page's `env` block
first; the only things this script sets beforehand are that block's variables (the venvs, two
free ports: the box is shared) and Ray's temp directory. Then:

- `links`, then `judge` (`genrm-trio sim-judge --policy`) and `gym` (`gym env start` with the
  shipped `genrm_trio.yaml` and `sim_models.yaml`) in their terminals, until ready;
- `collect`: expect 32 rows with genrm-trio's rewards (not all equal within a group), an empty
  sidecar, 32 judge calls (circular: 16 per group) and 32 policy calls;
- `top`: `genrm-trio top --once` at the URL Gym's head server lists for genrm-trio shows it
  serving, its judge replica and its masked rollouts;
- Ctrl-C in the judge's terminal, `judge-partial` (the comparisons of the policy's answer
  `(variant 3)` fail), `collect-partial`: expect, in each group, 13 scored rows and the 3 rollouts
  of the two failed comparisons in the sidecar as `judge_failed`, and 76 judge calls;
- Ctrl-C in the judge's terminal, `judge-failing` (every judge call fails), `collect-failing`:
  expect no scored row, every rollout in the `_failures.jsonl` sidecar as `judge_failed`, 384
  judge calls, and the log lines the page describes (Gym's `upstream_request_failed` lines, the
  collector's traceback ending in `None of the 32 dispatched rollouts produced a result`);
- Ctrl-C in Gym's terminal: genrm-trio is timed from it (the process group's SIGINT, then
  Gym's own, then Gym's SIGKILL 1 s later); fails if it took 1 s or more, if Gym had to kill it,
  or if it took the two SIGINTs for two stops.

Everything listens on 127.0.0.1 (checked); every process started here is stopped by its PID,
also on failure; the whole run is bounded by --timeout-s. Prints a summary; exits 1 if an
expectation fails, 2 on a usage or setup error. The page's `install` block is not run: an
existing --gym-venv is used, or one is created first with the same pip command.

    python benchmarks/gym_stack.py --gym-venv /work/gym/venv      # reuse (or create) a Gym venv
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from genrm_trio.app.bench import procfs

GYM_VERSION = "0.7.0"
INSTANCE = "genrm_compare_resources_server"  # the shipped config's resources-server instance
AGENT = "genrm_simple_agent"
REPEATS = 16  # the shipped num_rollouts_per_prompt
TASKS = 2
# Gym's own message when a server outlives its 1 s SIGINT grace (cli/env.py RunHelper.shutdown).
KILLED_MARK = "didn't shutdown within the"
# Gym >= 0.7.0 refuses a Python older than 3.13 in its metadata; the brief's install recipe.
GYM_PYTHON = "python3.13"
GYM_PYENV_VERSION = "3.13.0"
LOOPBACK = "127.0.0.1"


class TrialError(Exception):
    """A failed step: one line for the summary."""


def say(message: str) -> None:
    print(f"[gym_stack {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


# --- processes ----------------------------------------------------------------------------------


def _alive(pid: int, start: int) -> bool:
    stat = procfs.stat(pid)
    return stat is not None and stat.start_ticks == start and stat.state not in ("Z", "X")


@dataclass
class Tracked:
    """Processes this script started, and everything they started (seen by session or parent).

    Each entry is (pid, start time), so a PID reused by the system is never signalled."""

    roots: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    seen: dict[int, tuple[int, str]] = field(default_factory=dict)  # pid -> (start, cmdline)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, popen: subprocess.Popen[bytes]) -> None:
        self.roots[name] = popen
        self.scan()

    @contextmanager
    def scanning(self, every_s: float = 0.5) -> Iterator[None]:
        """Scan in the background: a child that starts and loses its parent is still seen."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                self.scan()

        thread = threading.Thread(target=loop, name="scan", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)

    def scan(self) -> None:
        """Record every descendant or session member of a started process (Ray's daemons too)."""
        sessions = {p.pid for p in self.roots.values()}
        with self.lock:
            known = set(sessions) | set(self.seen)
            stats = {pid: procfs.stat(pid) for pid in procfs.pids()}
            changed = True
            while changed:
                changed = False
                for pid, stat in stats.items():
                    if stat is None or pid in known or pid == os.getpid():
                        continue
                    if stat.session in sessions or stat.ppid in known:
                        known.add(pid)
                        changed = True
            for pid in known:
                stat = stats.get(pid)
                if stat is not None and pid not in self.seen:
                    cmd = (procfs.cmdline(pid) or b"").replace(b"\0", b" ")
                    self.seen[pid] = (stat.start_ticks, cmd.decode(errors="replace").strip()[:160])

    def leftovers(self, wait_s: float = 0.0) -> list[tuple[int, str]]:
        """Tracked processes still alive, after waiting up to `wait_s` for them to go."""
        self.scan()
        deadline = time.monotonic() + wait_s
        while True:
            left = [(pid, cmd) for pid, (start, cmd) in self.seen.items() if _alive(pid, start)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)

    def stop(self, name: str, sig: int = signal.SIGINT, grace_s: float = 20.0) -> float | None:
        """Signal one started process by PID, wait; SIGKILL after `grace_s`. Seconds it took."""
        popen = self.roots.get(name)
        if popen is None or popen.poll() is not None:
            return None
        self.scan()
        t0 = time.monotonic()
        popen.send_signal(sig)
        try:
            popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            say(f"{name} (pid {popen.pid}) ignored signal {sig} for {grace_s:g}s: SIGKILL")
            popen.kill()
            popen.wait(timeout=10)
        return time.monotonic() - t0

    def kill_leftovers(self) -> list[tuple[int, str]]:
        """SIGTERM, then SIGKILL, every tracked process still alive 5 s after its parents
        stopped (by PID); what was left."""
        left = self.leftovers(wait_s=5.0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid, _ in left:
                start = self.seen[pid][0]
                if _alive(pid, start):
                    with suppress(ProcessLookupError):
                        os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(
                _alive(pid, self.seen[pid][0]) for pid, _ in left
            ):
                time.sleep(0.05)
        for popen in self.roots.values():
            if popen.poll() is None:
                popen.kill()
            popen.wait(timeout=10)
        return left


class LineLog:
    """A child's stdout+stderr: teed to a file, scanned line by line with arrival times."""

    def __init__(self, stream: IO[bytes], path: Path) -> None:
        self.path = path
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        with self.path.open("w") as out:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                with self._cond:
                    self.lines.append((time.monotonic(), line))
                    self._cond.notify_all()
        with self._cond:
            self.lines.append((time.monotonic(), "\0EOF"))
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout_s: float, since: int = 0) -> tuple[int, float, str]:
        """The first line from index `since` matching `pattern`: (index, time, line)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        i = since
        with self._cond:
            while True:
                while i < len(self.lines):
                    at, line = self.lines[i]
                    if line == "\0EOF":
                        last = self.lines[i - 1][1] if i else ""
                        raise TrialError(
                            f"{self.path.name}: ended before /{pattern}/; last line: {last[:300]}"
                        )
                    if regex.search(line):
                        return i, at, line
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TrialError(f"{self.path.name}: no /{pattern}/ within {timeout_s:g}s")
                self._cond.wait(left)

    def text(self) -> str:
        with self._cond:
            return "\n".join(line for _, line in self.lines)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def start(
    tracked: Tracked,
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> LineLog:
    # Own session: a PID-exact handle on everything it spawns (Tracked.scan), nothing broad.
    popen = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    tracked.add(name, popen)
    assert popen.stdout is not None
    return LineLog(popen.stdout, log_dir / f"{name}.log")


def run_bounded(
    argv: Sequence[str],
    log: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[int, float]:
    """Run to completion (own session, killed by PID on timeout); exit code and seconds."""
    t0 = time.monotonic()
    with log.open("w") as out:
        popen = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            code = popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)
            raise TrialError(f"{' '.join(argv[:3])} ... did not finish in {timeout_s:g}s") from None
    return code, time.monotonic() - t0


# --- the Gym side -------------------------------------------------------------------------------


def ensure_gym_venv(venv: Path, log_dir: Path, timeout_s: float) -> float:
    """Reuse `venv` if it has `bin/gym`, else create it (the brief's recipe); install seconds."""
    if (venv / "bin" / "gym").exists():
        return 0.0
    if venv.exists():
        raise TrialError(f"{venv} exists but has no bin/gym: pass another --gym-venv")
    python = shutil.which(GYM_PYTHON)
    if python is None:
        raise TrialError(f"{GYM_PYTHON} not found: NeMo Gym {GYM_VERSION} needs Python 3.13")
    say(f"installing nemo-gym=={GYM_VERSION} into {venv} (about 1.5 min, 1.4 GB)")
    env = {**os.environ, "PYENV_VERSION": GYM_PYENV_VERSION}
    t0 = time.monotonic()
    code, _ = run_bounded([python, "-m", "venv", str(venv)], log_dir / "gym-venv.log", 120, env)
    if code != 0:
        raise TrialError(f"{python} -m venv {venv} failed (exit {code})")
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--ignore-requires-python"]
    code, _ = run_bounded(
        [*pip, f"nemo-gym=={GYM_VERSION}"], log_dir / "gym-install.log", timeout_s, env
    )
    if code != 0:
        raise TrialError(
            f"pip install nemo-gym=={GYM_VERSION} failed: {log_dir / 'gym-install.log'}"
        )
    return time.monotonic() - t0


# The documented trial: docs/operations.md, "A GPU-free trial". Each step is the fenced bash block
# after an HTML comment `<!-- gym-trial:NAME -->`; this script runs them as written.
DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
STEPS = (
    "install",
    "env",
    "links",
    "judge",
    "gym",
    "collect",
    "top",
    "judge-partial",
    "collect-partial",
    "judge-failing",
    "collect-failing",
)
_STEP = re.compile(
    r"^(?P<indent>[ \t]*)<!-- gym-trial:(?P<name>[\w-]+) -->\n(?P=indent)```bash\n(?P<body>.*?)"
    r"^(?P=indent)```$",
    re.DOTALL | re.MULTILINE,
)


def trial_steps(doc: Path = DOC) -> dict[str, str]:
    """The trial's steps by name: each block's commands, its list indentation removed."""
    steps: dict[str, str] = {}
    for match in _STEP.finditer(doc.read_text(encoding="utf-8")):
        name, indent = match["name"], match["indent"]
        if name in steps:
            raise TrialError(f"{doc}: two blocks for gym-trial:{name}")
        lines = match["body"].splitlines()
        if any(line and not line.startswith(indent) for line in lines):
            raise TrialError(f"{doc}: gym-trial:{name}: a line outside the block's indentation")
        steps[name] = "\n".join(line[len(indent) :] for line in lines) + "\n"
    missing = [name for name in STEPS if name not in steps]
    if missing or len(steps) != len(STEPS):
        raise TrialError(f"{doc}: gym-trial blocks {sorted(steps)}, expected {list(STEPS)}")
    return steps


def _genrm_pid(tracked: Tracked) -> tuple[int, int] | None:
    """(pid, start) of the process Gym launched for the genrm-trio block."""
    tracked.scan()
    wanted = f"NEMO_GYM_CONFIG_PATH={INSTANCE}".encode()
    for pid, (start, cmd) in tracked.seen.items():
        if "app.py" not in cmd or not _alive(pid, start):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ:
            return pid, start
    return None


def _listeners(pids: set[int]) -> list[str]:
    """TCP listen addresses held by these PIDs (`ss`), to check everything is on loopback."""
    try:
        out = subprocess.run(
            ["ss", "-Hltnp"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return ["(ss unavailable)"]
    found = []
    for line in out.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            found.append(line.split()[3])
    return found


# --- checks -------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class PhaseResult:
    name: str
    rows: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    seconds: float
    judge_calls: int
    problems: list[str]
    exit_code: int

    def summary(self) -> list[str]:
        rewards = [r.get("reward") for r in self.rows]
        masked = sum(bool(r.get("mask_sample")) for r in self.rows)
        kinds = Counter(
            str(r.get("_ng_failure_class") or r.get("failure_kind")) for r in self.failures
        )
        groups = Counter(str(r.get("_ng_group_id")) for r in self.rows + self.failures)
        lines = [
            f"{self.name}: {len(self.rows)} rows, {masked} masked; sidecar "
            f"{len(self.failures)} rows {dict(kinds) or ''}; judge calls {self.judge_calls}; "
            f"gym eval run {self.seconds:.1f}s, exit {self.exit_code}",
            f"  _ng_group_id seen by genrm-trio (echoed): {dict(groups)}",
        ]
        by_task: dict[Any, list[float]] = {}
        for r in self.rows:
            by_task.setdefault(r.get("_ng_task_index"), []).append(r.get("reward"))
        for task, values in sorted(by_task.items(), key=lambda kv: str(kv[0])):
            shown = ", ".join(f"{v:.3f}" if isinstance(v, float) else repr(v) for v in values)
            lines.append(f"  task {task} rewards [{shown}]")
        if not rewards:
            lines.append("  (no rows in the main output)")
        lines.extend(f"  FAIL {p}" for p in self.problems)
        return lines


def check_ok(rows: list[dict[str, Any]], failures: list[dict[str, Any]], calls: int) -> list[str]:
    problems = []
    if len(rows) != TASKS * REPEATS:
        problems.append(f"expected {TASKS * REPEATS} rows, got {len(rows)}")
    if failures:
        problems.append(f"expected an empty sidecar, got {len(failures)} rows")
    rewards = [r.get("reward") for r in rows]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in rewards):
        problems.append(f"non-finite or missing rewards: {rewards}")
    if any(r.get("mask_sample") for r in rows):
        problems.append("mask_sample true on a row with a working judge")
    by_task: dict[Any, set[Any]] = {}
    for r in rows:
        by_task.setdefault(r.get("_ng_task_index"), set()).add(r.get("reward"))
    if any(len(values) < 2 for values in by_task.values()):
        problems.append("a group's rewards are all identical (degenerate comparison)")
    # circular, one judge pass: 16 comparisons per group, all through genrm-trio
    if calls != TASKS * REPEATS:
        problems.append(f"expected {TASKS * REPEATS} judge calls (circular), got {calls}")
    return problems


# Step 7's fault: every comparison with the policy's answer "(variant 3)" fails, on every try.
PARTIAL_MASKED = 3  # per group: the rollout with it and its two neighbours in the circle
PARTIAL_FAILED = 2  # comparisons per group
# genrm-trio's 4 attempts of a failed comparison (the shipped genrm_parse_retries: 3), each tried
# 3 times by Gym's genrm_model server (its openai_model client)
GENRM_ATTEMPTS = 4
GYM_TRIES = 3
CALLS_PER_FAILED_COMPARISON = GENRM_ATTEMPTS * GYM_TRIES


def check_partial(
    rows: list[dict[str, Any]], failures: list[dict[str, Any]], calls: int
) -> list[str]:
    problems = []
    scored = Counter(r.get("_ng_task_index") for r in rows)
    masked = Counter(r.get("_ng_task_index") for r in failures)
    if sorted(scored.values()) != [REPEATS - PARTIAL_MASKED] * TASKS:
        problems.append(f"expected {REPEATS - PARTIAL_MASKED} scored rows a group: {scored}")
    if sorted(masked.values()) != [PARTIAL_MASKED] * TASKS:
        problems.append(f"expected {PARTIAL_MASKED} masked rows a group: {masked}")
    if any(r.get("mask_sample") for r in rows):
        problems.append("mask_sample true on a row in the main output")
    if any(
        r.get("_ng_failure_class") != "judge_failed" or r.get("mask_sample") is not True
        for r in failures
    ):
        problems.append("a sidecar row that is not judge_failed with mask_sample true")
    failed = TASKS * PARTIAL_FAILED
    expected = (TASKS * REPEATS - failed) + failed * CALLS_PER_FAILED_COMPARISON
    if calls != expected:
        problems.append(f"expected {expected} judge calls, got {calls}")
    return problems


def check_failing(rows: list[dict[str, Any]], failures: list[dict[str, Any]]) -> list[str]:
    problems = []
    judge_failed = [r for r in failures if r.get("_ng_failure_class") == "judge_failed"]
    if rows:
        problems.append(f"expected no scored rows with a failing judge, got {len(rows)}")
    if len(judge_failed) < REPEATS:
        problems.append(f"expected >= {REPEATS} judge_failed sidecar rows, got {len(judge_failed)}")
    if len(judge_failed) != len(failures):
        problems.append(f"{len(failures) - len(judge_failed)} sidecar rows are not judge_failed")
    if any(r.get("mask_sample") is not True for r in judge_failed):
        problems.append("a judge_failed row without mask_sample true")
    return problems


def judge_stats(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/stats", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
    return result


# --- the trial ----------------------------------------------------------------------------------


@dataclass
class Trial:
    gym_venv: Path
    trio_venv: Path
    work: Path
    timeout_s: float
    debug_logging: bool
    tracked: Tracked = field(default_factory=Tracked)
    deadline: float = 0.0
    ray_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gst-ray-")))
    steps: dict[str, str] = field(default_factory=trial_steps)
    sim_port: int = field(default_factory=free_port)
    head_port: int = field(default_factory=free_port)

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TrialError(f"overall timeout ({self.timeout_s:g}s) reached")
        return remaining

    def terminal_env(self) -> dict[str, str]:
        """A terminal's environment before the documented `env` step runs in it: the variables
        that step reads (free ports: the box is shared), and what only a harness needs."""
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)  # this script's venv is not the terminal's
        env.update(
            GYM_VENV=str(self.gym_venv),
            TRIO_VENV=str(self.trio_venv),
            SIM_PORT=str(self.sim_port),
            HEAD_PORT=str(self.head_port),
            RAY_USAGE_STATS_ENABLED="0",
            # Ray's sockets and logs in our own short directory (AF_UNIX paths are limited to
            # 107 bytes), not in a /tmp/ray shared with other runs.
            RAY_TMPDIR=str(self.ray_dir),
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
        )
        return env

    def script(self, step: str, extra: str = "") -> list[str]:
        """bash running the documented `env` step, then `step` as written (plus `extra`)."""
        body = self.steps["env"] + self.steps[step].rstrip("\n") + extra + "\n"
        return ["bash", "--noprofile", "--norc", "-c", body]

    def open_terminal(self, step: str, ready: str, timeout_s: float, extra: str = "") -> LineLog:
        """A long-running step in a terminal of its own (a session and process group, as a
        terminal gives its foreground job), once its output shows `ready`."""
        say(f"terminal {step}: {self.steps[step].strip()}")
        log = start(
            self.tracked, step, self.script(step, extra), self.work, self.terminal_env(), self.work
        )
        log.wait_for(ready, min(timeout_s, self.left()))
        return log

    def ctrl_c(self, step: str, grace_s: float = 20.0) -> float:
        """Ctrl-C in a step's terminal: SIGINT to its whole process group, as a terminal sends
        it. Seconds until the terminal's shell exited."""
        popen = self.tracked.roots[step]
        self.tracked.scan()
        t0 = time.monotonic()
        with suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGINT)
        try:
            popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            raise TrialError(f"terminal {step} outlived Ctrl-C by {grace_s:g}s") from None
        return time.monotonic() - t0

    def run_step(self, step: str) -> tuple[int, float, str]:
        """A step that runs to completion: exit code, seconds, its output."""
        say(f"step {step}: {self.steps[step].strip()}")
        log = self.work / f"step-{step}.log"
        code, seconds = run_bounded(
            self.script(step), log, self.left(), self.terminal_env(), cwd=self.work
        )
        output = log.read_text(errors="replace")
        if code != 0:
            raise TrialError(f"step {step} exited {code}: {output.strip()[-600:]}")
        return code, seconds, output

    def collect(
        self, step: str, out: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float, int, str]:
        before = judge_stats(self.sim_port)["calls"]
        _, seconds, output = self.run_step(step)
        calls = judge_stats(self.sim_port)["calls"] - before
        path = self.work / out
        failures = path.with_name(path.stem + "_failures.jsonl")
        return _read_jsonl(path), _read_jsonl(failures), seconds, calls, output

    def run(self) -> tuple[list[str], bool]:
        self.deadline = time.monotonic() + self.timeout_s
        lines: list[str] = [f"ran the gym-trial blocks of {DOC} (all but install)"]
        ok = True
        self.run_step("links")
        self.open_terminal("judge", r"^listening on http://", 30.0)
        extra = ""
        if self.debug_logging:  # the one addition to a documented command, and only when asked
            extra = f" \\\n  ++{INSTANCE}.resources_servers.genrm_trio.debug_logging=true"
        t0 = time.monotonic()
        gym = self.open_terminal("gym", r"servers ready!", 300.0, extra)
        lines.append(f"gym env start: all servers ready after {time.monotonic() - t0:.1f}s")
        genrm = _genrm_pid(self.tracked)
        if genrm is None:
            raise TrialError("no process with NEMO_GYM_CONFIG_PATH=" + INSTANCE)
        lines.append(f"genrm-trio pid {genrm[0]}: {self.tracked.seen[genrm[0]][1]}")
        listen = _listeners(set(self.tracked.seen))
        loopback = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")
        foreign = [a for a in listen if not a.startswith(loopback)]
        lines.append(f"listening: {len(listen)} sockets, not on loopback: {foreign or 'none'}")
        if foreign:
            ok = False
            lines.append("  FAIL a started process listens beyond loopback")

        rows, failures, seconds, calls, _ = self.collect("collect", "ok/rollouts.jsonl")
        phase = PhaseResult("working judge", rows, failures, seconds, calls, [], 0)
        phase.problems = check_ok(rows, failures, calls)
        policy = judge_stats(self.sim_port).get("policy_calls")
        if policy != TASKS * REPEATS:
            phase.problems.append(f"expected {TASKS * REPEATS} policy calls, got {policy}")
        lines.extend(phase.summary())
        ok &= not phase.problems

        # genrm-trio top, at the URL Gym's head server gives for it
        _, _, output = self.run_step("top")
        shown = [
            f"{word}: {word in output}"
            for word in ("● serving", "Judge replicas", "masked rollouts", "No active cohorts")
        ]
        lines.append(f"top --once under Gym: {', '.join(shown)}")
        if not all(word.endswith("True") for word in shown):
            ok = False
            lines.append(f"  FAIL top's frame: {output[-1500:]}")

        # Step 7: Ctrl-C the judge, serve one failing the pairs of one answer on the same port.
        self.ctrl_c("judge")
        self.open_terminal("judge-partial", r"^listening on http://", 30.0)
        rows, failures, seconds, calls, _ = self.collect(
            "collect-partial", "partial/rollouts.jsonl"
        )
        phase = PhaseResult("partial (variant 3)", rows, failures, seconds, calls, [], 0)
        phase.problems = check_partial(rows, failures, calls)
        lines.extend(phase.summary())
        ok &= not phase.problems

        # Its all-fail variant: every call fails.
        self.ctrl_c("judge-partial")
        self.open_terminal("judge-failing", r"^listening on http://", 30.0)
        mark = len(gym.lines)
        rows, failures, seconds, calls, output = self.collect(
            "collect-failing", "failing/rollouts.jsonl"
        )
        phase = PhaseResult("failing judge (http_500)", rows, failures, seconds, calls, [], 0)
        phase.problems = check_failing(rows, failures)
        if calls != TASKS * REPEATS * CALLS_PER_FAILED_COMPARISON:
            phase.problems.append(
                f"expected {TASKS * REPEATS * CALLS_PER_FAILED_COMPARISON} judge calls, got {calls}"
            )
        # Gym 0.7.0 ends a collection in which no rollout produced a result with exit 1, after
        # writing the sidecar; the documented step says so instead of failing.
        if "None of the 32 dispatched rollouts produced a result" not in output:
            phase.problems.append("gym eval run did not end as the docs say (exit 1, nothing)")
        if "Traceback" not in output or "no rollout was scored" not in output:
            phase.problems.append("the collector's traceback or the step's echo is missing")
        during = [line for _, line in gym.lines[mark:]]
        attempts = TASKS * REPEATS * GENRM_ATTEMPTS
        upstream = sum("upstream_request_failed" in line for line in during)
        retries = sum("model_retry" in line for line in during)
        failed_groups = sum(
            "disposition=failed" in line and "kind=judge" in line for line in during
        )
        lines.append(
            f"  terminal 2 during it: {len(during)} lines, {upstream} upstream_request_failed, "
            f"{retries} model_retry, {failed_groups} 'disposition=failed ... kind=judge'"
        )
        if (upstream, retries, failed_groups) != (attempts, attempts * (GYM_TRIES - 1), TASKS):
            phase.problems.append("terminal 2's lines differ from what the page says")
        final = "None of the 32 dispatched rollouts produced a result {'judge_failed': 32}"
        if final not in output:
            phase.problems.append(f"the collector did not end with {final!r}")
        lines.extend(phase.summary())
        ok &= not phase.problems

        # Step 8: Ctrl-C in Gym's terminal. The whole process group gets the SIGINT (Gym and
        # every server, genrm-trio too), then Gym sends each server its own and kills any still
        # running 1 s later. genrm-trio is timed from the Ctrl-C.
        mark = len(gym.lines)
        cpu_before = procfs.cpu_ticks(genrm[0])
        sent_at = time.monotonic()
        with suppress(ProcessLookupError):
            os.killpg(self.tracked.roots["gym"].pid, signal.SIGINT)
        cpu_last = cpu_before
        while _alive(*genrm) and time.monotonic() - sent_at < 10:
            cpu_last = procfs.cpu_ticks(genrm[0]) or cpu_last
            time.sleep(0.002)
        exit_s = time.monotonic() - sent_at
        load = os.getloadavg()[0]
        try:
            self.tracked.roots["gym"].wait(timeout=min(60.0, self.left()))
        except subprocess.TimeoutExpired:
            raise TrialError("gym env start outlived its Ctrl-C by 60 s") from None
        gym.join(10)
        after = [line for _, line in gym.lines[mark:]]
        killed = [line for line in after if KILLED_MARK in line]
        # the CPU genrm-trio spent on its stop (the rest is waiting for a core: eight servers
        # and Ray stop at once on this box)
        cpu_ms = (cpu_last - cpu_before) * 1000 / os.sysconf("SC_CLK_TCK")
        lines.append(
            f"genrm-trio exit after the Ctrl-C: {exit_s * 1000:.0f} ms (Gym's grace is 1 s; "
            f"{cpu_ms:.0f} ms of its CPU; load {load:.1f})"
        )
        lines.append(f"  Gym's kill notice: {killed[0] if killed else 'none'}")
        again = [line for line in after if "genrm_trio.serve: received SIGINT again" in line]
        lines.append(f"  genrm-trio's repeated SIGINT: {again[0] if again else 'not received'}")
        if exit_s >= 1.0 or any(INSTANCE in line for line in killed):
            ok = False
            lines.append(f"  FAIL Gym killed {INSTANCE} or it took >= 1 s")
        if any("exiting at once" in line for line in again):
            ok = False
            lines.append("  FAIL the process group's SIGINT and Gym's were taken as two stops")
        self.ctrl_c("judge-failing")
        # The group keys genrm-trio formed (its disposition log lines), prompt digests elided.
        found = (re.findall(r"disposition=\w+ key='([^']*)'", line) for _, line in gym.lines)
        keys = sorted({re.sub("[0-9a-f]{64}", "<prompt digest>", k) for ks in found for k in ks})
        lines.append(f"genrm-trio group keys: {keys}")
        if self.debug_logging:
            shown = [line for _, line in gym.lines if "verify task_index=" in line]
            lines.append(f"genrm-trio debug_logging lines: {len(shown)}; first: {shown[:1]}")
        return lines, ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gym-venv",
        type=Path,
        default=Path(os.environ.get("GENRM_TRIO_GYM_VENV", "/tmp/genrm-trio-gym-venv")),
        help="Python 3.13 venv with nemo-gym (reused if it has bin/gym, else created)",
    )
    parser.add_argument(
        "--trio-venv",
        type=Path,
        default=Path(sys.prefix),
        help="venv with genrm-trio installed (default: this interpreter's)",
    )
    parser.add_argument(
        "--work-dir", type=Path, help="logs and outputs (default: a fresh temp dir)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run")
    parser.add_argument("--install-timeout-s", type=float, default=900.0)
    parser.add_argument(
        "--debug-logging",
        action="store_true",
        help="run the genrm-trio block with debug_logging: true (appended to the documented "
        "gym env start, the one change to a documented command)",
    )
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gst-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    say(f"logs and outputs in {work}")
    try:
        install_s = ensure_gym_venv(args.gym_venv, work, args.install_timeout_s)
    except TrialError as exc:
        print(f"gym_stack: setup error: {exc}", file=sys.stderr)
        return 2
    try:
        trial = Trial(args.gym_venv, args.trio_venv, work, args.timeout_s, args.debug_logging)
    except TrialError as exc:
        print(f"gym_stack: setup error: {exc}", file=sys.stderr)
        return 2
    lines: list[str] = []
    ok = False
    try:
        with trial.tracked.scanning():
            lines, ok = trial.run()
    except TrialError as exc:
        lines.append(f"FAIL {exc}")
    finally:
        for name in list(trial.tracked.roots):
            trial.tracked.stop(name, signal.SIGINT, grace_s=15)
        left = trial.tracked.kill_leftovers()
        shutil.rmtree(trial.ray_dir, ignore_errors=True)
    if left:
        # Ray's dashboard leaves multiprocessing helpers behind after Gym's own shutdown: noted
        # (and killed); anything else surviving is a failure.
        ours = [
            (pid, cmd) for pid, cmd in left if "multiprocessing" not in cmd and "ray" not in cmd
        ]
        ok &= not ours
        lines.append(f"{len(left)} processes outlived Gym's shutdown (killed by PID):")
        lines.extend(f"  {pid} {cmd[:110]}" for pid, cmd in left)
        if ours:
            lines.append(f"FAIL {len(ours)} of them are not Ray's")
    else:
        lines.append(f"no process left running (tracked {len(trial.tracked.seen)})")
    total = time.monotonic() - t0
    lines.append(f"total {total:.1f}s (Gym install {install_s:.1f}s); logs in {work}")
    print(
        "\n".join(["", "=== gym_stack summary ===", *lines, "PASS" if ok else "FAIL"]), flush=True
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
