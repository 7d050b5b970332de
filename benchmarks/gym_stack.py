#!/usr/bin/env python3
"""NeMo Gym 0.7.0 runs genrm-trio for real (issue #13 item 5, "With Gym").

`gym env start` launches the shipped genrm_compare config with its one rename
(`genrm-trio gym-root`'s `configs/genrm_trio.yaml`) plus three fake model servers, all Gym
`openai_model` servers: `policy_model` and `policy_model_reasoning_off` (the shipped config's two
agents name them) in front of a tiny policy served from this process, and `genrm_model` (replacing
the shipped local-vLLM block) in front of `genrm-trio sim-judge`. Then `gym eval run --no-serve
--agent genrm_simple_agent --num-repeats 16` collects two tasks twice: with a working judge
(expect 32 rows with genrm-trio's rewards) and with a judge failing every call (expect every
rollout in the `_failures.jsonl` sidecar as `judge_failed`). Last, Gym's own shutdown (SIGINT,
then SIGKILL after 1 s) is timed for the genrm-trio process.

Everything listens on 127.0.0.1; every process started here is stopped by its PID, also on
failure; the whole run is bounded by --timeout-s. Prints a summary; exits 1 if an expectation
fails, 2 on a usage or setup error.

    python benchmarks/gym_stack.py --gym-venv /work/gym/venv      # reuse (or create) a Gym venv
"""

from __future__ import annotations

import argparse
import itertools
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


# --- the fake policy ----------------------------------------------------------------------------
# The simulated judge only answers judge-shaped requests (metadata.response_1/2), and identical
# answers would make every comparison a tie; so the policy is served here: a Responses API body
# (what Gym's openai_model validates as openai's Response) with a different answer per call.

_ANSWER_STYLES = (
    "Short answer: {n}.",
    "Let me think step by step. First, the question asks for {n}. So the answer is {n}.",
    "## Answer\n\n- **{n}**\n- because it follows from the premise\n\nHope this helps!",
    "The answer is {n}, and here is a longer justification: " + "details " * 12,
)


class _PolicyHandler(BaseHTTPRequestHandler):
    counter: Iterator[int]
    lock: threading.Lock

    def log_message(self, format: str, *args: Any) -> None:  # quiet: Gym's log is enough
        pass

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": "fake-policy", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self.path.endswith("/responses"):
            self._send(404, {"error": "only /v1/responses"})
            return
        with self.lock:
            n = next(self.counter)
        text = _ANSWER_STYLES[n % len(_ANSWER_STYLES)].format(n=n)
        self._send(
            200,
            {
                "id": f"resp_policy_{n}",
                "object": "response",
                "created_at": int(time.time()),
                "model": body.get("model", "fake-policy"),
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "id": f"msg_policy_{n}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                ],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    "input_tokens": 10,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": len(text) // 4,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 10 + len(text) // 4,
                },
            },
        )


@contextmanager
def fake_policy() -> Iterator[int]:
    """Serve the policy on a loopback port in a thread of this process; yields the port."""
    handler = type(
        "PolicyHandler", (_PolicyHandler,), {"counter": itertools.count(), "lock": threading.Lock()}
    )
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-policy", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


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


