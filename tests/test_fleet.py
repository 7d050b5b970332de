"""The judge fleet (genrm_trio.judge.fleet) in virtual time: routing by fewest in flight with
round-robin ties, failover of a comparison's retry to another replica, ejection and return,
per-replica caps and counters, and a three-replica run through the engine where one replica is
killed and comes back while another answers 500 to everything."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from fake_replicas import NamedReplica, fleet_entries
from judges import default_verdict, gather, member, verdict_text

from genrm_trio.config import (
    JUDGE_API_CHOICES,
    ConfigError,
    Settings,
    judge_from_gym,
    settings_from_mapping,
)
from genrm_trio.domain.model import Masked, Scored
from genrm_trio.engine.engine import open_engine
from genrm_trio.judge.base import (
    AttemptTicket,
    JudgeCall,
    JudgeHTTPError,
    JudgeReply,
    JudgeTimeout,
    JudgeTransportError,
    ReplyStatus,
)
from genrm_trio.judge.factory import make_judge
from genrm_trio.judge.fleet import JudgeFleet

CALL = JudgeCall([{"role": "user", "content": "q"}], "a1", "a2", None)


@dataclass
class Replica(NamedReplica):
    """A fake judge replica: `ok` answers after `latency`, `dead` refuses at once (and fails the
    calls in flight when killed), `http500` answers 500 at once, `http429` 429 with
    `Retry-After: retry_after` at once."""

    name: str
    latency: float = 1.0
    mode: str = "ok"
    retry_after: float = 5.0
    log: list[tuple[float, str]] = field(default_factory=list)  # (start, outcome)
    in_flight: int = 0
    _killed: trio.Event = field(default_factory=trio.Event)

    def outcomes(self) -> Counter[str]:
        return Counter(outcome for _, outcome in self.log)

    def kill(self) -> None:
        self.mode = "dead"
        self._killed.set()
        self._killed = trio.Event()

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        started = trio.current_time()
        self.in_flight += 1
        try:
            await trio.lowlevel.checkpoint()
            if self.mode == "dead":
                self.log.append((started, "refused"))
                raise JudgeTransportError("ConnectError", "[Errno 111] Connection refused")
            if self.mode == "http500":
                self.log.append((started, "500"))
                raise JudgeHTTPError(500, b"<html>\r\n<b>Internal error</b>\r\n</html>")
            if self.mode == "http429":
                self.log.append((started, "429"))
                raise JudgeHTTPError(429, b"slow down", self.retry_after)
            killed = self._killed
            with trio.move_on_after(self.latency):
                await killed.wait()
            if killed.is_set():
                self.log.append((started, "reset"))
                raise JudgeTransportError("ReadError", "[Errno 104] Connection reset by peer")
            self.log.append((started, "ok"))
            text = verdict_text(*default_verdict(call.response_1, call.response_2))
            return JudgeReply(ReplyStatus.COMPLETED, text, 100, 10)
        finally:
            self.in_flight -= 1


def fleet(*replicas: Replica, **kwargs: Any) -> JudgeFleet:
    return JudgeFleet(fleet_entries(*replicas), **kwargs)


# --- routing ------------------------------------------------------------------------------------


async def test_sequential_calls_go_round_robin(autojump_clock: trio.testing.MockClock) -> None:
    a, b, c = Replica("a", 1.0), Replica("b", 1.0), Replica("c", 1.0)
    judge = fleet(a, b, c)
    for _ in range(7):
        await judge.attempt(CALL)
    assert [len(r.log) for r in (a, b, c)] == [3, 2, 2]
    starts = sorted((start, r.name) for r in (a, b, c) for start, _ in r.log)
    assert [name for _, name in starts] == ["a", "b", "c", "a", "b", "c", "a"]


async def test_fewest_in_flight_wins(autojump_clock: trio.testing.MockClock) -> None:
    slow, fast = Replica("slow", 10.0), Replica("fast", 0.5)
    judge = fleet(slow, fast)
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(judge.attempt, CALL)
            await trio.sleep(1.0)  # one new call a second
    # The first goes to slow (round robin), which then holds it for 10 s; fast (0.5 s) is free
    # again each time and wins every later choice.
    assert (len(slow.log), len(fast.log)) == (1, 9)
    stats = {s.replica: s for s in judge.replica_stats()}
    assert (stats["slow:8000"].calls, stats["fast:8000"].calls) == (1, 9)
    assert stats["slow:8000"].latency_sum_s == 10.0
    assert stats["fast:8000"].latency_sum_s == 4.5
    assert stats["fast:8000"].in_flight == 0


async def test_per_replica_cap_makes_calls_wait(autojump_clock: trio.testing.MockClock) -> None:
    a, b = Replica("a", 1.0), Replica("b", 1.0)
    judge = fleet(a, b, max_in_flight_per_replica=2)
    ends: list[float] = []

    async def one() -> None:
        await judge.attempt(CALL)
        ends.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(one)
    assert sorted(ends) == [1.0] * 4 + [2.0] * 2
    assert (len(a.log), len(b.log)) == (3, 3)


# --- failover and ejection ----------------------------------------------------------------------


async def test_retry_goes_to_another_replica(autojump_clock: trio.testing.MockClock) -> None:
    a, b = Replica("a", 1.0, mode="http500"), Replica("b", 1.0)
    judge = fleet(a, b)
    with pytest.raises(JudgeHTTPError) as info:
        await judge.attempt(CALL)  # round robin: a first
    assert info.value.replica == "a:8000"
    # The comparator's next attempt names the replica to avoid: b, although a has 0 in flight
    # and comes next in the round robin.
    await judge.attempt(JudgeCall(CALL.history, "a1", "a2", None, avoid_replica="a:8000"))
    with pytest.raises(JudgeHTTPError):  # b is next in the round robin, but avoided
        await judge.attempt(JudgeCall(CALL.history, "a1", "a2", None, avoid_replica="b:8000"))
    assert a.outcomes() == Counter({"500": 2})
    assert b.outcomes() == Counter({"ok": 1})
    # With nowhere else to go, the avoided replica still gets the attempt.
    alone = fleet(Replica("c", 1.0))
    await alone.attempt(JudgeCall(CALL.history, "a1", "a2", None, avoid_replica="c:8000"))
    assert alone.replica_stats()[0].calls == 1


async def test_ejection_backoff_trial_and_return(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    sick, healthy = Replica("sick", 1.0, mode="http500"), Replica("healthy", 1.0)
    judge = fleet(sick, healthy, eject_after_failures=3, eject_backoff_s=5.0)

    async def calls_until(end: float) -> None:
        """One call after another (a failure is instant, an answer takes 1 s) until `end`."""
        while trio.current_time() < end:
            with contextlib.suppress(JudgeHTTPError):
                await judge.attempt(CALL)

    # Round robin: sick fails at t = 0, 1, 2 (healthy answers in between); the third failure
    # ejects it at t = 2.
    await calls_until(2.5)
    assert [start for start, _ in sick.log] == [0.0, 1.0, 2.0]
    stats = judge.replica_stats()[0]
    assert (stats.ejected, stats.ejections, stats.consecutive_failures) == (True, 1, 3)
    assert stats.back_in_s == pytest.approx(5.0 - (trio.current_time() - 2.0))
    # Out for 5 s although it has nothing in flight; at t = 7 one trial, which fails and
    # doubles the back-off: the next trial is at t = 17.
    await calls_until(16.5)
    assert [start for start, _ in sick.log] == [0.0, 1.0, 2.0, 7.0]
    assert judge.replica_stats()[0].ejected
    # It heals; the trial at t = 17 brings it back at t = 18, and round robin resumes.
    sick.mode = "ok"
    await calls_until(21.5)
    assert [start for start, _ in sick.log] == [0.0, 1.0, 2.0, 7.0, 17.0, 19.0, 21.0]
    assert sick.outcomes() == Counter({"500": 4, "ok": 3})
    stats = judge.replica_stats()[0]
    assert (stats.ejected, stats.ejections, stats.calls, stats.failures) == (False, 1, 7, 4)
    lines = [r.getMessage() for r in caplog.records if "judge replica sick:8000" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "ejected after 3 consecutive failed attempts" in lines[0]
    assert "response=<html> <b>Internal error</b> </html>" in lines[0]  # one line
    assert "is back after 16.0s out" in lines[1]
    back = [r for r in caplog.records if "is back after" in r.getMessage()]
    assert [r.levelname for r in back] == ["INFO"]  # good news: its leaving was the WARNING


async def test_every_replica_ejected_still_tries_the_least_recently_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b = Replica("a", mode="dead"), Replica("b", mode="dead")
    judge = fleet(a, b, eject_after_failures=1, eject_backoff_s=100.0)
    with pytest.raises(JudgeTransportError):
        await judge.attempt(CALL)  # a, ejected
    await trio.sleep(1)
    with pytest.raises(JudgeTransportError):
        await judge.attempt(CALL)  # b, ejected
    assert all(s.ejected for s in judge.replica_stats())
    await trio.sleep(1)
    with pytest.raises(JudgeTransportError) as info:
        await judge.attempt(CALL)  # both out: the one that failed longest ago
    assert info.value.replica == "a:8000"
    await trio.sleep(1)
    with pytest.raises(JudgeTransportError) as info:
        await judge.attempt(CALL)
    assert info.value.replica == "b:8000"
    b.mode = "ok"
    await trio.sleep(1)
    with pytest.raises(JudgeTransportError) as info:
        await judge.attempt(CALL)  # a failed at t = 2, b at t = 3: a again
    assert info.value.replica == "a:8000"
    await trio.sleep(1)
    await judge.attempt(CALL)  # now b, and its answer brings it back
    assert [s.ejected for s in judge.replica_stats()] == [True, False]
    assert (len(a.log), len(b.log)) == (3, 3)
    await judge.attempt(CALL)  # in service again: b, although a is next in the round robin
    assert (len(a.log), len(b.log)) == (3, 4)


async def test_an_outage_of_the_whole_fleet_leaves_no_replica_ejected_once_it_answers(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    a, b = Replica("a", latency=0.5, mode="dead"), Replica("b", latency=0.5, mode="dead")
    judge = fleet(a, b, eject_after_failures=3, eject_backoff_s=2.0)
    for at in range(10):  # one attempt every 0.1 s, each refused at once
        await trio.sleep_until(at / 10)
        with pytest.raises(JudgeTransportError):
            await judge.attempt(CALL)
    # Round robin: a's third failure (t = 0.4) ejects it until 2.4, b's (0.5) until 2.5. The
    # attempts at 0.6 to 0.9 go out while every replica is ejected (least recently failed
    # first): no trials, so neither back-off doubles nor moves.
    assert [t for t, _ in a.log] == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert [t for t, _ in b.log] == [0.1, 0.3, 0.5, 0.7, 0.9]
    await trio.sleep_until(1.0)
    assert [s.back_in_s for s in judge.replica_stats()] == [
        pytest.approx(1.4),
        pytest.approx(1.5),
    ]
    assert [s.ejections for s in judge.replica_stats()] == [1, 1]
    # Both restart at t = 1.0. The next attempt still finds every replica ejected and goes to
    # the least recently failed (a): its answer brings it back at once (t = 1.5), 0.9 s before
    # its back-off would have ended.
    a.mode = b.mode = "ok"
    await judge.attempt(CALL)
    assert trio.current_time() == 1.5
    a_stats, b_stats = judge.replica_stats()
    assert (a_stats.ejected, b_stats.ejected) == (False, True)
    assert b_stats.back_in_s == pytest.approx(1.0)
    # b gets its trial when its own 2 s back-off is over (t = 2.5): back at 3.0.
    await trio.sleep_until(2.5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(judge.attempt, CALL)
        nursery.start_soon(judge.attempt, CALL)
    assert [t for t, o in b.log if o == "ok"] == [2.5]
    assert [s.ejected for s in judge.replica_stats()] == [False, False]
    # Refused calls that reached a server (`reached`) are failures, not "cannot be reached":
    # every replica ejected for them is no outage (issue 37: failing is not unreachable).
    back = [r.getMessage() for r in caplog.records if "is back" in r.getMessage()]
    assert back == [
        "judge replica a:8000 is back after 1.1s out (it answered an attempt)",
        "judge replica b:8000 is back after 2.5s out (it answered a trial attempt)",
    ]
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]


class Poisoned(NamedReplica):
    """A replica that answers 500 to one request (`response_1 == "poison"`) and otherwise as
    `inner` does: a failure the request causes on every replica."""

    def __init__(self, inner: Replica) -> None:
        self.inner = inner
        self.name = inner.name
        self.poisoned: list[float] = []

    async def attempt(self, call: JudgeCall) -> JudgeReply:
        if call.response_1 == "poison":
            self.poisoned.append(trio.current_time())
            await trio.lowlevel.checkpoint()
            raise JudgeHTTPError(500, b"template error")
        return await self.inner.attempt(call)


async def test_a_500_the_request_causes_on_two_replicas_ejects_neither(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from genrm_trio.judge.base import JudgeError

    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    a, b = Poisoned(Replica("a", latency=1.0)), Poisoned(Replica("b", latency=1.0))
    judge = JudgeFleet(
        fleet_entries(a, b),
        eject_after_failures=3,
        eject_backoff_s=5.0,
    )
    comparator, _ = comparator_for(judge, two_replicas())  # 4 attempts, 0.1 s apart
    for _ in range(3):  # 12 attempts, 6 on each replica, all 500
        with pytest.raises(JudgeError):
            await comparator.compare(poison_call(), pair=(0, 1), judge_pass=0)
    # a, b, a, b per comparison, each 0.1 s (the retry sleep) after the one before
    assert a.poisoned == pytest.approx([0.0, 0.2, 0.3, 0.5, 0.6, 0.8])
    assert b.poisoned == pytest.approx([0.1, 0.3, 0.4, 0.6, 0.7, 0.9])
    # Each comparison's first 500 counted until its retry got one on the other replica too;
    # then neither counts: both replicas stay in service, with the failures on record.
    stats = judge.replica_stats()
    assert [(s.ejected, s.ejections, s.consecutive_failures, s.failures) for s in stats] == [
        (False, 0, 0, 6),
        (False, 0, 0, 6),
    ]
    assert not [r for r in caplog.records if "ejected" in r.getMessage()]
    # A healthy request right after is answered by the first replica it tries.
    result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert result.attempts == 1


async def test_an_ejection_by_a_500_the_request_caused_is_taken_back(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from genrm_trio.judge.base import JudgeError

    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    sick, healthy = Replica("a", latency=1.0, mode="dead"), Replica("b", latency=1.0)
    a, b = Poisoned(sick), Poisoned(healthy)
    judge = JudgeFleet(
        fleet_entries(a, b),
        eject_after_failures=3,
        eject_backoff_s=5.0,
    )
    comparator, _ = comparator_for(judge, two_replicas())
    # a refuses two calls (t = 0 and 1.1: each comparison fails over to b, which answers)...
    for _ in range(2):
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert [t for t, _ in sick.log] == [0.0, 1.1]
    assert judge.replica_stats()[0].consecutive_failures == 2
    sick.mode = "ok"
    # ...then the poisoned request's first attempt, a 500 on a, is its third failure in a row
    # and ejects it; the retry's 500 on b shows the request at fault: a is back at once.
    now = trio.current_time()
    with pytest.raises(JudgeError):
        await comparator.compare(poison_call(), pair=(0, 1), judge_pass=0)
    assert a.poisoned[0] == now and b.poisoned[0] == pytest.approx(now + 0.1)
    a_stats, b_stats = judge.replica_stats()
    assert (a_stats.ejected, a_stats.ejections, a_stats.consecutive_failures) == (False, 1, 2)
    assert (b_stats.ejected, b_stats.consecutive_failures) == (False, 0)
    lines = [r.getMessage() for r in caplog.records if "judge replica a:8000" in r.getMessage()]
    assert len(lines) == 2
    assert "ejected after 3 consecutive failed attempts (last: JudgeHTTPError: HTTP 500" in lines[0]
    assert lines[1] == (
        "judge replica a:8000 is back after 0.1s out (it answered with a server error that "
        "the request caused on another replica too)"
    )


def poison_call() -> JudgeCall:
    return dataclasses.replace(CALL, response_1="poison")


async def test_a_500_on_one_replica_while_another_answers_still_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sick, healthy = Replica("a", latency=1.0, mode="http500"), Replica("b", latency=1.0)
    judge = fleet(sick, healthy, eject_after_failures=3, eject_backoff_s=5.0)
    comparator, _ = comparator_for(judge, two_replicas())
    for _ in range(5):
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    # Comparisons start on a while the round robin sends them there (t = 0, 1.1, 2.2): each
    # 500 is followed by b's answer, so it is a's fault: the third ejects a.
    assert [t for t, _ in sick.log] == [0.0, pytest.approx(1.1), pytest.approx(2.2)]
    a_stats = judge.replica_stats()[0]
    assert (a_stats.ejected, a_stats.ejections, a_stats.consecutive_failures) == (True, 1, 3)


async def test_cancelled_attempt_is_neither_answer_nor_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a = Replica("a", latency=10.0)
    judge = fleet(a, eject_after_failures=1)
    with trio.move_on_after(1.0):
        await judge.attempt(CALL)
    (stats,) = judge.replica_stats()
    assert (stats.calls, stats.failures, stats.in_flight, stats.ejected) == (1, 0, 0, False)
    assert stats.latency_count == 0


async def attempt_with_deadline(judge: JudgeFleet, seconds: float) -> bool:
    """One attempt as the Comparator runs it: under its own deadline, which, should it end the
    attempt, the Comparator reports through the attempt's ticket. Whether it timed out."""
    ticket = AttemptTicket()
    with trio.move_on_after(seconds) as scope:
        await judge.attempt(dataclasses.replace(CALL, ticket=ticket))
    if scope.cancelled_caught:
        ticket.deadline_expired(JudgeTimeout(seconds))
    return scope.cancelled_caught


