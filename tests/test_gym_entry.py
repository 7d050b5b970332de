"""NeMo Gym launches genrm-trio: `genrm-trio gym-root`, app.py's launch contract, the judge found
through `genrm_model_server`, Gym's default principle, and a shutdown that idle keep-alive
connections do not hold (docs/operations.md, "NeMo Gym launches genrm-trio").

Gym itself is not needed here: its launch is two environment variables and a working directory,
fabricated below exactly as `gym env start` sets them. `benchmarks/gym_stack.py` runs the real
stack.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import procs
import pytest
import trio
import yaml

from genrm_trio import __version__
from genrm_trio.app.cli import main as cli_main
from genrm_trio.app.compose import durable_engine
from genrm_trio.app.gym import CONFIG_ENV, INSTANCE_ENV, gym_root, settings_from_gym_env
from genrm_trio.app.serve import bind_socket, serve_app
from genrm_trio.config import DEFAULT_PRINCIPLE, ConfigError, Settings, load_settings
from genrm_trio.http.app import create_app
from genrm_trio.testing import SimConfig, SimJudge

INSTANCE = "genrm_compare_resources_server"
SERVER_DIR = gym_root() / "resources_servers" / "genrm_trio"


def gym_config(
    block: Mapping[str, Any], *, model_port: int | None = 18_001, model_name: str = "genrm_model"
) -> dict[str, Any]:
    """A resolved Gym config as `gym env start` hands it over: every server with host and port."""
    model: dict[str, Any] = {"entrypoint": "app.py", "model": "${genrm_model_name}"}
    if model_port is not None:
        model |= {"host": "127.0.0.1", "port": model_port}
    return {
        INSTANCE: {"resources_servers": {"genrm_trio": dict(block)}},
        model_name: {"responses_api_models": {"openai_model": model}},
        "policy_model": {
            "responses_api_models": {
                "openai_model": {"entrypoint": "app.py", "host": "127.0.0.1", "port": 18_002}
            }
        },
        "head_server": {"host": "127.0.0.1", "port": 11_000},
    }


BLOCK: dict[str, Any] = {
    "entrypoint": "app.py",
    "host": "127.0.0.1",
    "port": 18_000,
    "genrm_model_server": {"type": "responses_api_models", "name": "genrm_model"},
    "num_rollouts_per_prompt": 16,
    "domain": "rlhf",
    "verified": False,
    "description": "GenRM pairwise comparison for RLHF training",
    "value": "Compare multiple candidate responses using GenRM model",
}


def env_for(config: Mapping[str, Any], instance: str = INSTANCE) -> dict[str, str]:
    return {CONFIG_ENV: yaml.safe_dump(dict(config)), INSTANCE_ENV: instance}


def env_error(environ: Mapping[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        settings_from_gym_env(environ)
    return info.value


# --- gym-root ------------------------------------------------------------------------------------


def test_gym_root_prints_the_directory_gym_searches(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["gym-root"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    root = Path(printed.strip())
    assert root.is_absolute() and root == gym_root()
    server = root / "resources_servers" / "genrm_trio"
    for name in ("app.py", "requirements.txt", "configs/genrm_trio.yaml"):
        assert (server / name).is_file(), name


def test_requirements_name_this_version() -> None:
    lines = (SERVER_DIR / "requirements.txt").read_text().split()
    # Gym installs these lines (plus nemo-gym) into the server's venv when it builds one.
    assert lines == [f"genrm-trio=={__version__}"]


def test_shipped_config_is_gyms_with_the_block_renamed() -> None:
    data = yaml.safe_load((SERVER_DIR / "configs" / "genrm_trio.yaml").read_text())
    servers = data[INSTANCE]["resources_servers"]
    assert list(servers) == ["genrm_trio"]
    block = servers["genrm_trio"]
    assert block["entrypoint"] == "app.py"
    assert block["genrm_model_server"] == {"type": "responses_api_models", "name": "genrm_model"}
    # Gym 0.7.0's shipped values, unchanged
    assert block["num_rollouts_per_prompt"] == 16
    assert block["cohort_result_ttl_s"] == 21600
    assert block["genrm_responses_create_params"]["max_output_tokens"] == 16384
    agent = data["genrm_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": INSTANCE}


def test_shipped_config_comments_match_genrm_trio() -> None:
    """Gym's comments, kept where they hold, say what genrm-trio does where they did not."""
    from typing import get_args

    from genrm_trio.config import AggregatorMethod, ComparisonStrategy

    lines = (SERVER_DIR / "configs" / "genrm_trio.yaml").read_text().splitlines()
    text = "\n".join(lines)
    comments = "\n".join(line for line in lines if line.lstrip().startswith("#"))
    # every aggregator and strategy genrm-trio takes is named where the key is explained
    for value in (*get_args(AggregatorMethod), *get_args(ComparisonStrategy)):
        assert f'"{value}"' in comments, value
    assert "currently supported" not in comments
    assert "majority" not in comments.replace("no majority vote", "")
    # where a comment says a block is above or below, it is
    block_at = lines.index("genrm_model:")
    for number, line in enumerate(lines):
        found = re.search(r'"genrm_model" block (above|below)', line)
        if found:
            assert (found.group(1) == "below") == (number < block_at), line
    assert "Includes connection retries and queue wait" not in text


