"""`genrm-trio top` (docs/operations.md, "Watching it"): frames rendered to text from a live
server's `/metrics`, `/cohorts` and `/judge/replicas`, a server that is down or restarts, the
quantiles and rates the frames compute, and the command itself (`--once`, Ctrl-C)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fake_replicas import replica_stats
from procs import answers, bodies, client, command, run_group, start_server
from rich.console import Console, Group
from rich.text import Text
from watched import GROUP, KEY_ENV, Watched, load, watched_server

from genrm_trio.app.logs import EscapingFormatter
from genrm_trio.app.top import fetch, open_client
from genrm_trio.app.top_frame import (
    FetchFailed,
    Snapshot,
    View,
    Watcher,
    frame,
    histogram_quantile,
    parse_metrics,
)
from genrm_trio.http.app import replica_view
from genrm_trio.judge.base import JudgeStalled, JudgeTimeout

SLOW = "[slow]"


def text(view: View, width: int = 140) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(frame(view))
    return console.export_text()


def look(watcher: Watcher, http: httpx.Client) -> tuple[Snapshot | FetchFailed, str]:
    result = fetch(http)
    return result, text(watcher.update(result, time.time()))


# --- pure parts ----------------------------------------------------------------------------------


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (float("inf"), 40.0)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)  # rank 10: the first bound
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)  # rank 20: 0.1 + 0.4 * 10/20
    assert histogram_quantile(0.95, buckets) == pytest.approx(0.9)  # rank 38: 0.5 + 0.5 * 8/10
    assert histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    # a rank in the +Inf bucket answers the highest finite bound
    assert histogram_quantile(0.99, [(1.0, 1.0), (float("inf"), 10.0)]) == 1.0


EXPOSITION = """\
# TYPE genrm_trio_cohorts_terminal_total counter
genrm_trio_cohorts_terminal_total{{state="scored"}} {scored}
genrm_trio_cohorts_terminal_total{{state="partially_masked"}} 0
genrm_trio_cohorts_terminal_total{{state="failed"}} {failed}
# TYPE genrm_trio_cohort_rollouts_total counter
genrm_trio_cohort_rollouts_total{{state="scored"}} {rollouts}
genrm_trio_cohort_rollouts_total{{state="failed"}} {failed_rollouts}
# TYPE genrm_trio_masked_rollouts_total counter
genrm_trio_masked_rollouts_total{{cause="alone"}} {masked}
genrm_trio_masked_rollouts_total{{cause="whole_group"}} {masked_whole}
# TYPE genrm_trio_judge_attempt_seconds histogram
genrm_trio_judge_attempt_seconds_bucket{{le="0.1"}} {fast}
genrm_trio_judge_attempt_seconds_bucket{{le="1.0"}} {all}
genrm_trio_judge_attempt_seconds_bucket{{le="+Inf"}} {all}
genrm_trio_judge_attempt_seconds_count {all}
genrm_trio_judge_attempt_seconds_sum 1.0
# TYPE genrm_trio_reward_latency_seconds histogram
genrm_trio_reward_latency_seconds_bucket{{le="0.05"}} {reward_fast}
genrm_trio_reward_latency_seconds_bucket{{le="0.25"}} {scored}
genrm_trio_reward_latency_seconds_bucket{{le="+Inf"}} {scored}
genrm_trio_reward_latency_seconds_count {scored}
genrm_trio_reward_latency_seconds_sum 1.0
# TYPE genrm_trio_eager_comparisons_total counter
genrm_trio_eager_comparisons_total {eager}
# TYPE process_start_time_seconds gauge
process_start_time_seconds {start}
"""


def snapshot(at: float, *, start: float = 1000.0, **values: float) -> Snapshot:
    numbers = {"scored": 0, "failed": 0, "rollouts": 0, "masked": 0, "masked_whole": 0}
    numbers |= {"failed_rollouts": 0, "fast": 0, "all": 0}
    numbers |= {"reward_fast": 0, "eager": 0}
    numbers.update(values)
    series = parse_metrics(EXPOSITION.format(start=start, **numbers))
    return Snapshot(at, series, [], [])


def test_rates_and_quantiles_are_over_the_window() -> None:
    watcher = Watcher("http://x")
    first = text(watcher.update(snapshot(0.0, scored=10, rollouts=40, fast=100, all=100), 1e6))
    assert "groups scored     —" in first  # one snapshot: no rate yet
    one_line = " ".join(first.split())  # the table's title wraps
    assert "first look: latencies since the start; rates need a second sample" in one_line
    later = snapshot(
        5.0, scored=20, rollouts=80, masked=4, fast=100, all=110, reward_fast=5, eager=15
    )
    shown = text(watcher.update(later, 1e6 + 5))
    assert "Rates and latencies (last 5s)" in shown
    assert "groups scored     2.00/s" in shown  # 10 groups in 5 s
    assert "masked rollouts   0.80/s (0.80/s alone, 0.00/s in whole groups)" in shown
    assert "without a reward  10.0%" in shown  # 4 of 40 rollouts
    # the 10 attempts of the window were all slow (0.1..1 s): p50 at 0.55 s, not the 0.05 s
    # the 100 fast ones before the window would give
    assert "judge p50 / p95   550 ms / 955 ms" in shown
    # the 10 groups of the window: 5 within 50 ms of their last member, 5 within 50..250 ms
    assert "reward p50 / p95  50 ms / 230 ms" in shown
    assert "eager comparisons   3.00/s" in shown  # 15 started early in 5 s


def test_masked_rollouts_are_every_masked_row_split_by_cause() -> None:
    """In 5 s: 4 rollouts masked alone, a group of 4 masked whole (a judge-kind failure) and a
    group of 4 failed otherwise (503s). Masked: 8, the rows the trainer drops; without a reward:
    12 of the 48 rollouts, each failed group's rollouts counted once."""
    watcher = Watcher("http://x")
    watcher.update(snapshot(0.0, rollouts=40), 1e6)
    later = snapshot(5.0, rollouts=80, masked=4, masked_whole=4, failed_rollouts=8)
    shown = text(watcher.update(later, 1e6 + 5))
    assert "masked rollouts   1.60/s (0.80/s alone, 0.80/s in whole groups)" in shown
    assert "without a reward  25.0%" in shown
    assert "since the start: 8 masked rollouts (4 alone, 4 in whole groups)," in shown