async def test_a_replica_that_never_answers_is_ejected_by_its_hung_attempts(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    hung, healthy = Replica("a", latency=math.inf), Replica("b", latency=1.0)
    judge = fleet(hung, healthy, eject_after_failures=2)
    outcomes = []
    with caplog.at_level(logging.WARNING, "genrm_trio.judge"):
        for _ in range(6):  # each under its 10 s attempt deadline, as the Comparator runs them
            timed_out = await attempt_with_deadline(judge, 10.0)
            outcomes.append("timeout" if timed_out else "ok")
    # Round robin a, b, a: the second hung attempt ejects a, and b takes every later call.
    assert outcomes == ["timeout", "ok", "timeout", "ok", "ok", "ok"]
    assert trio.current_time() == 10 + 1 + 10 + 1 + 1 + 1
    a, b = judge.replica_stats()
    assert (a.calls, a.failures, a.ejected, a.in_flight, a.latency_count) == (2, 2, True, 0, 0)
    assert (b.calls, b.failures, b.ejected) == (4, 0, False)
    assert a.last_error == "TimeoutError: judge attempt exceeded 10.0s"
    [line] = [r.getMessage() for r in caplog.records if "ejected" in r.getMessage()]
    assert "a:8000 ejected after 2 consecutive failed attempts (last: TimeoutError" in line


async def test_an_attempt_cancelled_from_outside_is_not_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a = Replica("a", latency=math.inf)
    judge = fleet(a, eject_after_failures=1)
    ticket = AttemptTicket()  # never told of a deadline: however long it took, not the replica's
    with trio.move_on_after(30.0):  # the group's deadline, a disconnect: not the replica's fault
        await judge.attempt(dataclasses.replace(CALL, ticket=ticket))
    (stats,) = judge.replica_stats()
    assert (stats.calls, stats.failures, stats.ejected) == (1, 0, False)


# --- configuration ------------------------------------------------------------------------------


def test_make_judge_builds_a_fleet_for_one_url_as_for_a_list() -> None:
    for base_url in ("http://h:1/v1", ["http://h:1/v1"]):
        one = make_judge(
            settings_from_mapping({"judge": {"api": "genrm_model", "base_url": base_url}})
        )
        assert isinstance(one, JudgeFleet)
        assert one.replicas == ["h:1"]
        assert one.endpoint == "h:1"  # the judge error names it as one judge's would
        assert one.path == "/v1/responses"
        assert [replica.url for replica in one._replicas] == ["http://h:1/v1"]
    many = make_judge(
        settings_from_mapping(
            {"judge": {"api": "genrm_model", "base_url": ["http://h:1/v1", "http://h:2/v1/"]}}
        )
    )
    assert isinstance(many, JudgeFleet)
    assert many.replicas == ["h:1", "h:2"]
    assert many.path == "/v1/responses"
    same_host = make_judge(
        settings_from_mapping(
            {"judge": {"api": "genrm_model", "base_url": ["http://h:1/v1", "http://h:1/w/v1"]}}
        )
    )
    assert isinstance(same_host, JudgeFleet)
    assert same_host.replicas == ["http://h:1/v1", "http://h:1/w/v1"]


def test_make_judge_refuses_a_url_whose_judge_api_is_not_named() -> None:
    # The default, Gym's protocol, sent to a plain OpenAI server judges answers the model never
    # sees: a library user who names a URL names its API, as `serve` demands of its flags.
    for base_url in ("http://h:1/v1", ["http://h:1/v1", "http://h:2/v1"]):
        with pytest.raises(ConfigError) as caught:
            make_judge(settings_from_mapping({"judge": {"base_url": base_url}}))
        assert (caught.value.key, caught.value.message) == (
            "judge.api",
            f"required with judge.base_url: {JUDGE_API_CHOICES}",
        )
    # the default named on purpose is a choice; so is a Gym config's genrm_model_server
    named = settings_from_mapping({"judge": {"base_url": "http://h:1/v1", "api": "genrm_model"}})
    assert named.judge.api_chosen and make_judge(named).path == "/v1/responses"
    gym_data = {"genrm_model": {"responses_api_models": {"m": {"host": "h", "port": 1}}}}
    gym_block = {"genrm_model_server": {"type": "responses_api_models", "name": "genrm_model"}}
    gym_judge = judge_from_gym(gym_data, gym_block)
    assert gym_judge is not None
    gym = settings_from_mapping({"judge": gym_judge})
    assert gym.judge.api_chosen and make_judge(gym).path == "/v1/responses"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "non-empty list"),
        (["http://h:1/v1", "ftp://h/v1"], "item 1: must be an absolute http(s) URL"),
        (["http://h:1/v1", "http://h:1/v1/"], "item 1: http://h:1/v1 is listed twice"),
        ([1], "item 0: must be a URL string"),
        (7, "must be a URL or a non-empty list"),
    ],
)
def test_bad_url_lists_are_config_errors(value: object, message: str) -> None:
    from genrm_trio.config import ConfigError

    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"judge": {"api": "genrm_model", "base_url": value}})
    assert info.value.key == "judge.base_url"
    assert message in info.value.message


