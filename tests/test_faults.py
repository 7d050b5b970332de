"""Fault injection with real processes: `genrm-trio sim-judge` and `genrm-trio serve` on 127.0.0.1.

Real clock, short deadlines, every wait bounded. Each scenario checks three things: nobody waits
past the configured deadlines (elapsed real time < deadline + MARGIN_S), the right members are
masked or failed with the right reason, and the server keeps serving afterwards (a clean group
scores, `/cohorts` is empty, `genrm_trio_judge_inflight` is 0, the judge has nothing in flight).

Circular pairs of a 4-member group: (0, 1), (1, 2), (2, 3), (3, 0). A fault scripted for the pair
whose *both* answers carry a tag (members 1 and 2) fails comparison (1, 2) only, so exactly members
1 and 2 are masked and 0 and 3 are scored.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from procs import (
    SHUTTING_DOWN,
    Proc,
    Reply,
    answers,
    assert_masked,
    assert_quiet,
    assert_scored,
    bodies,
    clean_group_scores,
    client,
    judge_idle,
    judge_stats,
    metrics,
    post,
    run_group,
    start_judge,
    start_server,
    wait_cohort_state,
)

pytestmark = pytest.mark.slow

MARGIN_S = 2.0  # scheduling slack on a busy 2-core machine; every deadline below is far shorter
N = 4
ATTEMPTS = 4  # genrm_parse_retries 3
SLEEP_S = 0.1  # genrm_parse_retry_sleep_s
ATTEMPT_S = 2.0  # judge_request_timeout_s of the main server
LATENCY_S = 0.02  # the shared judge's base latency
GROUP_S = 1.5  # cohort_evaluation_timeout_s of the deadline servers
COLLECT_S = 1.0  # cohort_collection_timeout_s of the deadline servers

# Faults of the shared judge, each selected by a tag in the answers (genrm_trio/testing/faults.py).
JUDGE_FAULTS = (
    "slow,match=[stall],position=both,delay=30",
    "slow,match=[slowish],delay=1.5",  # judging that lasts, within the attempt deadline
    "slow,match=[hang],delay=30",
    "drop,match=[drop],position=both",
    "http_429,match=[storm],retry_after=0.3,times=8",
    "http_429,match=[r429forever],position=both,retry_after=0.2",
    "http_429,match=[r429long],position=both,retry_after=3",
    "garbage,match=[garbage]",
    "nan,match=[nan]",
    "out_of_range,match=[oor]",
    "empty,match=[empty],position=both",
    "huge,match=[huge],chars=1000000",
    "http_401,match=[unauth],position=both",
    "not_json,match=[notjson],position=both",
)

BASE_CONFIG: dict[str, Any] = {
    "num_rollouts_per_prompt": N,
    "cohort_collection_timeout_s": 10.0,
    "cohort_evaluation_timeout_s": 10.0,
    "judge_request_timeout_s": ATTEMPT_S,
    "genrm_parse_retries": ATTEMPTS - 1,
    "genrm_parse_retry_sleep_s": SLEEP_S,
}
DEADLINE_CONFIG: dict[str, Any] = {
    **BASE_CONFIG,
    "cohort_collection_timeout_s": COLLECT_S,
    "cohort_evaluation_timeout_s": GROUP_S,
    "judge_request_timeout_s": 5.0,
}


class Servers:
    """The shared judge and three services pointed at it (started together, once per module)."""

    def __init__(self, directory: Path) -> None:
        self.procs: list[Proc] = []
        self.judge = self._keep(
            start_judge(
                directory,
                "--latency-ms",
                str(LATENCY_S * 1000),
                *(arg for fault in JUDGE_FAULTS for arg in ("--fault", fault)),
            )
        )
        url = self.judge.url + "/v1"
        self.main = self._keep(start_server(directory, BASE_CONFIG, judge_url=url, name="main"))
        self.fail_group = self._keep(
            start_server(directory, DEADLINE_CONFIG, judge_url=url, name="fail_group")
        )
        self.mask_pending = self._keep(
            start_server(
                directory,
                {**DEADLINE_CONFIG, "evaluation_deadline_policy": "mask_pending"},
                judge_url=url,
                name="mask_pending",
            )
        )

    def _keep(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    directory = tmp_path_factory.mktemp("faults")
    started = Servers(directory)
    try:
        yield started
    finally:
        started.close()
    for proc in started.procs:
        assert "Traceback" not in proc.log(), proc.log()


async def _after(servers: Servers, base: str, group_id: str) -> None:
    """The server keeps serving: nothing active, nothing in flight, a clean group scores."""
    async with client() as http:
        await assert_quiet(http, base)
        await judge_idle(http, servers.judge)
        await clean_group_scores(http, base, group_id, N)
        await assert_quiet(http, base)


async def _judge_delta(servers: Servers, before: dict[str, Any], kind: str) -> int:
    async with client() as http:
        after = await judge_stats(http, servers.judge)
    return int(after["faults_by_kind"].get(kind, 0) - before["faults_by_kind"].get(kind, 0))


async def _group(
    base: str, group_id: str, tag: str, tagged: Any = None
) -> tuple[list[Reply], float]:
    async with client() as http:
        return await run_group(http, base, bodies(group_id, answers(tag, N, tagged)))


def _measured(what: str, seconds: float) -> None:
    """Shown with `pytest -s`: the figures docs/reliability.md quotes."""
    print(f"measured: {what}: {seconds:.3f}s")


def _masks_1_and_2(replies: list[Reply], *fragments: str) -> list[str]:
    assert_scored(replies[0])
    assert_scored(replies[3])
    reasons = [assert_masked(replies[i], *fragments) for i in (1, 2)]
    for i, reason in zip((1, 2), reasons, strict=True):
        assert reason.startswith(
            f"GenRM rollout_index={i} lost a comparison to a judge failure "
            "(1 of 4 comparisons failed): "
        ), reason
    for i in (0, 3):
        row = replies[i].body
        assert row["genrm_failed_comparison_rate_per_group"] == 0.25
        assert row["genrm_masked_rollout_rate_per_group"] == 0.5
    return reasons


# --- a judge that stalls ------------------------------------------------------------------------


async def test_stall_is_cut_by_the_attempt_deadline_and_masks_one_pair(servers: Servers) -> None:
    base = servers.main.url
    replies, elapsed = await _group(base, "stall-attempt", "[stall]", tagged=(1, 2))
    # TimeoutError is not retried (D14): the comparison fails after one attempt deadline.
    _masks_1_and_2(
        replies,
        f"TimeoutError: judge attempt exceeded {ATTEMPT_S}s",
        f"deadline={ATTEMPT_S}s",
        "pair=(1, 2)",
    )
    assert ATTEMPT_S <= elapsed < ATTEMPT_S + MARGIN_S, elapsed
    _measured(f"stall, attempt deadline {ATTEMPT_S} s -> pair masked", elapsed)
    await _after(servers, base, "stall-attempt-after")


async def test_stall_past_the_group_deadline_fails_the_group_fail_group(servers: Servers) -> None:
    base = servers.fail_group.url
    replies, elapsed = await _group(base, "stall-group", "[stall]", tagged=(1, 2))
    for reply in replies:  # every member masked: a judge-kind group failure (D30)
        assert_masked(reply, f"GenRM cohort evaluation deadline exceeded after {GROUP_S}s")
    assert GROUP_S <= elapsed < GROUP_S + MARGIN_S, elapsed
    _measured("stall, group deadline 1.5 s (fail_group)", elapsed)
    async with client() as http:
        samples = await metrics(http, base)
    assert samples.value("genrm_trio_deadline_failures_total", deadline="evaluation") >= 1
    await _after(servers, base, "stall-group-after")


async def test_stall_past_the_group_deadline_masks_pending_under_mask_pending(
    servers: Servers,
) -> None:
    base = servers.mask_pending.url
    replies, elapsed = await _group(base, "stall-pending", "[stall]", tagged=(1, 2))
    _masks_1_and_2(
        replies,
        f"GenRM comparison (1, 2) (judge 0) was still running at the group deadline ({GROUP_S}s) "
        "and was cancelled",
    )
    assert GROUP_S <= elapsed < GROUP_S + MARGIN_S, elapsed
    _measured("stall, group deadline 1.5 s (mask_pending)", elapsed)
    await _after(servers, base, "stall-pending-after")


# --- a judge that drops connections, refuses, or answers garbage ---------------------------------


async def test_dropped_connections_fail_after_the_attempt_budget(servers: Servers) -> None:
    async with client() as http:
        before = await judge_stats(http, servers.judge)
    base = servers.main.url
    replies, elapsed = await _group(base, "drop", "[drop]", tagged=(1, 2))
    _masks_1_and_2(replies, "RemoteProtocolError", "pair=(1, 2)")
    assert await _judge_delta(servers, before, "drop") == ATTEMPTS  # retried, one shared budget
    # A attempts, A - 1 sleeps: about A x sleep, far below any deadline.
    assert (ATTEMPTS - 1) * SLEEP_S <= elapsed < (ATTEMPTS - 1) * SLEEP_S + MARGIN_S, elapsed
    _measured("drop x4 attempts, sleep 0.1 s -> pair masked", elapsed)
    await _after(servers, base, "drop-after")


@pytest.mark.parametrize(
    ("tag", "kind", "fragment"),
    [
        ("[unauth]", "http_401", 'JudgeHTTPError: HTTP 401; response={"error": "unauthorized"}'),
        ("[notjson]", "not_json", "JSONDecodeError: "),
    ],
)
async def test_non_retryable_judge_errors_mask_after_one_attempt(
    servers: Servers, tag: str, kind: str, fragment: str
) -> None:
    async with client() as http:
        before = await judge_stats(http, servers.judge)
    base = servers.main.url
    replies, elapsed = await _group(base, f"once-{kind}", tag, tagged=(1, 2))
    _masks_1_and_2(replies, fragment)
    assert await _judge_delta(servers, before, kind) == 1
    assert elapsed < MARGIN_S
    _measured(f"{kind}: one attempt -> pair masked", elapsed)
    await _after(servers, base, f"once-{kind}-after")


async def test_429_storm_honours_retry_after_and_recovers(servers: Servers) -> None:
    base = servers.main.url
    async with client() as http:
        before = await metrics(http, base)
    replies, elapsed = await _group(base, "storm", "[storm]")
    for reply in replies:
        assert_scored(reply)
    async with client() as http:
        after = await metrics(http, base)
    # A 429 is no attempt and no retry: it holds the judge (docs/configuration.md, "A judge with
    # rate limits"); the eight are counted as such.
    retries = "genrm_trio_judge_retries_total"
    assert after.value(retries, cause="http") - before.value(retries, cause="http") == 0
    limited = "genrm_trio_judge_rate_limited_total"
    assert after.value(limited) - before.value(limited) == 8
    # After the first wave, one call at a time tries again each 0.3 s Retry-After: at least two
    # holds of 0.3 s, not the 0.1 s retry pacing (D13).
    assert 2 * 0.3 <= elapsed < 8 * 0.3 + MARGIN_S, elapsed
    _measured("429 storm (8 x Retry-After 0.3 s) -> all scored", elapsed)
    await _after(servers, base, "storm-after")


async def test_endless_429_holds_the_pair_until_its_deadline(servers: Servers) -> None:
    base = servers.main.url
    replies, elapsed = await _group(base, "r429", "[r429forever]", tagged=(1, 2))
    # held 0.2 s at a time until the next hold plus the replica's last round trip would end
    # past the 10 s group deadline: the pair fails then. In real time the call sent at the end
    # of the last hold that fits may still take longer than the one before it and be out when
    # the deadline comes (a few ms of jitter); then the deadline, not the hold, ends the group
    # (this server fails a group at its deadline, Gym's policy). The exact hold schedule is
    # tested in virtual time (tests/test_rate_limits.py).
    if replies[0].body["mask_sample"]:
        for reply in replies:
            assert_masked(reply, "GenRM cohort evaluation deadline exceeded after 10.0s")
    else:
        _masks_1_and_2(replies, "the judge's rate limit holds its calls for")
    assert 10.0 - 2 * 0.2 - MARGIN_S <= elapsed < 10.0 + MARGIN_S, elapsed
    _measured("endless 429, Retry-After 0.2 s -> pair masked at its deadline", elapsed)
    await _after(servers, base, "r429-after")


async def test_retry_after_beyond_the_deadline_fails_the_comparison_at_once(
    servers: Servers,
) -> None:
    base = servers.fail_group.url
    replies, elapsed = await _group(base, "r429long", "[r429long]", tagged=(1, 2))
    # Retry-After: 3 does not fit before the 1.5 s group deadline: the pair fails at once.
    _masks_1_and_2(replies, "s (after a 429), past the deadline in")
    assert elapsed < MARGIN_S, elapsed
    _measured("429 with Retry-After 3 s (past the deadline) -> pair masked at once", elapsed)
    await trio.sleep(3.0)  # the hold is the judge's: over for every call after it
    await _after(servers, base, "r429long-after")


@pytest.mark.parametrize(
    ("tag", "kind"), [("[garbage]", "garbage"), ("[nan]", "nan"), ("[oor]", "out_of_range")]
)
async def test_unparseable_verdicts_fall_back_to_defaults_never_masked(
    servers: Servers, tag: str, kind: str
) -> None:
    async with client() as http:
        before = await judge_stats(http, servers.judge)
    base = servers.main.url
    replies, elapsed = await _group(base, f"fallback-{kind}", tag)
    for reply in replies:
        assert_scored(reply)
        row = reply.body
        assert (
            row["reward"] == 3.0
        )  # default_score on every side, default ranking 3.5: no tie-break
        assert row["reward_score_raw"] == 3.0
        assert row["genrm_parse_failure_rate_per_group"] == 1.0
        assert row["genrm_failed_comparison_rate_per_group"] == 0.0
    assert await _judge_delta(servers, before, kind) == N * ATTEMPTS  # every attempt used
    assert elapsed < (ATTEMPTS - 1) * SLEEP_S + MARGIN_S, elapsed
    _measured(f"{kind} x4 attempts -> default fallback", elapsed)
    await _after(servers, base, f"fallback-{kind}-after")


async def test_empty_answers_are_no_verdict_and_mask(servers: Servers) -> None:
    base = servers.main.url
    replies, _ = await _group(base, "empty", "[empty]", tagged=(1, 2))
    _masks_1_and_2(replies, "Judge returned no completed answer after 4 attempts")
    await _after(servers, base, "empty-after")


async def test_huge_judge_outputs_still_parse(servers: Servers) -> None:
    base = servers.main.url
    replies, elapsed = await _group(base, "huge", "[huge]")
    for reply in replies:
        assert_scored(reply)
        row = reply.body
        assert row["genrm_parse_failure_rate_per_group"] == 0.0
        assert row["genrm_output_tokens_per_comparison_mean"] >= 1_000_000 / 4
    assert elapsed < MARGIN_S + 1.0, elapsed
    _measured("huge outputs (1 MB each) -> scored", elapsed)
    await _after(servers, base, "huge-after")


# --- clients that disconnect and come back --------------------------------------------------------


async def _disconnect_when(http: Any, url: str, body: Any, ready: trio.Event) -> None:
    """Post `body`, then drop the connection once `ready` is set (the request is abandoned)."""
    async with trio.open_nursery() as nursery:

        async def send() -> None:
            await http.post(url, json=body)
            raise AssertionError("the abandoned request was answered")

        nursery.start_soon(send)
        await ready.wait()
        nursery.cancel_scope.cancel()


async def test_disconnect_while_collecting_keeps_the_member(servers: Servers) -> None:
    base = servers.main.url
    group = bodies("dc-collect", answers("[clean]", N))
    async with client() as http:
        ready = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_disconnect_when, http, f"{base}/verify", group[0], ready)
            nursery.start_soon(_disconnect_when, http, f"{base}/verify", group[1], ready)
            await wait_cohort_state(
                http, base, "dc-collect", "collecting", within=5.0, members_present=2
            )
            ready.set()
        # Both disconnects handled (no request waits any more): the members stay.
        view = await wait_cohort_state(
            http, base, "dc-collect", "collecting", within=5.0, requests_waiting=0
        )
        assert (view["state"], view["members_present"]) == ("collecting", 2)  # members stay
        # Member 0 re-attaches (identical body); member 1 never comes back; 2 and 3 arrive.
        replies: dict[int, Reply] = {}

        async def one(i: int) -> None:
            replies[i] = await post(http, f"{base}/verify", group[i])

        async with trio.open_nursery() as nursery:
            for i in (0, 2, 3):
                nursery.start_soon(one, i)
        for i in (0, 2, 3):
            assert_scored(replies[i])
        # The abandoned member 1 was scored too: its identical retry replays the stored result;
        # so does member 0's.
        late = await post(http, f"{base}/verify", group[1])
        assert_scored(late)
        again = await post(http, f"{base}/verify", group[0])
        assert again.body["reward"] == replies[0].body["reward"]
        changed = bodies("dc-collect", answers("[other]", N))[1]
        conflict = await post(http, f"{base}/verify", changed)
        assert conflict.status == 409
        assert "already has a different response for rollout_index=1" in conflict.body["detail"]
    await _after(servers, base, "dc-collect-after")


async def test_disconnect_while_judging_then_reattach_gets_the_shared_result(
    servers: Servers,
) -> None:
    base = servers.main.url
    group = bodies("dc-judge", answers("[slowish]", N))
    async with client() as http:
        before = await judge_stats(http, servers.judge)
        replies: dict[int, Reply] = {}
        ready = trio.Event()

        async def one(i: int) -> None:
            replies[i] = await post(http, f"{base}/verify", group[i])

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_disconnect_when, http, f"{base}/verify", group[0], ready)
            nursery.start_soon(_disconnect_when, http, f"{base}/verify", group[1], ready)
            for i in (2, 3):
                nursery.start_soon(one, i)
            await wait_cohort_state(http, base, "dc-judge", "judging")
            ready.set()
            # both disconnects handled: only members 2 and 3 still wait; every member stays
            view = await wait_cohort_state(http, base, "dc-judge", "judging", requests_waiting=2)
            assert view["members_present"] == N
            nursery.start_soon(one, 0)  # re-attach during judging
        elapsed = trio.current_time() - started
        for i in (0, 2, 3):
            assert_scored(replies[i])
        assert elapsed < 1.5 + MARGIN_S
        after = await judge_stats(http, servers.judge)
        assert after["calls"] - before["calls"] == N  # judged once, whoever disconnected
        late = await post(http, f"{base}/verify", group[1])
        assert_scored(late)
        again = await post(http, f"{base}/verify", group[0])
        assert again.body == replies[0].body  # a replay is the same row
    await _after(servers, base, "dc-judge-after")


async def test_compare_abandoned_by_its_client_cancels_its_judge_calls(servers: Servers) -> None:
    """`/compare` runs in the request's task: a disconnect ends its judge calls."""
    base = servers.main.url
    body = {
        "conversation_history": [{"role": "user", "content": "Why is ice slippery?"}],
        "response_objs": [b["response"] for b in bodies("cmp", answers("[slowish]", 3))],
    }
    async with client() as http:
        ready = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_disconnect_when, http, f"{base}/compare", body, ready)
            with trio.fail_after(5):
                while (await judge_stats(http, servers.judge))["in_flight"] < 3:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            ready.set()
        await judge_idle(http, servers.judge, within=1.0)  # well before the 1.5 s answers
    await _after(servers, base, "cmp-after")


