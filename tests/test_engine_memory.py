"""A held member keeps only its compact Member (docs/differences.md, D22), never its request.

While a `/verify` request waits for its group, the engine must not keep the request body (the
whole policy response, the prompt, the input object) alive: the caller owns it. Measured in
benchmarks/engine.py; checked here with weak references.
"""

from __future__ import annotations

import gc
import weakref
from functools import partial
from typing import Any

import trio
import trio.testing
from judges import ScriptedJudge, member, response, running, settings
from trio.testing import MockClock

from genrm_trio.domain.model import Scored, VerifyInput
from genrm_trio.engine.cohort import Member


class Body(dict[str, Any]):
    """A dict that can be weakly referenced."""


class Prompt(list[Any]):
    """A list that can be weakly referenced."""


def weak_item(index: int) -> tuple[VerifyInput, weakref.ref[Body], weakref.ref[Prompt]]:
    body = Body(response(f"a{index}"))
    prompt = Prompt([{"role": "user", "content": "Hello", "type": "message"}])
    item = VerifyInput(
        input=prompt,
        response=body,
        group_id="g",
        group_attempt=0,
        group_attempt_given=True,
        rollout_index=index,
    )
    return item, weakref.ref(body), weakref.ref(prompt)


def tracked_item(
    refs: list[tuple[weakref.ref[Body], weakref.ref[Prompt]]], index: int
) -> VerifyInput:
    """A request whose body and prompt are watched through `refs` (the caller keeps no copy)."""
    item, body, prompt = weak_item(index)
    refs.append((body, prompt))
    return item


async def test_a_waiting_request_keeps_nothing_of_its_body(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    async with running(settings(num_rollouts_per_prompt=3), judge) as engine:
        replies: dict[int, object] = {}
        refs: list[tuple[weakref.ref[Body], weakref.ref[Prompt]]] = []
        make = partial(tracked_item, refs)

        async def send(index: int) -> None:
            replies[index] = await engine.verify(make(index))  # the only reference, handed over

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, 0)
            nursery.start_soon(send, 1)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            assert engine.statistics().waiters == 2
            assert [(b() is None, p() is None) for b, p in refs] == [(True, True)] * 2
            third = [{"role": "user", "content": "Hello", "type": "message"}]
            assert isinstance(await engine.verify(member(2, prompt=third)), Scored)
        assert all(isinstance(r, Scored) for r in replies.values()), replies
        assert replies[0] != replies[1]


async def test_a_request_queued_at_the_registry_lock_keeps_nothing_of_its_body(
    autojump_clock: MockClock,
) -> None:
    """Requests pass the registry section one per scheduler pass (a throttle on intake, see
    Engine._join), so under load many queue there: each must hold only its key, digests and
    compact member, not the decoded body it came from."""
    async with running(settings(num_rollouts_per_prompt=3), ScriptedJudge()) as engine:
        refs: list[tuple[weakref.ref[Body], weakref.ref[Prompt]]] = []
        make = partial(tracked_item, refs)

        async def send(index: int) -> None:
            await engine.verify(make(index))

        lock = engine._lock
        await lock.acquire()  # as a restore would: every request now queues at the lock
        try:
            async with trio.open_nursery() as nursery:
                for index in range(3):
                    nursery.start_soon(send, index)
                await trio.testing.wait_all_tasks_blocked()
                assert lock.statistics().tasks_waiting == 3
                gc.collect()
                assert [(body(), prompt()) for body, prompt in refs] == [(None, None)] * 3
                lock.release()
        finally:
            if lock.locked() and lock.statistics().owner is trio.lowlevel.current_task():
                lock.release()


async def test_waiters_share_the_cohort_event_and_detach_alone(
    autojump_clock: MockClock,
) -> None:
    judge = ScriptedJudge()
    async with running(settings(num_rollouts_per_prompt=2), judge) as engine:
        replies: list[object] = []

        async def send(index: int) -> None:
            replies.append(await engine.verify(member(index)))

        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as gone:
                nursery.start_soon(send, 0)  # stays
                async with trio.open_nursery() as inner:
                    inner.start_soon(send, 0)  # the same rollout again, then disconnects
                    await trio.testing.wait_all_tasks_blocked()
                    assert engine.statistics().waiters == 2
                    gone.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().waiters == 1
            nursery.start_soon(send, 1)
        assert len(replies) == 2 and all(isinstance(r, Scored) for r in replies), replies


def _long_text(seed: int, words: int) -> str:
    return " ".join(f"t{(i * 7919 + seed) % 1013}" for i in range(words))


def test_long_member_texts_wait_compressed_and_read_back_exactly() -> None:
    reasoning = _long_text(1, 2000) + " \ud800 lone"  # ~12 KB of trace, with a lone surrogate
    answer = _long_text(2, 300) + " caf\u00e9 \U0001f600 \udfff"
    held = Member(
        index=0,
        response_digest="d" * 64,
        answer_text=answer,
        reasoning_text=reasoning,
        rubric_ids=None,
        baseline_digest=None,
    )
    assert held.texts() == (reasoning, answer)
    assert type(held._texts) is bytes and len(held._texts) * 2 < len(reasoning) + len(answer)
    short = Member(
        index=1,
        response_digest="d" * 64,
        answer_text="four",
        reasoning_text="",
        rubric_ids=None,
        baseline_digest=None,
    )
    assert short.texts() == ("", "four") and type(short._texts) is tuple


async def test_long_answers_are_judged_and_echoed_exactly(autojump_clock: MockClock) -> None:
    judge = ScriptedJudge()
    answers = [_long_text(i, 900) + f" \udc80{i}" for i in range(2)]
    async with running(settings(num_rollouts_per_prompt=2), judge) as engine:
        replies: dict[int, object] = {}

        async def send(index: int) -> None:
            item = member(index, answer=answers[index], reasoning=_long_text(9, 800))
            replies[index] = await engine.verify(item)

        async with trio.open_nursery() as nursery:
            for index in range(2):
                nursery.start_soon(send, index)
    for index in range(2):
        reply = replies[index]
        assert isinstance(reply, Scored)
        assert reply.result["answer_text"] == answers[index]
        assert reply.result["reasoning_text"] == _long_text(9, 800)
    assert {text for c in judge.calls for text in c.shown} == set(answers)  # judged as given