def test_total_concurrency_is_capped_by_the_replica_caps() -> None:
    def total(**judge: Any) -> int:
        return settings_from_mapping({"judge": judge}).judge.total_concurrency

    urls = ["http://h:1/v1", "http://h:2/v1", "http://h:3/v1"]
    assert total(base_url=urls, max_concurrency=256) == 256
    assert total(base_url=urls, max_concurrency=256, max_concurrency_per_replica=50) == 150
    assert total(base_url=urls, max_concurrency=100, max_concurrency_per_replica=50) == 100
    # one URL is a fleet of one replica: its cap is the total
    assert total(base_url="http://h:1/v1", max_concurrency_per_replica=5) == 5
    assert total(base_url=["http://h:1/v1"], max_concurrency_per_replica=5) == 5
    assert total(max_concurrency_per_replica=5) == 256  # no URL: a simulated judge


# --- three replicas through the engine ----------------------------------------------------------

N = 4  # circular: 4 comparisons a group
GROUPS = 40
EVERY_S = 0.5  # a group of 4 every 0.5 s, t = 0 .. 19.5
KILL_AT, REVIVE_AT = 4.25, 7.75


def fleet_settings() -> Settings:
    return Settings.model_validate(
        {
            "num_rollouts_per_prompt": N,
            "cohort_collection_timeout_s": 100.0,
            "cohort_evaluation_timeout_s": 100.0,
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.1,
            # Pins exact per-replica counts for comparisons that all start at their group's
            # last member (the routing order of eager starts differs).
            "eager_comparisons": False,
            "judge": {
                "api": "genrm_model",
                "base_url": ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"],
                "eject_after_failures": 3,
                "eject_backoff_s": 5.0,
            },
        }
    )