async def test_abandoned_group_fails_at_the_collection_deadline(servers: Servers) -> None:
    base = servers.fail_group.url
    group = bodies("abandoned", answers("[clean]", N))
    async with client() as http:
        replies: dict[int, Reply] = {}
        ready = trio.Event()

        async def one(i: int) -> None:
            replies[i] = await post(http, f"{base}/verify", group[i])

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_disconnect_when, http, f"{base}/verify", group[0], ready)
            for i in (1, 2):
                nursery.start_soon(one, i)
            await wait_cohort_state(http, base, "abandoned", "collecting")
            ready.set()
        elapsed = trio.current_time() - started
        for i in (1, 2):
            assert replies[i].status == 503
            assert replies[i].body == {
                "detail": f"GenRM cohort 'group_id::abandoned::group_attempt::0' did not collect "
                f"{N} unique rollout indices within {COLLECT_S}s",
                "reason": "group_failed",
            }
        assert COLLECT_S - 0.1 <= elapsed < COLLECT_S + MARGIN_S, elapsed
        _measured("collection deadline 1.0 s -> 503", elapsed)
        late = await post(http, f"{base}/verify", group[3])  # the recorded failure, at once
        assert late.status == 503 and "did not collect" in late.body["detail"]
    await _after(servers, base, "abandoned-after")


