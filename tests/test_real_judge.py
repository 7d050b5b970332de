"""genrm-trio against a real inference server that none of us wrote (issue 28 item 5):
Hugging Face `transformers serve` with tiny models built here (tests/tiny_models.py), behind a
recording proxy (tests/real_judge.py), and a real `genrm-trio serve` process.

- every judge API that talks to a plain OpenAI server shows the model the answers (the server's
  own prompt-token counts grow with them), never streams, and its token metrics equal the usage
  the server reported;
- Gym's `genrm_model` protocol pointed at it is found at the first group (ERROR, metric,
  `/judge/replicas`, `/readyz` 503); without `"stream": false` the failure names the stream;
- a judge that runs to its output budget escalates it on `finish_reason: length`;
- a chat template that rejects the GenRM roles fails (a bare 500, so no roles hint), and
  `judge.prompt: instruct` gets through it and scores;
- the judge (a single one, and both replicas of a fleet) killed with `kill -9` while groups are
  in flight and restarted: no rollout masked.

Skipped without the ML packages, failed instead under GENRM_TRIO_REQUIRE_ML=1 (CI's 3.11 leg).
Bounded: tiny models, 16-token budgets, one small group each.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from procs import (
    Proc,
    assert_masked,
    assert_scored,
    bodies,
    client,
    metrics,
    run_group,
    start_server,
)
from real_judge import RecordingProxy, ServeProcess, recording_proxy, transformers_serve
from tiny_models import BUDGET, STRICT, VERDICT, TinyModel, build_tiny_model, require_ml

pytestmark = pytest.mark.slow

REPLICA = "genrm_trio_judge_replica_{}_tokens_total"
# answers of very different lengths: a model that reads them sees very different prompts
ANSWERS = [
    "four",
    "The answer is 4, since two and two make four.",
    "It is four. " * 40,
    "Two plus two: " + "carefully adding the units, " * 25 + "four.",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    require_ml(serving=True)
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "verdict": build_tiny_model(root / "verdict", VERDICT),
        "budget": build_tiny_model(root / "budget", BUDGET, seed=1),
        "strict": build_tiny_model(root / "strict", STRICT, seed=2),
    }


@pytest.fixture(scope="module")
def verdict_server(
    models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeProcess]:
    with transformers_serve(models["verdict"].path, tmp_path_factory.mktemp("serve")) as server:
        yield server


def config(api: str, model: TinyModel, **extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "num_rollouts_per_prompt": 4,
        "comparison_strategy": "circular",
        "judge": {"api": api, "model": str(model.path)},
        "genrm_responses_create_params": {"input": [], "max_output_tokens": 16, "temperature": 1.0},
        "judge_request_timeout_s": 60,
        "cohort_collection_timeout_s": 120,
        "cohort_evaluation_timeout_s": 240,
        "genrm_parse_retries": 1,
        "genrm_parse_retry_sleep_s": 0.05,
    }
    settings.update(extra)
    return settings


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, judge: str, settings: dict[str, Any], *more: str
) -> AsyncIterator[Proc]:
    """`genrm-trio serve` with its judge at `judge` (the recording proxy, or the server itself),
    and `more` replicas of a fleet; stopped and closed when the block ends (its log stays)."""
    extra = [flag for url in more for flag in ("--judge-url", f"{url}/v1")]

    def start() -> Proc:
        return start_server(tmp_path, settings, judge_url=f"{judge}/v1", extra=extra)

    server = await trio.to_thread.run_sync(start)
    try:
        yield server
    finally:
        server.stop()
        server.close()


@contextlib.contextmanager
def own_judge(model: TinyModel, tmp_path: Path, name: str) -> Iterator[RecordingProxy]:
    """A `transformers serve` of `model` for one test, behind a recording proxy."""
    with (
        transformers_serve(model.path, tmp_path, name) as judge,
        recording_proxy(judge.url) as proxy,
    ):
        yield proxy


async def group(http: httpx.AsyncClient, server: Proc, group_id: str) -> list[Any]:
    replies, _ = await run_group(http, server.url, bodies(group_id, ANSWERS))
    return replies


def prompt_tokens(proxy: RecordingProxy) -> dict[tuple[str, str], int]:
    """The server's prompt-token count of each comparison, by its two answers."""
    counts: dict[tuple[str, str], int] = {}
    for exchange in proxy.posts():
        request, usage = exchange.request, exchange.reply["usage"]
        shown = request.get("messages") or request.get("input")
        answers = tuple(m["content"] for m in shown if m["role"] in ("response_1", "response_2"))
        counts[answers] = usage.get("prompt_tokens", usage.get("input_tokens"))  # type: ignore[index]
    return counts