async def run_three_replicas() -> tuple[list[Any], Replica, Replica, Replica, JudgeFleet, bytes]:
    a, b, c = Replica("a", 1.0), Replica("b", 1.0, mode="http500"), Replica("c", 1.0)
    config = fleet_settings()
    judge = fleet(a, b, c, eject_after_failures=3, eject_backoff_s=5.0)
    replies: list[Any] = []

    async def script() -> None:
        await trio.sleep(KILL_AT)
        a.kill()  # refuses from now on; its calls in flight are reset
        await trio.sleep(REVIVE_AT - KILL_AT)
        a.mode = "ok"  # restarted

    async def group(g: int) -> None:
        await trio.sleep(g * EVERY_S)
        replies.extend(await gather(engine, [member(i, group=f"g{g}") for i in range(N)]))

    with trio.fail_after(3600):
        async with open_engine(config, judge) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(script)
            for g in range(GROUPS):
                nursery.start_soon(group, g)
        rendered = engine.metrics.render()
    return replies, a, b, c, judge, rendered


async def test_three_replicas_one_killed_one_500_one_back_masks_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    replies, a, b, c, judge, rendered = await run_three_replicas()
    assert len(replies) == GROUPS * N
    assert not [r for r in replies if isinstance(r, Masked)]
    assert all(isinstance(r, Scored) for r in replies)
    comparisons = GROUPS * N
    ok = a.outcomes()["ok"] + c.outcomes()["ok"]
    assert ok == comparisons  # every comparison answered once, by a healthy replica
    # b answers 500 to everything: three attempts eject it, then one trial per back-off (5 s,
    # 10 s: at t ~ 5 and ~ 15), each failing over to a healthy replica.
    assert b.outcomes() == Counter({"500": 5}), b.log
    # a: killed at 4.25 with calls in flight (reset), ejected, out until its trial 5 s later
    # (it was back up at 7.75), then in service again.
    assert a.outcomes()["refused"] == 0  # ejected before any new call reached the dead port
    assert a.outcomes()["reset"] == 4  # its calls in flight at the kill
    a_starts = [start for start, _ in a.log]
    assert not [t for t in a_starts if KILL_AT < t < KILL_AT + 5.0]
    # While both healthy replicas serve, each takes half of the attempts, within a few points.
    for lo, hi in ((0.0, KILL_AT), (KILL_AT + 6.0, GROUPS * EVERY_S)):
        a_n = sum(1 for t, _ in a.log if lo <= t < hi)
        c_n = sum(1 for t, _ in c.log if lo <= t < hi)
        assert abs(a_n / (a_n + c_n) - 0.5) <= 0.03, (lo, hi, a_n, c_n)
    # Exact counts per replica, as the fleet counted them and as /metrics shows them.
    stats = {s.replica: s for s in judge.replica_stats()}
    for replica in (a, b, c):
        s = stats[replica.endpoint]
        assert s.calls == len(replica.log)
        assert s.failures == sum(1 for _, o in replica.log if o != "ok")
        assert s.in_flight == 0
        line = f'genrm_trio_judge_replica_calls_total{{replica="{replica.endpoint}"}} {s.calls}.0'
        assert line.encode() in rendered
    assert (stats["a:8000"].ejected, stats["b:8000"].ejected, stats["c:8000"].ejected) == (
        False,
        True,
        False,
    )
    assert stats["a:8000"].ejections == 1
    assert b'genrm_trio_judge_replica_ejected{replica="b:8000"} 1.0' in rendered
    assert math.isclose(stats["c:8000"].latency_sum_s / stats["c:8000"].latency_count, 1.0)