# --- SIGTERM while judging ------------------------------------------------------------------------


async def test_sigterm_while_judging_delivers_503s_and_exits_0(
    servers: Servers, tmp_path: Path
) -> None:
    grace_s = 3.0
    config = {
        **BASE_CONFIG,
        "judge_request_timeout_s": 20.0,
        "cohort_evaluation_timeout_s": 20.0,
        "server": {"shutdown_grace_s": grace_s},
    }
    server = await trio.to_thread.run_sync(
        partial(start_server, tmp_path, config, judge_url=servers.judge.url + "/v1", name="term")
    )
    try:
        base = server.url
        async with client() as http:
            replies: dict[int, Reply] = {}
            group = bodies("sigterm", answers("[hang]", N))

            async def one(i: int) -> None:
                replies[i] = await post(http, f"{base}/verify", group[i])

            async with trio.open_nursery() as nursery:
                for i in range(N):
                    nursery.start_soon(one, i)
                await wait_cohort_state(http, base, "sigterm", "judging")
                assert (await judge_stats(http, servers.judge))["in_flight"] == N
                signalled = trio.current_time()
                server.signal(signal.SIGTERM)
            answered = trio.current_time() - signalled
            assert answered < MARGIN_S, answered
            _measured("SIGTERM -> 503s delivered", answered)
            for i in range(N):
                assert replies[i].status == 503
                assert replies[i].body == {"detail": SHUTTING_DOWN, "reason": "shutting_down"}
            code = await trio.to_thread.run_sync(server.wait, grace_s + MARGIN_S)
            exited = trio.current_time() - signalled
            assert code == 0
            assert exited < grace_s + MARGIN_S, exited
            _measured("SIGTERM -> exit 0", exited)
            await judge_idle(http, servers.judge)  # the hung judge calls were abandoned
    finally:
        await trio.to_thread.run_sync(server.close)
    log = server.log()
    assert "Traceback" not in log
    assert "received SIGTERM: shutting down" in log