def test_shipped_config_loads_with_serve_and_needs_a_judge_url(tmp_path: Path) -> None:
    path = SERVER_DIR / "configs" / "genrm_trio.yaml"
    # Unresolved (no host/port for genrm_model): no judge is implied, --judge-url gives one.
    settings = load_settings(path, instance=INSTANCE)
    assert settings.num_rollouts_per_prompt == 16
    assert settings.judge.base_url is None
    flagged = load_settings(
        path, instance=INSTANCE, overrides={"judge.base_url": "http://127.0.0.1:8000/v1"}
    )
    assert flagged.judge.base_url == "http://127.0.0.1:8000/v1"
    assert flagged.judge.probe is True


def test_shipped_config_starts_without_the_deadline_warning() -> None:
    # Gym's 1800 s for the judge and the group, with mask_pending: a hung call masks only its
    # comparison, so the warning the README tells users to avoid does not apply
    settings = load_settings(SERVER_DIR / "configs" / "genrm_trio.yaml", instance=INSTANCE)
    assert settings.judge_request_timeout_s == settings.cohort_evaluation_timeout_s == 1800
    assert settings.evaluation_deadline_policy == "mask_pending"
    assert [line.split(" ")[0] for line in settings.startup_warnings()] == ["masked"]


def test_instance_on_a_flat_file_says_it_is_not_a_gym_config(tmp_path: Path) -> None:
    flat = tmp_path / "genrm.yaml"
    flat.write_text("num_rollouts_per_prompt: 16\n")
    with pytest.raises(ConfigError) as info:
        load_settings(flat, instance="foo")
    assert (info.value.file, info.value.key) == (str(flat), "--instance")
    assert info.value.message == (
        "this is not a Gym config file but a flat one (genrm-trio keys at the top level): "
        "--instance picks a block of a Gym config; drop it"
    )


def test_no_judge_in_a_gym_file_is_one_error_without_a_misleading_line(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, restore_logging: None
) -> None:
    path = SERVER_DIR / "configs" / "genrm_trio.yaml"
    assert cli_main(["serve", "--config", str(path), "--instance", INSTANCE]) == 2
    assert not [r for r in caplog.records if "is not used" in r.getMessage()]
    assert capsys.readouterr().err.splitlines()[-1:] == [
        f"genrm-trio: config error: {path}: judge.base_url: serve needs a judge: the block's "
        "genrm_model_server ('genrm_model') has no host and port in this file (Gym fills them in "
        "when it launches the server); give --judge-url URL, set judge.base_url in the config "
        "file, or use --judge sim for simulated rewards"
    ]
    # with a judge URL the reference is indeed unused, and the line says so
    caplog.clear()
    load_settings(path, instance=INSTANCE, overrides={"judge.base_url": "http://127.0.0.1:1/v1"})
    assert [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()] == [
        "genrm_model_server is not used: the judge is reached through judge.base_url"
    ]