async def test_three_replica_counts_are_exact_and_repeatable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    first = await run_three_replicas()
    counts = [(len(r.log), dict(r.outcomes())) for r in first[1:4]]
    for _ in range(3):
        again = await run_three_replicas()
        assert [(len(r.log), dict(r.outcomes())) for r in again[1:4]] == counts


async def test_comparator_fails_over_and_names_the_replica_of_the_last_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.judge.base import JudgeError
    from genrm_trio.metrics import Metrics

    config = fleet_settings()  # 4 attempts, 0.1 s apart
    a, b, c = (Replica(name, 1.0, mode="http500") for name in "abc")
    judge = fleet(a, b, c, eject_after_failures=3)
    comparator = Comparator(judge, config, Metrics())
    with pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    # Each retry avoids the replica that just failed: a, b, c, then a again.
    starts = sorted((start, r.name) for r in (a, b, c) for start, _ in r.log)
    assert [name for _, name in starts] == ["a", "b", "c", "a"]
    assert info.value.attempts == 4
    assert info.value.message.startswith("GenRM judge a:8000 /v1/responses pair=(0, 1) ")
    # One healthy replica is enough: b (next in the round robin) fails, the retry finds c.
    c.mode = "ok"
    result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert result.attempts == 2
    assert (len(a.log), len(b.log), c.outcomes()) == (2, 2, Counter({"500": 1, "ok": 1}))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("eject_after_failures", 4, "less than or equal to 3"),
        ("eject_after_failures", 0, "greater than or equal to 1"),
        ("eject_backoff_s", 0.0, "must be > 0"),
        ("keepalive_expiry_s", -1.0, "must be > 0"),
        ("keepalive_expiry_s", math.inf, "must be finite"),
        ("max_concurrency_per_replica", 0, "greater than or equal to 1"),
        ("max_response_bytes", 100, "greater than or equal to 1024"),
        ("ca_file", "/nonexistent/ca.pem", "/nonexistent/ca.pem is not a file"),
    ],
)
def test_new_judge_keys_are_validated(key: str, value: object, message: str) -> None:
    from genrm_trio.config import ConfigError

    with pytest.raises(ConfigError) as info:
        settings_from_mapping(
            {"judge": {"api": "genrm_model", "base_url": "http://h:1/v1", key: value}}
        )
    assert info.value.key == f"judge.{key}"
    assert message in info.value.message