# --- the judge process killed and restarted ------------------------------------------------------


async def test_judge_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    """Two services share one judge: `short` (a 3 s group deadline: a judge that stays down
    fails its group there) and `long` (30 s: it waits out a restart). While the judge cannot be
    reached no attempt is spent (docs/reliability.md, "A judge restart")."""
    sleep_s = 0.25
    group_deadline = {"short": 3.0, "long": 30.0}
    judge = await trio.to_thread.run_sync(
        partial(start_judge, tmp_path, "--latency-ms", "300", name="judge1")
    )
    procs = [judge]
    try:
        servers: dict[str, Proc] = {}

        async def start(name: str, attempts: int) -> None:
            config = {
                **BASE_CONFIG,
                "judge_request_timeout_s": 2.0,
                "cohort_evaluation_timeout_s": group_deadline[name],
                "genrm_parse_retries": attempts - 1,
                "genrm_parse_retry_sleep_s": sleep_s,
                "judge": {"outage_probe_s": 0.5},  # a restart is seen within 0.5 s
            }
            servers[name] = await trio.to_thread.run_sync(
                partial(start_server, tmp_path, config, judge_url=judge.url + "/v1", name=name)
            )
            procs.append(servers[name])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(start, "short", 8)
            nursery.start_soon(start, "long", 40)
        short, long = servers["short"].url, servers["long"].url
        port = judge.port

        async def restart_judge(name: str) -> Proc:
            new = await trio.to_thread.run_sync(
                partial(
                    start_judge, tmp_path, "--latency-ms", "300", "--port", str(port), name=name
                )
            )
            procs.append(new)
            return new

        async with client() as http:
            # 1. Killed while judging, not back: the comparisons wait for it (no attempts spent)
            #    until the group deadline, 3 s after the group completed: every member masked.
            replies: list[Reply] = []
            killed_at = 0.0
            async with trio.open_nursery() as nursery:

                async def group1() -> None:
                    got, _ = await run_group(http, short, bodies("kill-1", answers("[k1]", N)))
                    replies.extend(got)

                nursery.start_soon(group1)
                await wait_cohort_state(http, short, "kill-1", "judging")
                await trio.to_thread.run_sync(judge.kill)
                killed_at = trio.current_time()
            to_failure = trio.current_time() - killed_at
            for reply in replies:
                assert_masked(
                    reply,
                    "GenRM cohort evaluation deadline exceeded after 3.0s (judge unreachable for ",
                )
            assert to_failure < group_deadline["short"] + MARGIN_S, to_failure
            _measured("judge killed -> group failed at its 3 s deadline", to_failure)
            await assert_quiet(http, short)

            # 2. Back on the same port: later groups score, on both services.
            judge = await restart_judge("judge2")
            for base, group_id in ((short, "kill-2s"), (long, "kill-2l")):
                later, _ = await run_group(http, base, bodies(group_id, answers("[k2]", N)))
                for reply in later:
                    assert_scored(reply)

            # 3. Killed and restarted within the retry window: the group in flight still scores.
            replies3: list[Reply] = []
            async with trio.open_nursery() as nursery:

                async def group3() -> None:
                    got, _ = await run_group(http, long, bodies("kill-3", answers("[k3]", N)))
                    replies3.extend(got)

                nursery.start_soon(group3)
                await wait_cohort_state(http, long, "kill-3", "judging")
                await trio.to_thread.run_sync(judge.kill)
                killed_at = trio.current_time()
                judge = await restart_judge("judge3")
                _measured("judge restart (kill to listening)", trio.current_time() - killed_at)
            for reply in replies3:
                assert_scored(reply)
            for base in (short, long):
                await assert_quiet(http, base)
    finally:
        for proc in procs:
            await trio.to_thread.run_sync(proc.close)
    for proc in servers.values():
        assert "Traceback" not in proc.log()