def test_a_restart_starts_the_rates_afresh() -> None:
    watcher = Watcher("http://x")
    watcher.update(snapshot(0.0, scored=50), 1e6)
    watcher.update(snapshot(1.0, scored=60), 1e6 + 1)
    restarted = text(watcher.update(snapshot(2.0, start=2000.0, scored=1), 1e6 + 2))
    assert "restarted 0.0s ago: rates start afresh" in restarted
    assert "groups scored     —" in restarted  # no negative rate across the restart
    assert "groups scored     1.00/s" in text(
        watcher.update(snapshot(3.0, start=2000.0, scored=2), 1e6 + 3)
    )


def test_the_window_keeps_about_ten_seconds() -> None:
    watcher = Watcher("http://x")
    for second in range(30):
        view = watcher.update(snapshot(float(second), scored=second * 3), 1e6 + second)
    assert view.baseline is not None and view.latest is not None
    assert view.latest.at - view.baseline.at == 10.0
    assert "groups scored     3.00/s" in text(view)


def replica(label: str, **fields: Any) -> dict[str, object]:
    """One row of `GET /judge/replicas`, as the server builds it."""
    return replica_view(replica_stats(label, **fields))


def test_each_replica_shows_its_stalls_and_why_it_is_out() -> None:
    stall = JudgeStalled("judge replica a:8000 finished none of its calls in flight for 5s")
    replicas = [
        # out now, its last failure a stall (its third)
        replica(
            "a:8000",
            ejected=True,
            ejections=3,
            stalls=3,
            failures=9,
            back_in_s=4.5,
            last_error=stall.describe(),
        ),
        # out after failed attempts in a row, once stalled before
        replica(
            "b:8000",
            ejected=True,
            ejections=2,
            stalls=1,
            failures=6,
            back_in_s=2.0,
            consecutive_failures=3,
            last_error=JudgeTimeout(10.0).describe(),
        ),
        # stalled once, came back through a trial and serves
        replica("c:8000", ejections=1, stalls=1, failures=2, last_error=stall.describe()),
        replica("d:8000"),
    ]
    view = Watcher("http://x").update(Snapshot(0.0, parse_metrics(""), [], replicas), 1e6)
    rows = {line.split()[1]: line for line in text(view, width=200).splitlines() if ":8000" in line}
    assert re.search(
        r"│ STALLED, trial in 4\.5s\s+│\s+0 │\s+40 │\s+9 │\s+3 │\s+50 ms │ "
        r"ReplicaStalled: judge replica a:8000",
        rows["a:8000"],
    ), rows["a:8000"]
    assert re.search(
        r"│ EJECTED, trial in 2\.0s\s+│.*│\s+6 │\s+1 │\s+50 ms │ TimeoutError", rows["b:8000"]
    ), rows["b:8000"]
    assert re.search(r"│ ok\s+│.*│\s+2 │\s+1 │\s+50 ms │ ReplicaStalled", rows["c:8000"])
    assert re.search(r"│ ok\s+│.*│\s+0 │\s+0 │\s+50 ms │\s+│$", rows["d:8000"])