def test_instance_error_lists_the_instances_found() -> None:
    path = SERVER_DIR / "configs" / "genrm_trio.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(path, instance="genrm_compare")
    assert info.value.key == "--instance"
    assert info.value.message == (
        "no genrm_trio or genrm_compare instance named 'genrm_compare' "
        "(instances found: 'genrm_compare_resources_server')"
    )


# --- the launch contract: settings from Gym's environment ----------------------------------------


def test_host_port_and_block_keys_come_from_the_launched_instance() -> None:
    settings = settings_from_gym_env(env_for(gym_config(BLOCK)))
    assert (settings.host, settings.port) == ("127.0.0.1", 18_000)
    assert settings.num_rollouts_per_prompt == 16


def test_judge_is_the_model_server_that_genrm_model_server_names() -> None:
    settings = settings_from_gym_env(env_for(gym_config(BLOCK, model_port=18_001)))
    assert settings.judge.base_url == "http://127.0.0.1:18001/v1"
    assert settings.judge.api == "genrm_model"
    assert settings.judge.probe is False  # Gym model servers have no /v1/models


def test_judge_follows_a_renamed_model_server() -> None:
    block = BLOCK | {"genrm_model_server": {"type": "responses_api_models", "name": "judge_x"}}
    settings = settings_from_gym_env(env_for(gym_config(block, model_name="judge_x")))
    assert settings.judge.base_url == "http://127.0.0.1:18001/v1"


def test_a_judge_block_wins_over_genrm_model_server() -> None:
    block = BLOCK | {"judge": {"base_url": "http://127.0.0.1:8000/v1", "api": "chat_completions"}}
    settings = settings_from_gym_env(env_for(gym_config(block)))
    assert settings.judge.base_url == "http://127.0.0.1:8000/v1"
    assert settings.judge.api == "chat_completions"
    assert settings.judge.probe is True


def test_a_dangling_model_server_reference_is_one_error_naming_it() -> None:
    block = BLOCK | {"genrm_model_server": {"type": "responses_api_models", "name": "genrm_modle"}}
    err = env_error(env_for(gym_config(block)))
    assert err.key == "genrm_model_server"
    assert err.file == f"{CONFIG_ENV}[{INSTANCE}]"
    assert err.message.startswith(
        "references responses_api_models/'genrm_modle', which the Gym config does not define"
    )


def test_an_instance_without_a_genrm_trio_block_lists_the_instances() -> None:
    err = env_error(env_for(gym_config(BLOCK), instance="policy_model"))
    assert err.key == "policy_model"
    assert "has no resources_servers.genrm_trio block" in err.message
    assert f"'{INSTANCE}'" in err.message and "'genrm_model'" in err.message


@pytest.mark.parametrize("missing", [CONFIG_ENV, INSTANCE_ENV])
def test_started_outside_gym_says_so(missing: str) -> None:
    environ = env_for(gym_config(BLOCK))
    del environ[missing]
    err = env_error(environ)
    assert (err.file, err.key) == ("environment", missing)
    assert "started by NeMo Gym" in err.message


def test_an_unknown_key_in_the_block_is_a_config_error() -> None:
    err = env_error(env_for(gym_config(BLOCK | {"mystery_knob": 1})))
    assert err.key == "mystery_knob"


# --- Gym's default principle ---------------------------------------------------------------------


def test_default_principle_is_gyms_text() -> None:
    # sha256 of NeMo Gym 0.7.0's GenRMCompareConfig.default_principle, taken from its source
    digest = hashlib.sha256(DEFAULT_PRINCIPLE.encode("utf-8")).hexdigest()
    assert digest == "ece9277a6d27ce78f32c5cb758e1f3e338b63687346af9cddbb4d3d3112667cc"
    assert DEFAULT_PRINCIPLE.startswith(
        "Please act as an impartial judge and evaluate the quality of the responses provided by "
        "two AI assistants to the user prompt. Begin your evaluation by generating your own answer"
    )
    assert Settings().default_principle == DEFAULT_PRINCIPLE


# --- idle keep-alive connections do not hold the shutdown ----------------------------------------