# --- SIGKILL with durable state ----------------------------------------------------------------


async def test_sigkill_with_state_loses_nothing_acknowledged(
    servers: Servers, tmp_path: Path
) -> None:
    """Every reply received before a SIGKILL (scored, masked alone, whole group failed) replays
    identically after a restart on the same `--state` file, without judging; groups that were
    open at the kill are fenced (docs/durable-state.md), and a new attempt of them scores."""
    state = tmp_path / "state.sqlite"
    judge_url = servers.judge.url + "/v1"

    def start() -> Proc:
        return start_server(
            tmp_path,
            BASE_CONFIG,
            judge_url=judge_url,
            name="durable",
            extra=["--state", str(state)],
        )

    groups = {
        "durable-scored": bodies("durable-scored", answers("[clean]", N)),
        "durable-masked": bodies("durable-masked", answers("[drop]", N, tagged=(1, 2))),
        "durable-failed": bodies("durable-failed", answers("[unauth]", N)),
    }
    judging = bodies("durable-judging", answers("[slowish]", N))
    collecting = bodies("durable-collecting", answers("[clean]", N))[:2]
    acknowledged: dict[tuple[str, int], Reply] = {}
    server = await trio.to_thread.run_sync(start)
    try:
        base = server.url
        async with client() as http:
            for group_id, group in groups.items():
                replies, _ = await run_group(http, base, group)
                for i, reply in enumerate(replies):
                    acknowledged[(group_id, i)] = reply
            assert_scored(acknowledged[("durable-masked", 0)])
            assert_masked(acknowledged[("durable-masked", 1)], "RemoteProtocolError")
            assert_masked(acknowledged[("durable-failed", 0)], "GenRM masked every rollout")

            async def unanswered(body: dict[str, Any]) -> None:
                with contextlib.suppress(httpx.TransportError):
                    await http.post(f"{base}/verify", json=body)
                    raise AssertionError("answered although the server was killed")

            async with trio.open_nursery() as nursery:
                for body in [*judging, *collecting]:
                    nursery.start_soon(unanswered, body)
                await wait_cohort_state(http, base, "durable-judging", "judging")
                await wait_cohort_state(http, base, "durable-collecting", "collecting")
                await trio.to_thread.run_sync(server.kill)  # SIGKILL: no shutdown at all
        assert server.popen.returncode == -signal.SIGKILL
        await trio.to_thread.run_sync(server.close)

        server = await trio.to_thread.run_sync(start)
        base = server.url
        async with client() as http:
            before = await judge_stats(http, servers.judge)
            for (group_id, i), reply in sorted(acknowledged.items()):
                again = await post(http, f"{base}/verify", groups[group_id][i])
                assert (again.status, again.body) == (reply.status, reply.body), (group_id, i)
            assert (await judge_stats(http, servers.judge))["calls"] == before["calls"]
            for group_id, body in (
                ("durable-judging", judging[0]),
                ("durable-collecting", collecting[1]),
            ):
                fenced = await post(http, f"{base}/verify", body)
                assert fenced.status == 503
                assert fenced.body == {
                    "detail": f"GenRM cohort 'group_id::{group_id}::group_attempt::0' was "
                    "interrupted by a server restart; retry the whole group with a new "
                    "_ng_group_attempt",
                    "reason": "group_failed",
                }
            retry, _ = await run_group(
                http, base, bodies("durable-judging", answers("[slowish]", N), attempt=1)
            )
            for reply in retry:
                assert_scored(reply)
            await assert_quiet(http, base)
    finally:
        await trio.to_thread.run_sync(server.close)
    assert "Traceback" not in server.log()