@pytest.mark.parametrize("api", ["chat_completions", "openai_responses"])
async def test_a_plain_server_reads_the_answers_and_usage_is_the_metrics(
    tmp_path: Path, models: dict[str, TinyModel], verdict_server: ServeProcess, api: str
) -> None:
    with recording_proxy(verdict_server.url) as proxy:
        settings = config(api, models["verdict"])
        async with serving(tmp_path, proxy.url, settings) as server, client() as http:
            for reply in await group(http, server, "g-" + api):
                assert_scored(reply)
            samples = await metrics(http, server.url)
            replicas = (await http.get(f"{server.url}/judge/replicas")).json()
            ready = await http.get(f"{server.url}/readyz")
    posts = proxy.posts("/chat/completions" if api == "chat_completions" else "/responses")
    assert len(posts) == 4 == len(proxy.posts())  # circular: 4 comparisons, one attempt each
    assert all(p.request["stream"] is False and p.status == 200 for p in posts)
    assert all(p.content_type.startswith("application/json") for p in posts)
    # the model saw the answers: the server's prompt tokens grow with them
    counts = prompt_tokens(proxy)
    assert len(counts) == 4
    by_size = sorted(counts.items(), key=lambda item: len(item[0][0]) + len(item[0][1]))
    (short, fewest), (long, most) = by_size[0], by_size[-1]
    grown = sum(map(len, long)) - sum(map(len, short))
    assert grown > 400 and most - fewest > grown // 8, counts
    # usage as the server reported it, summed, is the metrics
    tokens_in, tokens_out = proxy.usage()
    replica = proxy.url.removeprefix("http://")
    tokens = {
        side: samples.total(REPLICA.format(side), replica=replica) for side in ("input", "output")
    }
    assert tokens["input"] == tokens_in > 0
    assert tokens["output"] == tokens_out == 2 * 4  # verdict, EOS
    assert samples.total("genrm_trio_judge_comparisons_total") == 4
    assert [r["answers_unread"] for r in replicas] == [None]
    assert ready.status_code == 200


async def test_gyms_protocol_at_a_plain_server_is_found_at_the_first_group(
    tmp_path: Path, models: dict[str, TinyModel], verdict_server: ServeProcess
) -> None:
    """`judge.api: genrm_model` (the answers in `metadata`) at a server that never shows
    `metadata` to its model: equal prompt tokens whatever the answers. `"stream": false` in the
    create params, as vLLM answers by default; without it transformers serve streams, and the
    failure says so."""
    settings = config("genrm_model", models["verdict"])
    settings["genrm_responses_create_params"]["stream"] = False
    with recording_proxy(verdict_server.url) as proxy:
        async with serving(tmp_path, proxy.url, settings) as server, client() as http:
            for reply in await group(http, server, "g-gym"):
                assert_scored(reply)  # the rewards look normal: that is the danger
            samples = await metrics(http, server.url)
            replicas = (await http.get(f"{server.url}/judge/replicas")).json()
            ready = await http.get(f"{server.url}/readyz")
    counts = {p.reply["usage"]["input_tokens"] for p in proxy.posts("/responses")}
    assert len(counts) == 1, counts  # the model saw the same prompt for every comparison
    [replica] = replicas
    # the same 31 tokens the issue measured at vLLM: fewer than the answers alone need
    evidence = replica["answers_unread"]
    assert "alone need" in evidence or "does not grow with the answers" in evidence
    assert replica["prompts_unread"] == 1
    unread = "genrm_trio_judge_replica_answers_unread_prompts_total"
    assert samples.total(unread, replica=replica["replica"]) == 1
    assert ready.status_code == 503
    assert ready.json()["reason"].startswith("the judge does not read the answers")
    assert "set judge.api: chat_completions (or openai_responses)" in ready.json()["reason"]
    errors = [line for line in server.log().splitlines() if "does not read the answers" in line]
    assert len(errors) == 1 and "ERROR" in errors[0] and "judge.api genrm_model" in errors[0]