def test_replica_settings_reach_the_fleet_and_its_judges() -> None:
    config = settings_from_mapping(
        {
            "judge": {
                "api": "genrm_model",
                "base_url": ["http://h:1/v1", "https://h:2/v1"],
                "max_concurrency_per_replica": 7,
                "eject_after_failures": 2,
                "eject_backoff_s": 1.5,
                "keepalive_expiry_s": 2.5,
                "max_response_bytes": 4096,
                "replica_stall_s": 30.0,
            }
        }
    )
    judge = make_judge(config)
    assert isinstance(judge, JudgeFleet)
    router = judge._router
    assert (router.cap, router.threshold, router.backoff) == (7, 2, 1.5)
    # and not the attempt deadline: the Comparator reports it
    assert judge._stall.stall_after == 30.0
    pools = [replica.judge._pool for replica in judge._replicas]  # type: ignore[attr-defined]
    assert [pool._keepalive_expiry for pool in pools] == [2.5, 2.5]
    assert [pool._max_body for pool in pools] == [4096, 4096]
    assert [pool._ssl_context is not None for pool in pools] == [False, True]


# --- timeouts, Retry-After and stalls in a fleet (issue #24) -------------------------------------


def two_replicas(**judge: Any) -> Settings:
    return Settings.model_validate(
        {
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.1,
            "judge": {
                "api": "genrm_model",
                "base_url": ["http://a:8000/v1", "http://b:8000/v1"],
                **judge,
            },
        }
    )


def comparator_for(judge: JudgeFleet, config: Settings, **kwargs: Any) -> tuple[Any, Any]:
    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.metrics import Metrics

    metrics = Metrics()
    metrics.watch_replicas(judge.replica_stats)
    return Comparator(judge, config, metrics, **kwargs), metrics


async def test_a_timed_out_attempt_is_retried_on_another_replica(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hung, healthy = Replica("a", latency=math.inf), Replica("b", latency=1.0)
    judge = fleet(hung, healthy)
    comparator, metrics = comparator_for(judge, two_replicas())
    result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    # a (round robin) takes the whole 10 s deadline; the retry, 0.1 s later, goes to b.
    assert (result.attempts, trio.current_time()) == (2, 10.0 + 0.1 + 1.0)
    assert [start for start, _ in healthy.log] == [10.1]
    a, b = judge.replica_stats()
    assert (a.calls, a.failures, a.in_flight, a.latency_count) == (1, 1, 0, 0)  # told, not guessed
    assert a.last_error == "TimeoutError: judge attempt exceeded 10.0s"
    assert metrics.registry.get_sample_value("genrm_trio_judge_retries_total", {"cause": "timeout"})
    assert (b.calls, b.failures) == (1, 0)


async def test_with_one_replica_a_timeout_is_not_retried_and_names_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from genrm_trio.judge.base import JudgeError

    config = Settings.model_validate(
        {
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 3,
            "judge": {
                "api": "genrm_model",
                "base_url": ["http://a:8000/v1"],
            },  # a list of one: D14 as for one URL
        }
    )
    judge = fleet(Replica("a", latency=math.inf))
    comparator, _ = comparator_for(judge, config)
    with pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    assert (info.value.attempts, trio.current_time()) == (1, 10.0)
    assert info.value.message == (
        "GenRM judge a:8000 /v1/responses pair=(0, 1) deadline=10.0s: "
        "TimeoutError: judge attempt exceeded 10.0s"
    )
    assert judge.replica_stats()[0].failures == 1


async def _comparisons_against(
    judge: Any, replica: Replica, config: Settings, origin: float
) -> list[tuple[float, str, str]]:
    """Five comparisons, one a second, against `judge` (whose only replica is `replica`), as
    the Comparator runs them with a seeded jitter; the replica heals before the fourth. Each
    comparison's (end time, outcome, judge error) and the replica's attempts, in order, their
    times since `origin`."""
    import random

    from genrm_trio.judge.attempts import Comparator
    from genrm_trio.judge.base import JudgeError
    from genrm_trio.metrics import Metrics

    comparator = Comparator(judge, config, Metrics(), rng=random.Random(7))
    results: list[tuple[float, str, str]] = []
    for n in range(5):
        await trio.sleep_until(origin + 100.0 * n)
        if n == 3:
            replica.mode = "ok"
            replica.latency = 1.0
        try:
            await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
        except JudgeError as error:
            results.append((trio.current_time(), f"failed after {error.attempts}", error.message))
        else:
            results.append((trio.current_time(), "scored", ""))
    results.extend((start, outcome, "attempt") for start, outcome in replica.log)
    return [(round(t - origin, 9), outcome, text) for t, outcome, text in results]


@pytest.mark.parametrize(
    ("mode", "latency"),
    # (a judge answering 429 forever holds its calls until their deadlines: no attempts;
    # tests/test_rate_limits.py)
    [("ok", 1.0), ("http500", 1.0), ("dead", 1.0), ("ok", math.inf)],
)
async def test_a_fleet_of_one_runs_comparisons_exactly_as_its_one_judge_would(
    mode: str, latency: float, autojump_clock: trio.testing.MockClock
) -> None:
    """One URL is a fleet of one replica (`make_judge`): through the Comparator it makes the
    same attempts at the same times, with the same errors, as the bare judge: a timeout is not
    retried (D14), a Retry-After is waited out (D13), and the only replica ejected (after 3
    failures, out for 5 s) still gets every attempt, so none fails untried."""
    config = Settings.model_validate(
        {
            "judge_request_timeout_s": 10.0,
            "genrm_parse_retries": 3,
            "genrm_parse_retry_sleep_s": 0.1,
            "judge": {"api": "genrm_model", "base_url": "http://a:8000/v1", "eject_backoff_s": 5.0},
        }
    )
    bare = Replica("a", latency=latency, mode=mode, retry_after=2.0)
    expected = await _comparisons_against(bare, bare, config, 0.0)
    alone = Replica("a", latency=latency, mode=mode, retry_after=2.0)
    judge = fleet(alone, eject_after_failures=3, eject_backoff_s=5.0)
    assert await _comparisons_against(judge, alone, config, 1000.0) == expected
    (stats,) = judge.replica_stats()
    hung = 3 if latency == math.inf else 0  # unlogged, told to the fleet by their deadline
    assert stats.calls == len(alone.log) + hung
    assert stats.failures == sum(1 for _, outcome in alone.log if outcome != "ok") + hung
    # ejected by its failures, back at its first answer once healed
    assert (stats.ejections > 0, stats.ejected) == (mode != "ok" or latency == math.inf, False)


async def test_a_timed_out_comparison_names_the_replica_of_its_last_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from genrm_trio.judge.base import JudgeError

    replicas = [Replica(name, latency=math.inf) for name in "abc"]
    judge = fleet(*replicas, eject_after_failures=3)
    config = fleet_settings()  # three replicas, 10 s per attempt, 4 attempts 0.1 s apart
    comparator, _ = comparator_for(judge, config)
    with pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(2, 3), judge_pass=0)
    # a, b, c, then a again (each retry avoids the replica that just hung)
    assert trio.current_time() == pytest.approx(4 * 10.0 + 3 * 0.1)
    assert [s.calls for s in judge.replica_stats()] == [2, 1, 1]
    assert info.value.message == (
        "GenRM judge a:8000 /v1/responses pair=(2, 3) deadline=10.0s: "
        "TimeoutError: judge attempt exceeded 10.0s"
    )
    assert "127.0.0.1" not in info.value.message and "," not in info.value.message.split()[2]