def test_a_failed_fetch_shows_down_with_the_last_figures() -> None:
    watcher = Watcher("http://x")
    watcher.update(snapshot(0.0, scored=5), 1e6)
    watcher.update(FetchFailed(1.0, "cannot reach http://x: ConnectError: refused"), 1e6 + 1)
    shown = text(watcher.update(FetchFailed(4.5, "still refused"), 1e6 + 4.5))
    assert "DOWN for 3.5s: still refused" in shown
    assert "the figures below are the last ones seen" in shown
    title = "Rates and latencies (the last ones seen: latencies since its start, no rates)"
    assert title in " ".join(shown.split())
    assert "first look" not in shown  # it is no first look: the server went down
    assert "● serving" not in shown
    nothing = text(Watcher("http://y").update(FetchFailed(0.0, "refused"), 1e6))
    assert "DOWN for 0.0s: refused" in nothing and "Rates" not in nothing


HOSTILE = "g\x1b]0;pwned\x07\x1b[2J\x1b]52;c;Y2xpcA==\x07\u202e[bold red]x[/bold red]\n"
"""A group id or judge error that sets the window title, clears the screen, writes the
clipboard, reverses the text that follows and tries Rich markup (#40 item 4)."""
HOSTILE_SHOWN = (
    "g\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;Y2xpcA==\\x07\\u202e[bold red]x[/bold red]\\x0a"
)


def test_top_shows_hostile_strings_escaped_never_as_terminal_sequences() -> None:
    cohort = {"key": "k", "group_id": HOSTILE, "group_attempt": 0, "state": "collecting",
              "deadline": HOSTILE, "deadline_s_left": 3.0}  # fmt: skip
    replicas = [replica("a:8000", failures=1, last_error=HOSTILE)]
    replicas[0]["replica"] = HOSTILE

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=f'x_total{{l="{HOSTILE[:-1]}"}} 1\n')
        return httpx.Response(200, json=[cohort] if request.url.path == "/cohorts" else replicas)

    with httpx.Client(base_url="http://x", transport=httpx.MockTransport(serve)) as http:
        result, _ = look(Watcher("http://x"), http)
        assert isinstance(result, Snapshot)
        view = Watcher("http://x").update(result, 1e6)
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=True, color_system="truecolor")
    console.print(frame(view))
    shown = out.getvalue()
    for sequence in ("\x1b]", "\x1b[2J", "\x07", "\u202e", "\n[bold"):
        assert sequence not in shown
    plain = text(view, width=400)
    assert plain.count(HOSTILE_SHOWN[:40]) >= 3  # the group, its deadline, the replica, its error
    assert "[bold red]x[/bold red]" in plain  # shown as written, not as markup

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"detail": HOSTILE})

    with httpx.Client(base_url="http://x", transport=httpx.MockTransport(refuse)) as http:
        failed = fetch(http)
    assert isinstance(failed, FetchFailed)
    assert failed.reason == f"/metrics: HTTP 503: {HOSTILE_SHOWN}"


def test_log_lines_escape_control_characters() -> None:
    formatter = EscapingFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord("genrm_trio.x", logging.WARNING, "f", 1, "id %s", (HOSTILE,), None)
    assert formatter.format(record) == f"WARNING genrm_trio.x: id {HOSTILE_SHOWN}"
    try:
        raise ValueError(HOSTILE[:-1])  # (a line break in a traceback is kept as it is)
    except ValueError:
        record.exc_info = sys.exc_info()
    lines = formatter.format(record).split("\n")
    assert lines[-1] == f"ValueError: {HOSTILE_SHOWN[:-4]}"  # the traceback keeps its lines
    assert all("\x1b" not in line for line in lines)