async def _read_response(stream: trio.SocketStream) -> bytes:
    """One whole response with a Content-Length body; returns its head."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


async def test_idle_keep_alive_connections_do_not_hold_the_shutdown() -> None:
    """Quart routes and the /verify fast path each leave an idle keep-alive connection; with a
    30 s grace period the server must still stop at once (it took the whole grace before)."""
    settings = Settings.model_validate({"server": {"shutdown_grace_s": 30.0}})
    sock = bind_socket("127.0.0.1", 0)
    stop = trio.Event()
    async with durable_engine(settings, SimJudge(SimConfig())) as engine:
        app = create_app(engine, settings)
        with trio.fail_after(10):  # real clock: the failure mode is a 30 s wait
            async with trio.open_nursery() as nursery:
                port = await nursery.start(
                    partial(serve_app, app, sock, shutdown_trigger=stop.wait, grace_s=30.0)
                )
                streams: list[trio.SocketStream] = []
                requests = [
                    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
                    b"POST /verify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
                ]
                for request in requests:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    streams.append(stream)
                    await stream.send_all(request)
                    head = await _read_response(stream)
                    assert head.startswith(b"HTTP/1.1 "), head
                    assert b"connection: close" not in head.lower()
                started = trio.current_time()
                stop.set()
            stopped = trio.current_time() - started
        # every idle connection was closed by the server
        for stream in streams:
            with trio.fail_after(5):
                assert await stream.receive_some(65536) == b""
            await stream.aclose()
    assert stopped < 5.0, f"shutdown took {stopped:.3f}s"


# --- app.py as Gym runs it ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def judge(tmp_path: Path) -> Iterator[procs.Proc]:
    proc = procs.start_judge(tmp_path)
    try:
        yield proc
    finally:
        proc.close()


def _read_line_with(popen: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    """Read stdout until a line containing `needle`; everything read so far."""
    assert popen.stdout is not None
    fd = popen.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} within {timeout}s: {seen!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"app.py exited (rc={popen.wait(5)}): {seen!r}")
            seen += chunk
    return seen


def _start_app_py(gym_env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """As `gym env start` does: cd into the server directory, run `python app.py`."""
    env = {**os.environ, **gym_env, "PYTHONPATH": str(SERVER_DIR)}
    return subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=SERVER_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
async def test_app_py_serves_the_instance_gym_resolved_and_stops_within_a_second(
    tmp_path: Path, judge: procs.Proc
) -> None:
    port = _free_port()
    block = BLOCK | {"port": port, "num_rollouts_per_prompt": 4, "judge_request_timeout_s": 30}
    config = gym_config(block, model_port=judge.port)
    popen = _start_app_py(env_for(config))
    try:
        out = _read_line_with(popen, b"listening on http://127.0.0.1:%d" % port, 30)
        assert (
            f"judge: Gym model server genrm_model at http://127.0.0.1:{judge.port}/v1".encode()
            in out
        )
        assert b"not probed" in out  # logs go to stdout
        base = f"http://127.0.0.1:{port}"
        async with procs.client() as http:
            replies, _ = await procs.run_group(http, base, procs.bodies("g1", procs.answers("")))
            for reply in replies:
                procs.assert_scored(reply)
            stats = await procs.judge_stats(http, judge)
            assert stats["calls"] == 4  # circular over 4: the judge Gym's config named scored it
            # an idle keep-alive connection stays open across the signal
            assert (await http.get(f"{base}/health")).status_code == 200
            started = time.monotonic()
            popen.send_signal(signal.SIGINT)
            code = await trio.to_thread.run_sync(partial(popen.wait, 10))
            stopped = time.monotonic() - started
        assert code == 0
        # Gym 0.7.0 kills a server still running one second after its SIGINT
        assert stopped < 1.0, f"exit took {stopped:.3f}s"
        assert popen.stderr is not None
        assert popen.stderr.read() == b""
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(10)
        for pipe in (popen.stdout, popen.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.slow
def test_app_py_outside_gym_is_one_config_error_line() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, INSTANCE_ENV)}
    done = subprocess.run(
        [sys.executable, "app.py"], cwd=SERVER_DIR, env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"genrm-trio: config error: environment: {CONFIG_ENV}: unset")