def gym_root(trio_venv: Path) -> Path:
    try:
        out = subprocess.run(
            [str(trio_venv / "bin" / "genrm-trio"), "gym-root"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise TrialError(f"{trio_venv}: no working genrm-trio ({exc})") from None
    return Path(out.strip())


def uv_venv_dir(work: Path, gym_venv: Path, trio_venv: Path) -> Path:
    """`+uv_venv_dir`: DIR/<server type>/<name>/.venv for every server started (Gym's
    get_venv_path); with `+skip_venv_if_present=true` Gym only sources them, no `uv` needed."""
    root = work / "venvs"
    links = {
        "resources_servers/genrm_trio": trio_venv,
        "responses_api_models/openai_model": gym_venv,
        "responses_api_agents/simple_agent": gym_venv,
        "environment_servers/legacy_agent": gym_venv,
    }
    for server, target in links.items():
        (root / server).mkdir(parents=True, exist_ok=True)
        (root / server / ".venv").symlink_to(target.resolve(), target_is_directory=True)
    return root


def models_config(path: Path, policy_port: int, judge_port: int) -> Path:
    """The extra config: the fake policy behind both agents' model servers, and `genrm_model`
    as an openai_model in front of the simulated judge (`_delete_key` drops the shipped
    local-vLLM `genrm_model` block, which would otherwise be started too)."""

    def openai_model(port: int, model: str) -> dict[str, Any]:
        return {
            "entrypoint": "app.py",
            "openai_base_url": f"http://{LOOPBACK}:{port}/v1",
            "openai_api_key": "unused",
            "openai_model": model,
        }

    config = {
        "policy_model": {"responses_api_models": {"openai_model": openai_model(policy_port, "p")}},
        "policy_model_reasoning_off": {
            "responses_api_models": {"openai_model": openai_model(policy_port, "p")}
        },
        "genrm_model": {
            "responses_api_models": {
                "_delete_key": "genrm_model",
                "openai_model": openai_model(judge_port, "sim-judge"),
            }
        },
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def tasks_file(path: Path, gym_venv: Path) -> Path:
    """The first TASKS rows of Gym's shipped genrm_compare example data."""
    sources = list(gym_venv.glob("lib/python3*/site-packages/resources_servers/genrm_compare"))
    if not sources:
        raise TrialError(f"{gym_venv}: no resources_servers/genrm_compare in site-packages")
    rows = (sources[0] / "data" / "example.jsonl").read_text().splitlines()[:TASKS]
    path.write_text("".join(line + "\n" for line in rows))
    return path


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

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TrialError(f"overall timeout ({self.timeout_s:g}s) reached")
        return remaining

    def gym_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.update(
            # Ray (started by `gym env start` itself) on loopback: with Ray "clusters" disabled
            # its node address is 127.0.0.1 (ray._private.services.get_node_ip_address).
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            RAY_USAGE_STATS_ENABLED="0",
            # Ray's sockets and logs in our own short directory (AF_UNIX paths are limited to
            # 107 bytes), not in a /tmp/ray shared with other runs.
            RAY_TMPDIR=str(self.ray_dir),
            PATH=f"{self.gym_venv / 'bin'}:{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
        )
        return env

    def start_judge(self, port: int, flags: Sequence[str], name: str) -> None:
        argv = [str(self.trio_venv / "bin" / "genrm-trio"), "sim-judge", "--host", LOOPBACK]
        log = start(self.tracked, name, [*argv, "--port", str(port), *flags], self.work)
        log.wait_for(r"^listening on http://", min(30.0, self.left()))

    def collect(
        self, name: str, tasks: Path, head: list[str], judge_port: int, expect_nothing: bool
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float, int, int]:
        out = self.work / name / "rollouts.jsonl"
        before = judge_stats(judge_port)["calls"]
        argv = [
            str(self.gym_venv / "bin" / "gym"),
            "eval",
            "run",
            "--no-serve",
            "--agent",
            AGENT,
            "--input",
            str(tasks),
            "--output",
            str(out),
            "--num-repeats",
            str(REPEATS),
            # both 16-rollout groups admitted at once (each group needs all its members in flight)
            "--concurrency",
            str(TASKS * REPEATS),
            *head,
        ]
        say(f"{name}: {' '.join(argv[1:])}")
        log = self.work / f"eval-{name}.log"
        code, seconds = run_bounded(argv, log, self.left(), self.gym_env(), cwd=self.work)
        # Gym 0.7.0 ends a collection in which no rollout produced a result with exit 1
        # (rollout_collection.py), after writing the sidecar: expected with a failing judge.
        nothing = "None of the" in log.read_text(errors="replace") and "produced a result" in (
            log.read_text(errors="replace")
        )
        if code != 0 and not (expect_nothing and nothing):
            raise TrialError(f"gym eval run ({name}) exited {code}: {log}")
        calls = judge_stats(judge_port)["calls"] - before
        failures_path = out.with_name(out.stem + "_failures.jsonl")
        return _read_jsonl(out), _read_jsonl(failures_path), seconds, calls, code

    def run(self) -> tuple[list[str], bool]:
        self.deadline = time.monotonic() + self.timeout_s
        lines: list[str] = []
        ok = True
        root = gym_root(self.trio_venv)
        config = root / "resources_servers" / "genrm_trio" / "configs" / "genrm_trio.yaml"
        if not config.is_file():
            raise TrialError(f"{config}: missing (genrm-trio gym-root)")
        venvs = uv_venv_dir(self.work, self.gym_venv, self.trio_venv)
        tasks = tasks_file(self.work / "tasks.jsonl", self.gym_venv)
        judge_port = free_port()
        head_port = free_port()
        head = [f"+head_server.host={LOOPBACK}", f"+head_server.port={head_port}"]
        with fake_policy() as policy_port:
            self.start_judge(judge_port, [], "sim-judge")
            extra = models_config(self.work / "models.yaml", policy_port, judge_port)
            argv = [
                str(self.gym_venv / "bin" / "gym"),
                "env",
                "start",
                # the shipped config as a Gym user names it: found through --search-dir
                "--config",
                "resources_servers/genrm_trio/configs/genrm_trio.yaml",
                "--config",
                str(extra),
                "--search-dir",
                str(root),
                "+skip_venv_if_present=true",
                f"+uv_venv_dir={venvs}",
                *head,
            ]
            if self.debug_logging:
                argv.append(f"++{INSTANCE}.resources_servers.genrm_trio.debug_logging=true")
            say(f"gym {' '.join(argv[1:])}")
            t0 = time.monotonic()
            # cwd: Hydra writes outputs/<date>/ there (and Gym also looks for servers there)
            gym = start(
                self.tracked, "gym-env-start", argv, self.work, env=self.gym_env(), cwd=self.work
            )
            gym.wait_for(r"servers ready!", min(300.0, self.left()))
            startup = time.monotonic() - t0
            lines.append(f"gym env start: all servers ready after {startup:.1f}s")
            genrm = _genrm_pid(self.tracked)
            if genrm is None:
                raise TrialError("no process with NEMO_GYM_CONFIG_PATH=" + INSTANCE)
            pid_line = f"genrm-trio pid {genrm[0]}: {self.tracked.seen[genrm[0]][1]}"
            lines.append(pid_line)
            listen = _listeners(set(self.tracked.seen))
            loopback = ("127.0.0.1:", "[::1]:", "[::ffff:127.0.0.1]:")
            foreign = [a for a in listen if not a.startswith(loopback)]
            lines.append(f"listening: {len(listen)} sockets, not on loopback: {foreign or 'none'}")
            if foreign:
                ok = False
                lines.append("  FAIL a started process listens beyond loopback")

            rows, failures, seconds, calls, code = self.collect(
                "ok", tasks, head, judge_port, False
            )
            phase = PhaseResult("working judge", rows, failures, seconds, calls, [], code)
            phase.problems = check_ok(rows, failures, calls)
            lines.extend(phase.summary())
            ok &= not phase.problems

            # Same Gym stack, the judge replaced by one failing every call (port reused, so
            # Gym's genrm_model keeps pointing at it).
            self.tracked.stop("sim-judge", signal.SIGINT)
            self.start_judge(judge_port, ["--fault", "http_500"], "sim-judge-failing")
            rows, failures, seconds, calls, code = self.collect(
                "failing", tasks, head, judge_port, True
            )
            phase = PhaseResult(
                "failing judge (http_500)", rows, failures, seconds, calls, [], code
            )
            phase.problems = check_failing(rows, failures)
            lines.extend(phase.summary())
            ok &= not phase.problems

            # Gym's shutdown: SIGINT to `gym env start`, which SIGINTs each server and kills
            # any still running 1 s later. Time the genrm-trio process from Gym's announcement.
            mark = len(gym.lines)
            gym_pid = self.tracked.roots["gym-env-start"].pid
            os.kill(gym_pid, signal.SIGINT)
            cpu_before = procfs.cpu_ticks(genrm[0])
            _, sent_at, _ = gym.wait_for(r"Sending interrupt signals to servers", 30, since=mark)
            cpu_last = cpu_before
            while _alive(*genrm) and time.monotonic() - sent_at < 10:
                cpu_last = procfs.cpu_ticks(genrm[0]) or cpu_last
                time.sleep(0.002)
            exit_s = time.monotonic() - sent_at
            load = os.getloadavg()[0]
            self.tracked.roots["gym-env-start"].wait(timeout=min(60.0, self.left()))
            gym.join(10)
            killed = [line for _, line in gym.lines[mark:] if KILLED_MARK in line]
            got = [
                at for at, line in gym.lines[mark:] if "genrm_trio.serve: received SIGINT" in line
            ]
            # Where the time went: until genrm-trio logged the signal, and its own CPU time
            # (the rest is waiting for a core: eight servers stop at once on this box).
            logged = f"{(got[0] - sent_at) * 1000:.0f} ms" if got else "not seen"
            cpu_ms = (cpu_last - cpu_before) * 1000 / os.sysconf("SC_CLK_TCK")
            lines.append(
                f"genrm-trio exit after Gym's SIGINT: {exit_s * 1000:.0f} ms (Gym's grace is 1 s;"
                f" its SIGINT line after {logged}; {cpu_ms:.0f} ms of its CPU; load {load:.1f})"
            )
            lines.append(f"  Gym's kill notice: {killed[0] if killed else 'none'}")
            if exit_s >= 1.0 or any(INSTANCE in line for line in killed):
                ok = False
                lines.append(f"  FAIL Gym killed {INSTANCE} or it took >= 1 s")
            self.tracked.stop("sim-judge-failing", signal.SIGINT)
            # The group keys genrm-trio formed (its disposition log lines), prompt digests elided.
            found = (re.findall(r"disposition=\w+ key='([^']*)'", line) for _, line in gym.lines)
            keys = sorted(
                {re.sub("[0-9a-f]{64}", "<prompt digest>", k) for ks in found for k in ks}
            )
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
        help="run the genrm-trio block with debug_logging: true",
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
    trial = Trial(args.gym_venv, args.trio_venv, work, args.timeout_s, args.debug_logging)
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