# --- against a live server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    directory = tmp_path_factory.mktemp("top")
    with watched_server(directory, "--fault", f"slow,match={SLOW},delay=60") as found:
        yield found


@pytest.mark.slow
async def test_frames_of_a_live_server(watched: Watched) -> None:
    watcher = Watcher(watched.url)
    http = open_client(watched.url, watched.token)
    try:
        result, first = await trio.to_thread.run_sync(look, watcher, http)
        assert isinstance(result, Snapshot), result
        assert f"genrm-trio top {watched.url}" in first and "● serving" in first
        for replica in watched.replicas:  # in service, never stalled
            assert re.search(rf"{re.escape(replica)}\s+│ ok\s+│(\s+\d+ │){{3}}\s+0 │", first), first
        await load(watched, 1.0, failing=True, prefix="top")
        result, second = await trio.to_thread.run_sync(look, watcher, http)
        assert isinstance(result, Snapshot)
        scored = re.search(r"groups scored\s+(\d+\.\d\d)/s", second)
        assert scored is not None and float(scored.group(1)) > 0, second
        masked = re.search(r"without a reward\s+(\d+\.\d)%", second)
        assert masked is not None and float(masked.group(1)) > 0, second
        assert re.search(r"judge p50 / p95\s+\d+ ms / \d+ ms", second), second
        # the load's groups were scored: their last member in -> rewards out was observed
        latency = r"(\d+ ms|\d+\.\d\d s)"
        assert re.search(rf"reward p50 / p95\s+{latency} / {latency}", second), second

        # a group still collecting (2 of 4 members), then one being judged (slow judge)
        async with client(timeout=120.0, headers=watched.headers) as requests:

            async def send(body: dict[str, object]) -> None:
                await requests.post(f"{watched.url}/verify", json=body)

            async with trio.open_nursery() as nursery:
                for body in bodies("top-collecting", ["one", "two"]):
                    nursery.start_soon(send, body)
                await _until_collected(requests, watched, age_s=0.3)
                slow = [f"slow answer {i} {SLOW}" for i in range(4)]
                for body in bodies("top-judging", slow):
                    nursery.start_soon(send, body)
                await _until_cohorts(requests, watched, 2)
                _, third = await trio.to_thread.run_sync(look, watcher, http)
                nursery.cancel_scope.cancel()
        assert "Oldest active cohorts (2 of 2)" in third, third
        rows = [line for line in third.splitlines() if "top-" in line]
        assert len(rows) == 2 and "top-collecting" in rows[0] and "top-judging" in rows[1]
        # eager_comparisons (the default): the two members' pair is judged while collecting
        assert re.search(r"collecting\s+│\s+\d+\.\ds\s+│\s+2/4\s+│\s+1/4\s+│ +collection", rows[0])
        assert re.search(r"judging\s+│\s+\d+\.\ds\s+│\s+4/4\s+│\s+0/4\s+│ +evaluation", rows[1])
        age = re.search(r"│\s+(\d+\.\d)s\s+│\s+2/4", rows[0])
        assert age is not None and float(age.group(1)) >= 0.3
        assert "1 collecting, 1 judging" in third
    finally:
        http.close()


STALL_S = 1.0


@pytest.mark.slow
async def test_a_replica_that_hangs_shows_as_stalled(tmp_path: Path) -> None:
    """One of two replicas stopped (SIGSTOP) under load, with judge.replica_stall_s set: it
    stalls out, and its row says STALLED with one stall while the other serves on."""
    fleet = {"replica_stall_s": STALL_S, "eject_backoff_s": 60.0}  # no trial while it runs
    with watched_server(tmp_path, judge=fleet) as hung:
        stopped, serving = hung.replicas
        watcher = Watcher(hung.url)
        http = open_client(hung.url, hung.token)
        enough = trio.Event()
        paused = False
        try:
            async with (
                client(timeout=30.0, headers=hung.headers) as requests,
                trio.open_nursery() as nursery,
            ):
                for sender in range(3):  # whole groups until `enough`: none left half-sent
                    nursery.start_soon(_groups_until, enough, requests, hung, f"stall-{sender}")
                rows = await _until_replicas(requests, hung, lambda rows: rows[0]["calls"] > 0)
                hung.judges[0].signal(signal.SIGSTOP)
                paused = True
                rows = await _until_replicas(requests, hung, lambda rows: rows[0]["stalls"] > 0)
                _, shown = await trio.to_thread.run_sync(look, watcher, http)
                enough.set()
        finally:
            if paused:
                hung.judges[0].signal(signal.SIGCONT)
            http.close()
    assert [(r["stalls"], r["ejected"]) for r in rows] == [(1, True), (0, False)], rows
    lines = {line.split()[1]: line for line in shown.splitlines() if "│ " in line}
    assert re.search(
        r"│ STALLED, trial in \d+\.\ds\s+│(\s+\d+ │){3}\s+1 │.*│ ReplicaStalled",
        lines[stopped],
    ), shown
    assert re.search(r"│ ok\s+│(\s+\d+ │){3}\s+0 │", lines[serving]), shown