async def test_retry_after_holds_back_only_the_replica_that_sent_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    slow_down = Replica("a", mode="http429", retry_after=5.0)
    healthy = Replica("b", latency=1.0)
    judge = fleet(slow_down, healthy)
    comparator, _ = comparator_for(judge, two_replicas())
    ends: dict[str, float] = {}

    async def comparison(name: str, at: float) -> None:
        await trio.sleep_until(at)
        result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
        ends[name] = trio.current_time()
        assert result.selected is not None

    async with trio.open_nursery() as nursery:
        # a: 429, no attempt: sent again to b at once (no retry pacing)
        nursery.start_soon(comparison, "first", 0.0)
        nursery.start_soon(comparison, "second", 0.5)  # b: a is held back, though idle
        nursery.start_soon(comparison, "third", 5.5)  # a's hold is over: a again, then b
    assert [start for start, _ in slow_down.log] == [0.0, 5.5]
    assert [start for start, _ in healthy.log] == [0.0, 0.5, 5.5]
    assert ends == {"first": 1.0, "second": 1.5, "third": 6.5}
    # throttled is serving: a was never ejected, and its 429s were no failures
    a_stats, _ = judge.replica_stats()
    assert (a_stats.ejections, a_stats.failures, a_stats.calls) == (0, 0, 2)


async def test_when_every_replica_is_held_the_call_waits_for_the_first_hold_to_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from genrm_trio.judge.base import JudgeError

    a = Replica("a", mode="http429", retry_after=2.0)
    b = Replica("b", mode="http429", retry_after=2.0)
    judge = fleet(a, b)
    comparator, _ = comparator_for(judge, two_replicas())
    with trio.fail_after(5.0), pytest.raises(JudgeError) as info:
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
    # a at 0 (held to 2), b at once (held to 2); both held: the call waits, then a and b again
    # at 2 and at 4; then both are held to 6, past the 5 s deadline: it fails at once, at 4.
    assert [start for start, _ in a.log] == [0.0, 2.0, 4.0]
    assert [start for start, _ in b.log] == [0.0, 2.0, 4.0]
    assert trio.current_time() == 4.0
    assert info.value.attempts == 0
    assert "holds its calls for 2s (after a 429), past the deadline in 1s" in info.value.message