async def test_a_streamed_reply_names_its_content_type(
    tmp_path: Path, models: dict[str, TinyModel], verdict_server: ServeProcess
) -> None:
    settings = config("genrm_model", models["verdict"], num_rollouts_per_prompt=2)
    with recording_proxy(verdict_server.url) as proxy:
        async with serving(tmp_path, proxy.url, settings) as server, client() as http:
            replies, _ = await run_group(http, server.url, bodies("g-sse", ANSWERS[:2]))
    posts = proxy.posts()
    assert len(posts) == 2  # circular over 2: both orders; a reply that is not JSON is final
    assert all(post.content_type.startswith("text/event-stream") for post in posts)
    for reply in replies:
        reason = assert_masked(reply)
        assert "the reply is not JSON: content-type text/event-stream" in reason, reason
        assert "first 'data: " in reason, reason


async def test_output_budget_exhaustion_escalates_on_finish_reason_length(
    tmp_path: Path, models: dict[str, TinyModel]
) -> None:
    settings = config(
        "chat_completions",
        models["budget"],
        num_rollouts_per_prompt=2,
        genrm_parse_retries=3,
        judge={
            "api": "chat_completions",
            "model": str(models["budget"].path),
            "budget_escalation": {"factor": 2.0, "max_output_tokens": 64},
        },
    )
    with own_judge(models["budget"], tmp_path, "budget") as proxy:
        async with serving(tmp_path, proxy.url, settings) as server, client() as http:
            replies, _ = await run_group(http, server.url, bodies("g-budget", ANSWERS[:2]))
            samples = await metrics(http, server.url)
    # two comparisons (circular over 2: both orders), each 16 -> 32 -> 64 and held at the cap
    posts = proxy.posts()
    budgets = [16, 32, 64, 64] * 2
    assert sorted(p.request["max_tokens"] for p in posts) == sorted(budgets)
    assert [p.reply["choices"][0]["finish_reason"] for p in posts] == ["length"] * 8
    assert all(p.reply["usage"]["completion_tokens"] == p.request["max_tokens"] for p in posts)
    for reply in replies:
        reason = assert_masked(reply)
        assert "exhausted max_output_tokens from 16 up to 64 without emitting a verdict" in reason
    cut = [line for line in server.log().splitlines() if "finish_reason=length" in line]
    assert len(cut) == 8 and all("contains no verdict" in line for line in cut)
    assert samples.total("genrm_trio_judge_budget_escalations_total") == 4
    tokens_in, tokens_out = proxy.usage()
    replica = proxy.url.removeprefix("http://")
    assert samples.total(REPLICA.format("input"), replica=replica) == tokens_in
    assert samples.total(REPLICA.format("output"), replica=replica) == tokens_out == sum(budgets)