async def _groups_until(
    enough: trio.Event, http: httpx.AsyncClient, watched: Watched, prefix: str
) -> None:
    """Whole groups, one after the other, each scored (those on a stopped replica elsewhere)."""
    n = 0
    while not enough.is_set():
        group = bodies(f"{prefix}-{n}", answers("stall", GROUP))
        replies, _ = await run_group(http, watched.url, group)
        assert all(r.status == 200 and not r.body["mask_sample"] for r in replies), replies
        n += 1


async def _until_replicas(
    http: httpx.AsyncClient, watched: Watched, condition: Callable[[list[Any]], bool]
) -> list[Any]:
    with trio.fail_after(20):
        while True:
            rows: list[Any] = (await http.get(f"{watched.url}/judge/replicas")).json()
            if condition(rows):
                return rows
            await trio.sleep(0.05)


async def _until_cohorts(http: httpx.AsyncClient, watched: Watched, n: int) -> None:
    with trio.fail_after(10):
        while True:
            views = (await http.get(f"{watched.url}/cohorts")).json()
            present = len(views) == n and all(v["members_present"] > 0 for v in views)
            if present and (n < 2 or views[1]["state"] == "judging"):
                return
            await trio.sleep(0.05)


async def _until_collected(http: httpx.AsyncClient, watched: Watched, *, age_s: float) -> None:
    """Until the one cohort holds both of its members, has judged their pair (eager) and is
    `age_s` old: the state the frame is checked against, waited on rather than slept for."""
    with trio.fail_after(10):
        while True:
            views = (await http.get(f"{watched.url}/cohorts")).json()
            if (
                len(views) == 1
                and views[0]["members_present"] == 2
                and views[0]["comparisons_done"] == 1
                and views[0]["age_s"] >= age_s
            ):
                return
            await trio.sleep(0.05)


@pytest.mark.slow
def test_without_the_key_top_shows_the_refusal(watched: Watched) -> None:
    with open_client(watched.url, None) as http:
        result, shown = look(Watcher(watched.url), http)
    assert isinstance(result, FetchFailed)
    assert result.reason == (
        "/metrics: HTTP 401: missing or invalid bearer token (give --api-key-env)"
    )
    assert "DOWN for 0.0s: /metrics: HTTP 401" in shown


@pytest.mark.slow
def test_a_server_that_stops_and_comes_back(tmp_path: Path) -> None:
    server = start_server(tmp_path, {"num_rollouts_per_prompt": 2}, name="first")
    port = server.port
    watcher = Watcher(server.url)
    with open_client(server.url, None) as http:
        try:
            result, shown = look(watcher, http)
            assert isinstance(result, Snapshot) and "● serving" in shown
            server.stop()
            result, shown = look(watcher, http)
            assert isinstance(result, FetchFailed)
            assert f"cannot reach {server.url}: ConnectError" in result.reason
            assert "DOWN for 0.0s: cannot reach" in shown
            # still down half a second after the first failure (its time set, not slept for)
            later = fetch(http)
            assert isinstance(later, FetchFailed)
            shown = text(
                watcher.update(dataclasses.replace(later, at=result.at + 0.5), time.time())
            )
            assert "DOWN for 0.5s: cannot reach" in shown, shown
            server.close()
            server = start_server(
                tmp_path, {"num_rollouts_per_prompt": 2}, name="second", extra=["--port", str(port)]
            )
            result, shown = look(watcher, http)
            assert isinstance(result, Snapshot), result
            assert "● serving" in shown and "restarted 0.0s ago" in shown
        finally:
            server.close()


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_top_once_prints_one_frame(watched: Watched) -> None:
    env = {**os.environ, **watched.env, "COLUMNS": "140"}
    argv = [*command(), "top", "--once", "--url", watched.url, "--api-key-env", KEY_ENV]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.count("genrm-trio top ") == 1 and "● serving" in done.stdout
    # two samples --interval (1 s) apart: the frame has rates, over that second
    assert "Rates and latencies (last 1s)" in done.stdout, done.stdout
    assert "first look" not in done.stdout
    assert re.search(r"judge attempts\s+\d+\.\d\d/s", done.stdout), done.stdout
    assert all(replica in done.stdout for replica in watched.replicas)
    assert watched.token not in done.stdout