async def test_a_stalled_replica_is_out_at_replica_stall_s_and_its_calls_answered_elsewhere(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    hung, healthy = Replica("a", latency=math.inf), Replica("b", latency=1.0)
    judge = fleet(hung, healthy, stall_after_s=5.0, eject_backoff_s=10.0)
    comparator, metrics = comparator_for(judge, two_replicas())
    results: dict[str, tuple[int, float]] = {}

    async def comparison(name: str, at: float) -> None:
        await trio.sleep_until(at)
        result = await comparator.compare(CALL, pair=(0, 1), judge_pass=0)
        results[name] = (result.attempts, trio.current_time())

    with caplog.at_level(logging.WARNING, "genrm_trio.judge"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(comparison, "x1", 0.0)  # a (round robin): hangs
            nursery.start_soon(comparison, "x2", 0.25)  # b, answered at 1.25: a's silence counts
            nursery.start_soon(comparison, "x3", 0.5)  # a again (a tie, round robin): hangs
            await trio.sleep(4.9)
            a, _ = judge.replica_stats()
            assert (a.in_flight, a.ejected, a.stalls) == (2, False, 0)
    # At 5.0, five seconds after a's first call, with b's answer at 1.25 in between: stalled.
    # Its two calls are cancelled and retried on b 0.1 s later (the second of their attempts).
    assert results == {"x1": (2, 6.1), "x2": (1, 1.25), "x3": (2, 6.1)}
    assert [start for start, _ in healthy.log] == [0.25, 5.1, 5.1]
    a, b = judge.replica_stats()
    assert (b.calls, b.failures, b.stalls) == (3, 0, 0)
    assert (a.calls, a.failures, a.in_flight, a.stalls, a.ejections, a.ejected) == (
        2, 2, 0, 1, 1, True
    )  # fmt: skip
    assert a.back_in_s == pytest.approx(10.0 - (trio.current_time() - 5.0))
    assert a.last_error is not None and a.last_error.startswith("ReplicaStalled: judge replica a")
    retries = metrics.registry.get_sample_value(
        "genrm_trio_judge_retries_total", {"cause": "stall"}
    )
    assert retries == 2
    assert b'genrm_trio_judge_replica_stalls_total{replica="a:8000"} 1.0' in metrics.render()
    [line] = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
    assert line == (
        "judge replica a:8000 stalled: 2 calls in flight, none finished for 5s while other "
        "replicas answered; they are retried elsewhere; a trial attempt in 10s; 1 of 2 replicas "
        "in service"
    )


async def test_a_stalled_replica_comes_back_through_a_trial_that_answers(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    hung, healthy = Replica("a", latency=math.inf), Replica("b", latency=1.0)
    judge = fleet(hung, healthy, stall_after_s=5.0, eject_backoff_s=10.0)
    comparator, _ = comparator_for(judge, two_replicas())

    async def comparison(at: float) -> None:
        await trio.sleep_until(at)
        await comparator.compare(CALL, pair=(0, 1), judge_pass=0)

    caplog.set_level(logging.INFO, logger="genrm_trio.judge")
    async with trio.open_nursery() as nursery:
        for at in (0.0, 0.25):  # a hangs, b answers at 1.25: a stalls at 5.0, out until 15.0
            nursery.start_soon(comparison, at)
        for at in (16.0, 16.3):  # after the back-off: one is a's trial (it hangs), one b's
            nursery.start_soon(comparison, at)
    # b answered at 17.0 / 17.3: the trial (from 16.0) stalled at 21.0, counted as a failed
    # trial (the back-off doubles to 20 s), not as a second stall; its comparison went to b.
    a, _ = judge.replica_stats()
    assert (a.calls, a.stalls, a.ejections, a.ejected, a.in_flight) == (2, 1, 1, True, 0)
    assert a.back_in_s == pytest.approx(20.0 - (trio.current_time() - 21.0))
    hung.latency = 1.0  # it heals
    await trio.sleep_until(41.5)
    async with trio.open_nursery() as nursery:
        for at in (41.5, 41.7):
            nursery.start_soon(comparison, at)
    a, _ = judge.replica_stats()
    assert (a.calls, a.stalls, a.ejected) == (3, 1, False)  # its trial answered: back
    lines = [r.getMessage() for r in caplog.records if "judge replica a:8000" in r.getMessage()]
    assert len(lines) == 2 and "stalled" in lines[0] and "is back after" in lines[1]


async def test_no_stall_when_no_other_replica_answered_meanwhile(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Everyone is slow (or the load just started): silence alone is no stall. The attempt
    deadline decides, as without stall detection."""
    a, b = Replica("a", latency=math.inf), Replica("b", latency=math.inf)
    judge = fleet(a, b, stall_after_s=2.0)
    comparator, _ = comparator_for(judge, two_replicas())
    async with trio.open_nursery() as nursery:
        for pair in ((0, 1), (1, 2)):
            nursery.start_soon(functools.partial(comparator.compare, CALL, pair=pair, judge_pass=0))
        await trio.sleep(9.9)
        assert [(s.stalls, s.ejected, s.in_flight) for s in judge.replica_stats()] == [
            (0, False, 1),
            (0, False, 1),
        ]
        nursery.cancel_scope.cancel()
    assert [s.failures for s in judge.replica_stats()] == [0, 0]


def test_replica_stall_s_is_validated() -> None:
    from genrm_trio.config import ConfigError

    for value, message in ((0.0, "must be > 0"), (math.inf, "must be finite"), ("5", "")):
        with pytest.raises(ConfigError) as info:
            settings_from_mapping(
                {
                    "judge": {
                        "api": "genrm_model",
                        "base_url": "http://h:1/v1",
                        "replica_stall_s": value,
                    }
                }
            )
        assert info.value.key == "judge.replica_stall_s"
        assert message in info.value.message
    judge = settings_from_mapping(
        {"judge": {"api": "genrm_model", "base_url": ["http://h:1/v1"], "replica_stall_s": 30}}
    )
    assert judge.judge.replica_stall_s == 30.0


async def test_a_replica_that_only_refuses_is_no_answer_beside_a_silent_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A refused connection is no sign that the fleet serves: it does not make another replica's
    silence a stall (ejection takes care of the refusing one)."""
    dead, hung = Replica("a", mode="dead"), Replica("b", latency=math.inf)
    judge = fleet(dead, hung, stall_after_s=2.0)
    comparator, _ = comparator_for(judge, two_replicas())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(comparator.compare, CALL, pair=(0, 1), judge_pass=0))
        await trio.sleep(9.0)
        a, b = judge.replica_stats()
        assert (a.calls, a.failures) == (1, 1)  # refused at once; the retry went to b
        assert (b.calls, b.in_flight, b.stalls, b.ejected) == (1, 1, 0, False)
        nursery.cancel_scope.cancel()