async def test_a_strict_chat_template_refuses_the_genrm_roles_and_takes_the_instruct_prompt(
    tmp_path: Path, models: dict[str, TinyModel]
) -> None:
    """transformers serve answers a template's exception with a bare 500: nothing in it says
    roles, so no roles hint (#38); `judge.prompt: instruct` gets through and scores."""
    genrm = config("chat_completions", models["strict"], num_rollouts_per_prompt=2)
    instruct = config("chat_completions", models["strict"], num_rollouts_per_prompt=2)
    instruct["judge"]["prompt"] = "instruct"
    with own_judge(models["strict"], tmp_path, "strict") as proxy:
        async with serving(tmp_path, proxy.url, genrm) as server, client() as http:
            # the answer probe, when the engine starts: before any group
            with trio.fail_after(60):
                while (ready := await http.get(f"{server.url}/readyz")).status_code == 200:  # noqa: ASYNC110
                    await trio.sleep(0.2)
            replies, _ = await run_group(http, server.url, bodies("g-strict", ANSWERS[:2]))
            log = server.log()
        # two comparisons, each retried once (genrm_parse_retries: 1)
        assert [p.status for p in proxy.posts()] == [500] * 4
        for reply in replies:
            reason = assert_masked(reply)
            assert reason.endswith("JudgeHTTPError: HTTP 500; response=Internal Server Error")
        # the answer probe: refused with the roles, answered in the instruct messages
        probes = proxy.probes()
        assert [p.status for p in probes] == [500, 200]
        assert [m["role"] for m in probes[1].request["messages"]] == ["system", "user"]
        fix = "Fix: set judge.prompt: instruct"
        assert ready.status_code == 503
        assert ready.json()["reason"].startswith("the judge does not take the GenRM roles")
        assert fix in ready.json()["reason"]
        errors = [line for line in log.splitlines() if "does not take the GenRM roles" in line]
        assert len(errors) == 1 and "ERROR" in errors[0] and fix in errors[0]
        async with serving(tmp_path, proxy.url, instruct) as server, client() as http:
            replies, _ = await run_group(http, server.url, bodies("g-instruct", ANSWERS[:2]))
            with trio.fail_after(60):
                while len(proxy.probes()) < 3:  # noqa: ASYNC110 - the probe answered
                    await trio.sleep(0.2)
            ready = await http.get(f"{server.url}/readyz")
        posts = proxy.posts()[4:]
        probes = proxy.probes()[2:]
    assert ready.status_code == 200
    assert [p.status for p in probes] == [200]  # the instruct prompt reads the answers
    assert [p.status for p in posts] == [200] * 2
    for reply in replies:
        assert_scored(reply)
    for exchange in posts:
        roles = [m["role"] for m in exchange.request["messages"]]
        assert roles == ["system", "user"]
        user = exchange.request["messages"][1]["content"]
        assert user.index("# Response 1") < user.index("# Response 2")
        assert ANSWERS[0] in user and ANSWERS[1] in user


@pytest.mark.parametrize("replicas", [1, 2], ids=["one judge", "a fleet of two"])
async def test_a_judge_killed_and_restarted_mid_step_masks_nothing(
    tmp_path: Path, models: dict[str, TinyModel], replicas: int
) -> None:
    """`kill -9` of the judge (every replica of a fleet) while groups are in flight, back a few
    seconds later (issue 28 item 2): the comparisons wait for it (bounded by the group deadline,
    300 s here) instead of spending their attempts, and no rollout is masked."""
    settings = config(
        "chat_completions",
        models["verdict"],
        cohort_evaluation_timeout_s=300,
        genrm_parse_retries=3,
        judge={
            "api": "chat_completions",
            "model": str(models["verdict"].path),
            "outage_probe_s": 1.0,
        },
    )
    groups = 6
    with contextlib.ExitStack() as stack:
        judges = [
            stack.enter_context(transformers_serve(models["verdict"].path, tmp_path, f"j{i}"))
            for i in range(replicas)
        ]
        more = (j.url for j in judges[1:])
        async with (
            serving(tmp_path, judges[0].url, settings, *more) as server,
            client(timeout=400.0) as http,
        ):
            replies: dict[int, list[Any]] = {}
            down: list[int] = []

            async def one(g: int) -> None:
                await trio.sleep(0.5 * g)  # groups keep arriving through the outage
                replies[g] = await group(http, server, f"g-kill-{g}")

            async def outage() -> None:
                await trio.sleep(1.0)
                for judge in judges:
                    judge.kill()  # kill -9, as a crash or an OOM would
                await trio.sleep(4.0)
                down.append((await http.get(f"{server.url}/readyz")).status_code)
                for judge in judges:  # the same port, a new process
                    await trio.to_thread.run_sync(judge.start)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(outage)
                for g in range(groups):
                    nursery.start_soon(one, g)
            samples = await metrics(http, server.url)
            ready = await http.get(f"{server.url}/readyz")
    for g in range(groups):
        for reply in replies[g]:
            assert_scored(reply)
    assert samples.total("genrm_trio_masked_rollouts_total") == 0  # exported, and 0 in every label
    assert down == [503] and ready.status_code == 200
    assert samples.value("genrm_trio_judge_unreachable_seconds_total") > 0
    log = server.log()
    assert "judge unreachable: no replica can be reached" in log
    assert "judge is back after" in log