def test_top_once_against_nothing_exits_1(tmp_path: Path) -> None:
    done = subprocess.run(
        [*command(), "top", "--once", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "DOWN for 0.0s: cannot reach http://127.0.0.1:9: ConnectError" in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "error", "usage"),
    [
        (
            ["--api-key-env", "GENRM_TRIO_TOP_UNSET"],
            "environment variable GENRM_TRIO_TOP_UNSET",
            False,
        ),
        (["--url", "127.0.0.1:8100"], "--url must start with http:// or https://", False),
        # a usage mistake: argparse's usage line, then the error (tests/test_cli.py has more)
        (["--interval", "0"], "argument --interval: must be within [0.1, 3600] seconds", True),
    ],
)
def test_top_refuses_bad_flags(argv: list[str], error: str, usage: bool) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "GENRM_TRIO_TOP_UNSET"}
    argv = [*command(), "top", "--once", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=60)
    assert done.returncode == 2, done
    *before, line = done.stderr.splitlines()
    if usage:
        assert before[0].startswith("usage: genrm-trio top [-h]"), done.stderr
        assert line.startswith("genrm-trio top: error: "), line
    else:
        assert before == [] and line.startswith("genrm-trio: "), done.stderr
    assert error in line, line
    assert done.stdout == ""


@pytest.mark.slow
def test_top_refreshes_and_leaves_cleanly_on_ctrl_c(watched: Watched) -> None:
    env = {**os.environ, **watched.env, "COLUMNS": "140"}
    argv = [*command(), "top", "--url", watched.url, "--api-key-env", KEY_ENV, "--interval", "0.2"]
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert popen.stdout is not None and popen.stderr is not None
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while seen.count(b"genrm-trio top ") < 3:  # it refreshes: three frames
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([popen.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(popen.stdout.fileno(), 65536)
                assert chunk, f"top exited early: {popen.wait(5)} {popen.stderr.read()!r}"
                seen += chunk
        popen.send_signal(signal.SIGINT)
        assert popen.wait(timeout=15) == 0
        errors = popen.stderr.read().decode()
        assert "Traceback" not in errors and "KeyboardInterrupt" not in errors, errors
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(15)
        popen.stdout.close()
        popen.stderr.close()


@pytest.mark.slow
def test_on_a_terminal_top_redraws_in_place_and_restores_the_screen(watched: Watched) -> None:
    """On a TTY: rich's Live on the alternate screen, left (and the screen restored) on Ctrl-C."""
    import pty

    leader, follower = pty.openpty()
    env = {**os.environ, **watched.env, "COLUMNS": "140", "LINES": "60", "TERM": "xterm"}
    argv = [*command(), "top", "--url", watched.url, "--api-key-env", KEY_ENV, "--interval", "0.2"]
    popen = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=subprocess.PIPE, env=env)
    os.close(follower)
    assert popen.stderr is not None
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while seen.count(b"genrm-trio top ") < 3:
            assert time.monotonic() < deadline, seen
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                seen += os.read(leader, 65536)
        assert b"\x1b[?1049h" in seen  # the alternate screen
        popen.send_signal(signal.SIGINT)
        assert popen.wait(timeout=15) == 0
        with contextlib.suppress(OSError):  # the rest, up to the follower's close
            while select.select([leader], [], [], 0.5)[0]:
                chunk = os.read(leader, 65536)
                if not chunk:
                    break
                seen += chunk
        # the normal screen is back after the last frame
        assert seen.rfind(b"\x1b[?1049l") > seen.rfind(b"genrm-trio top "), seen[-300:]
        errors = popen.stderr.read().decode()
        assert "Traceback" not in errors, errors
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(15)
        popen.stderr.close()
        os.close(leader)


def test_judge_tokens_per_second_and_a_judge_that_does_not_read_the_answers() -> None:
    def tokens(at: float, tokens_in: float, tokens_out: float) -> Snapshot:
        lines = [
            "# TYPE genrm_trio_judge_replica_input_tokens counter",
            f'genrm_trio_judge_replica_input_tokens_total{{replica="a:8000"}} {tokens_in}',
            f'genrm_trio_judge_replica_input_tokens_total{{replica="b:8000"}} {tokens_in}',
            "# TYPE genrm_trio_judge_replica_output_tokens counter",
            f'genrm_trio_judge_replica_output_tokens_total{{replica="a:8000"}} {tokens_out}',
            "# TYPE process_start_time_seconds gauge",
            "process_start_time_seconds 1000",
            "",
        ]
        unread = replica("b:8000", answers_unread="equal prompt tokens", prompts_unread=2)
        return Snapshot(at, parse_metrics("\n".join(lines)), [], [replica("a:8000"), unread])

    watcher = Watcher("http://x")
    watcher.update(tokens(0.0, 1000, 100), 1e6)
    shown = text(watcher.update(tokens(5.0, 3500, 600), 1e6 + 5), width=200)
    assert "judge tokens in   1000.00/s" in shown  # (2 x 2500) tokens in 5 s, both replicas
    assert "judge tokens out    100.00/s" in shown
    assert (
        "THE JUDGE DOES NOT READ THE ANSWERS (b:8000): equal prompt tokens; check judge.api "
        "(GET /readyz says how to fix it)"
    ) in shown
    assert "a:8000): " not in shown


def test_a_judge_that_does_not_take_the_genrm_roles_is_a_red_line() -> None:
    reason = "it refused the GenRM roles: HTTP 400: Invalid value: 'response_1'."
    snapshot = Snapshot(
        0.0,
        parse_metrics(""),
        [],
        [replica("a:8000"), replica("b:8000", roles_refused=reason)],
    )
    view = Watcher("http://x").update(snapshot, 1e6)
    shown = text(view, width=300)
    line = (
        f"THE JUDGE DOES NOT TAKE THE GENRM ROLES (b:8000): {reason}; set judge.prompt: "
        "instruct (a system and a user message any instruct model reads)"
    )
    assert line in shown
    assert "(a:8000): " not in shown
    assert "DOES NOT READ THE ANSWERS" not in shown
    replicas = frame(view).renderables[4]  # header, gap, summary, gap, then the replicas
    assert isinstance(replicas, Group)
    styles = {str(part): part.style for part in replicas.renderables[1:] if isinstance(part, Text)}
    assert styles == {line: "bold red"}


def test_a_hosted_judges_throttling_and_cost() -> None:
    def sample(at: float, limited: float, cost: float, groups: float, throttled: int) -> Snapshot:
        lines = [
            "# TYPE genrm_trio_judge_rate_limited counter",
            f"genrm_trio_judge_rate_limited_total {limited}",
            "# TYPE genrm_trio_judge_throttled gauge",
            f"genrm_trio_judge_throttled {throttled}",
            "# TYPE genrm_trio_judge_cost counter",
            f"genrm_trio_judge_cost_total {cost}",
            "# TYPE genrm_trio_cohorts_terminal counter",
            f'genrm_trio_cohorts_terminal_total{{state="scored"}} {groups}',
            "# TYPE process_start_time_seconds gauge",
            "process_start_time_seconds 1000",
            "",
        ]
        return Snapshot(at, parse_metrics("\n".join(lines)), [], [replica("a:8000")])

    watcher = Watcher("http://x")
    first = text(watcher.update(sample(0.0, 2, 0.5, 10, 0), 1e6), width=200)
    assert "judge cost        —      cost per group      —" in first  # no window yet
    shown = text(watcher.update(sample(10.0, 7, 1.1, 30, 12), 1e6 + 10), width=200)
    rows = {" ".join(line.split()) for line in shown.splitlines()}
    assert "judge throttled 12 judge 429s 0.50/s" in rows  # 12 waiting now; 5 in 10 s
    # 0.6 in 10 s, over 20 groups
    assert "judge cost 3.6/min cost per group 0.03/group" in rows
