"""The `genrm-trio` command, `serve()` and the demo (docs/configuration.md "Command line", D28).

Real sockets on 127.0.0.1 and the real clock (no autojump: the I/O is real), every wait bounded.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import procs
import pytest
import trio
from rich.console import Console

from genrm_trio.app.arguments import METAVARS
from genrm_trio.app.cli import COMMANDS, _serve_settings, build_parser, main
from genrm_trio.app.demo import run_demo
from genrm_trio.app.serve import bind_socket, serve
from genrm_trio.config import Settings, settings_from_mapping
from genrm_trio.judge.probe import ProbeReport, probe_judge
from genrm_trio.testing import SimConfig, serve_sim_judge

SHUTTING_DOWN = "GenRM server is shutting down"


pytestmark = pytest.mark.usefixtures("restore_logging")  # main() configures logging


def _one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _row(rollout: int, group_id: str, answer: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Why is ice slippery?"}]},
        "response": {
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": answer}],
                }
            ]
        },
        "_ng_group_id": group_id,
        "_ng_group_attempt": 0,
        "_ng_rollout_index": rollout,
    }


# --- config errors: exit 2, one line; usage mistakes: exit 2, argparse's usage and error --------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["serve"],
            "genrm-trio: config error: <flags>: judge.base_url: serve needs a judge: give "
            "--judge-url URL",
        ),
        (
            ["serve", "--judge-url", "ftp://x/v1"],
            "genrm-trio: config error: <flags>: judge.base_url:",
        ),
        (
            ["serve", "--judge-url", "http://127.0.0.1:8000/v1"],
            "genrm-trio: config error: <flags>: --judge-api: --judge-url needs --judge-api (or "
            "judge.api in the config file): chat_completions or openai_responses for vLLM or any "
            "OpenAI-compatible server, genrm_model behind Gym's genrm_model server",
        ),
    ],
)
def test_config_errors_are_one_line_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert _one_line(captured.err).startswith(expected)
    assert captured.out == ""


def usage_error(err: str, command: str) -> str:
    """The error line of a usage error, after checking argparse's shape: the command's usage
    line (wrapped or not) first, the error last, no traceback, no 'config error'."""
    prog = f"genrm-trio {command}".strip()
    assert "Traceback" not in err and "config error" not in err, err
    assert err.startswith(f"usage: {prog} [-h]"), err
    last = err.splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), err
    return last


@pytest.mark.parametrize(
    ("argv", "command", "expected"),
    [
        (
            ["sevre"],
            "",
            "genrm-trio: error: argument COMMAND: invalid choice: 'sevre' (choose from ",
        ),
        (["sevre"], "", "; did you mean 'serve'?"),
        (["prometheus-rule"], "", "; did you mean 'prometheus-rules'?"),
        (["serve", "--bogus"], "serve", "genrm-trio serve: error: unrecognized arguments: --bogus"),
        (
            ["serve", "--judge-ulr", "http://a:1/v1"],
            "serve",
            "genrm-trio serve: error: unrecognized arguments: --judge-ulr http://a:1/v1 (did you "
            "mean --judge-url?)",
        ),
        (
            ["checkpoint", "export", "--timout=3"],
            "checkpoint export",
            "genrm-trio checkpoint export: error: unrecognized arguments: --timout=3 (did you "
            "mean --timeout?)",
        ),
        (
            ["serve", "--judge", "sim", "--judge-url", "http://127.0.0.1:9/v1"],
            "serve",
            "genrm-trio serve: error: argument --judge-url: not allowed with argument --judge",
        ),
        (["serve", "--judge", "judge"], "serve", "argument --judge: invalid choice: 'judge'"),
        (["serve", "--port", "http"], "serve", "argument --port: not a port number: 'http'"),
        (["serve", "--port", "70000"], "serve", "argument --port: must be in 0..65535"),
        (["serve", "--port"], "serve", "argument --port: expected one argument"),
        (
            ["serve", "--judge-url", "http://127.0.0.1:8000/v1", "--judge-api", "chat_completion"],
            "serve",
            "argument --judge-api: invalid choice: 'chat_completion' (choose from ",
        ),
        (
            ["serve", "--judge-url", "http://127.0.0.1:8000/v1", "--judge-api", "chat_completion"],
            "serve",
            "; did you mean 'chat_completions'?",
        ),
        (["sim-judge", "--fault", "meteor"], "sim-judge", "argument --fault: unknown fault"),
        (
            ["sim-judge", "--judgment-noise", "1"],
            "sim-judge",
            "genrm-trio sim-judge: error: --judgment-noise needs --judgment",
        ),
        (["bench", "--groups", "0"], "bench", "argument --groups: must be >= 1, got 0"),
        (["top", "--interval", "0"], "top", "argument --interval: must be within [0.1, 3600]"),
    ],
)
def test_usage_mistakes_get_the_usage_line_and_what_was_meant(
    argv: list[str], command: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert expected in usage_error(captured.err, command)


def every_command_parser() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (`checkpoint export` for a subcommand's)."""
    found: dict[str, argparse.ArgumentParser] = {}
    pending: list[tuple[str, argparse.ArgumentParser]] = [("", build_parser())]
    while pending:
        name, parser = pending.pop()
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    pending.append((f"{name} {sub}".strip(), subparser))
    return found


def test_every_command_is_listed_and_every_flag_value_named_by_its_kind() -> None:
    parsers = every_command_parser()
    assert {name.partition(" ")[0] for name in parsers if name} == {
        command.strip() for command in COMMANDS.replace(" or ", ", ").split(",")
    }
    metavars: dict[str, set[str]] = {}
    for name, parser in parsers.items():
        for action in parser._actions:
            takes_value = action.nargs != 0 and action.option_strings
            if not takes_value or action.choices is not None:
                continue
            assert action.metavar in METAVARS, (name, action.option_strings, action.metavar)
            metavars.setdefault(action.option_strings[-1], set()).add(str(action.metavar))
    # the same flag in several commands is the same kind of value everywhere
    shared = {flag: kinds for flag, kinds in metavars.items() if len(kinds) > 1}
    assert shared == {"--interval": {"SECONDS", "DURATION"}}  # top's seconds, Prometheus's 15s
    assert metavars["--api-key-env"] == {"VAR"} and metavars["--url"] == {"URL"}
    assert metavars["--host"] == {"HOST"} and metavars["--port"] == {"PORT"}


def test_every_default_is_shown_one_way() -> None:
    """`(default: X)`, in every command's help, for every flag with a default; serve's flags,
    which only override the config file, name the config key's default."""
    from genrm_trio.app.cli import _DefaultsFormatter

    for name, parser in every_command_parser().items():
        assert parser.formatter_class is _DefaultsFormatter, name
        text = " ".join(parser.format_help().split())
        assert not re.search(r"\(default(?!: )", text), (name, text)
        for action in parser._actions:
            default = action.default
            if not action.option_strings or default in (None, False, [], argparse.SUPPRESS):
                continue
            shown = parser.formatter_class(prog=name)._get_help_string(action) or ""
            assert "(default: " in shown, (name, action.option_strings)
    serve = " ".join(every_command_parser()["serve"].format_help().split())
    defaults = Settings()
    for flag, default in (
        ("--host HOST", defaults.host),
        ("--port PORT", defaults.port),
        ("--num-rollouts-per-prompt N", defaults.num_rollouts_per_prompt),
    ):
        assert re.search(rf"{flag} [^(]*\(default: {re.escape(str(default))}[;)]", serve), flag


def test_the_client_commands_find_the_server_at_one_default_url() -> None:
    parser = build_parser()
    urls = {
        " ".join(argv): parser.parse_args(argv).url
        for argv in (
            ["top"],
            ["bench"],
            ["checkpoint", "export"],
            ["checkpoint", "restore", "in.json"],
        )
    }
    port = Settings().port
    assert set(urls.values()) == {f"http://127.0.0.1:{port}"}, urls


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["grafana-dashboard"], 1),
        (["prometheus-rules"], 1),
        (["prometheus-config", "--target", "a:1"], 1),
        # argparse ignores a failed write of its help and version
        (["serve", "--help"], 0),
        (["--version"], 0),
    ],
)
def test_no_traceback_when_stdout_closes_early(argv: list[str], code: int) -> None:
    """`genrm-trio grafana-dashboard | head -1`: the reader is gone before the output is."""
    read, write = os.pipe()
    os.close(read)  # nobody will read: every write fails (EPIPE), as it does for `| true`
    try:
        done = subprocess.run(
            [*procs.command(), *argv], stdout=write, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write)
    assert done.stderr == b""  # no traceback, no "Exception ignored"
    assert done.returncode == code


def test_judge_url_once_is_a_url_and_repeated_is_a_fleet() -> None:
    api = ["--judge-api", "chat_completions"]
    argv = ["serve", "--judge-url", "http://a:1/v1", *api]
    one = _serve_settings(build_parser().parse_args(argv))
    assert one.judge.base_url == "http://a:1/v1"
    assert one.judge.api == "chat_completions"
    assert one.judge.base_urls == ("http://a:1/v1",)
    argv = ["serve", "--judge-url", "http://a:1/v1", "--judge-url", "http://b:2/v1", *api]
    two = _serve_settings(build_parser().parse_args(argv))
    assert two.judge.base_url == ["http://a:1/v1", "http://b:2/v1"]
    assert two.judge.base_urls == ("http://a:1/v1", "http://b:2/v1")


def test_a_judge_base_url_in_a_file_needs_its_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("judge:\n  base_url: http://127.0.0.1:8000/v1\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"genrm-trio: config error: {config}: judge.api: required with judge.base_url: "
        "chat_completions or openai_responses for vLLM or any OpenAI-compatible server, "
        "genrm_model behind Gym's genrm_model server"
    )


def test_judge_url_takes_the_api_of_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("judge:\n  api: openai_responses\n")
    argv = ["serve", "--config", str(config), "--judge-url", "http://a:1/v1"]
    settings = _serve_settings(build_parser().parse_args(argv))
    assert (settings.judge.base_url, settings.judge.api) == ("http://a:1/v1", "openai_responses")


def test_no_command_is_a_usage_error_with_the_usage_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert usage_error(captured.err, "") == (
        "genrm-trio: error: a command is required: serve, demo, sim-judge, bench, calibrate, "
        "checkpoint, gym-root, grafana-dashboard, prometheus-rules, prometheus-config or top "
        "(genrm-trio --help describes them)"
    )


def test_sim_judge_sticky_faults_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import genrm_trio.testing.flags as flags

    seen: dict[str, Any] = {}

    def capture(**kwargs: Any) -> SimConfig:
        seen.update(kwargs)
        raise ValueError("stop here")  # reported as a usage error: no server starts

    monkeypatch.setattr(flags, "sim_config_from_args", capture)
    assert main(["sim-judge", "--fault-rate", "0.01", "--sticky-faults"]) == 2
    assert seen["sticky_faults"] is True and seen["fault_rate"] == 0.01
    seen.clear()
    assert main(["sim-judge"]) == 2
    assert seen["sticky_faults"] is False


def test_tuned_gc_sets_and_restores_the_collector() -> None:
    import gc

    from genrm_trio.app.serve import GC_THRESHOLDS, tuned_gc

    before = gc.get_threshold()
    with tuned_gc():
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_listen_backlog_holds_a_burst_of_connections() -> None:
    from genrm_trio.app.serve import LISTEN_BACKLOG, hypercorn_config

    sock = bind_socket("127.0.0.1", 0)
    clients: list[socket.socket] = []
    try:
        config = hypercorn_config(sock, grace_s=1.0)
        assert config.backlog == LISTEN_BACKLOG
        sock.listen(config.backlog)  # as hypercorn does
        # Nobody accepts: with hypercorn's default of 100 the 102nd handshake would be dropped.
        for _ in range(300):
            clients.append(socket.create_connection(sock.getsockname()[:2], timeout=5))
    finally:
        for client in clients:
            client.close()
        sock.close()


def test_config_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.yaml"
    assert main(["serve", "--judge", "sim", "--config", str(missing)]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        f"genrm-trio: config error: {missing}: file: cannot read"
    )

    bad = tmp_path / "bad.yaml"
    bad.write_text("num_rollouts_per_prompt: 4\nmystery_knob: 1\n")
    assert main(["serve", "--judge", "sim", "--config", str(bad)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"genrm-trio: config error: {bad}: mystery_knob: unknown key"
    )

    # A file without a judge, and no flag giving one: refused, naming the file.
    plain = tmp_path / "plain.yaml"
    plain.write_text("num_rollouts_per_prompt: 4\n")
    assert main(["serve", "--config", str(plain)]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        f"genrm-trio: config error: {plain}: judge.base_url: serve needs a judge"
    )


def test_state_directory_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "no-such-dir" / "state.sqlite"
    assert main(["serve", "--judge", "sim", "--state", str(state)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"genrm-trio: config error: <flags>: --state: directory '{state.parent}' does not exist"
    )


def test_missing_secret_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GENRM_TRIO_TEST_UNSET_TOKEN", raising=False)
    config = tmp_path / "auth.yaml"
    config.write_text("server:\n  api_key_env: GENRM_TRIO_TEST_UNSET_TOKEN\n")
    assert main(["serve", "--judge", "sim", "--port", "0", "--config", str(config)]) == 2
    assert _one_line(capsys.readouterr().err) == (
        "genrm-trio: config error: environment: server.api_key_env: environment variable "
        "GENRM_TRIO_TEST_UNSET_TOKEN is unset or empty"
    )


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--config", "--instance", "--host", "--port", "--judge-url", "--judge", "--state"):
        assert flag in out


# --- port in use: exit 1, one line, no leaked socket ----------------------------------------------


def test_busy_port_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--judge", "sim", "--port", str(port)]) == 1
        captured = capsys.readouterr()
        assert _one_line(captured.err) == (
            f"genrm-trio: cannot listen on 127.0.0.1:{port}: address already in use"
        )
        assert captured.out == ""
        assert main(["sim-judge", "--port", str(port)]) == 1
        assert _one_line(capsys.readouterr().err) == (
            f"genrm-trio: cannot listen on 127.0.0.1:{port}: address already in use"
        )
    # filterwarnings=error turns an unclosed socket's ResourceWarning into a failure at GC.


def test_a_state_file_held_by_another_server_is_one_line_exit_1(tmp_path: Path) -> None:
    """Two servers on one --state file: the second stops with the store's line, no traceback."""
    state = tmp_path / "state.sqlite"
    first = procs.start_server(tmp_path, {}, extra=["--state", str(state)], name="first")
    try:
        second = subprocess.run(
            [*procs.command(), "serve", "--judge", "sim", "--port", "0", "--state", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert first.popen.poll() is None  # the first server is untouched
    finally:
        first.stop()
        first.close()
    assert second.returncode == 1
    assert second.stdout == ""  # never listened
    assert "Traceback" not in second.stderr
    assert " ERROR " not in second.stderr
    # before anything else: no start-up report, no judge, and the holder named
    [line] = second.stderr.splitlines()
    assert line.startswith(
        f"genrm-trio: state file {state}: in use by another genrm-trio process (pid {first.pid}: "
    )
    assert " serve --config " in line  # its command line, cut at 160 characters
    assert line.endswith(")")


# --- serve in-process: listening line, /health, graceful shutdown ---------------------------------


async def test_serve_sim_health_then_sigterm_fails_waiting_group_with_503(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = settings_from_mapping(
        {
            "port": 0,
            "num_rollouts_per_prompt": 2,
            "cohort_collection_timeout_s": 60.0,
            "server": {"shutdown_grace_s": 2.0},
        }
    )
    replies: list[httpx.Response] = []
    with trio.fail_after(20):
        async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
            async with trio.open_nursery() as nursery:
                port = await nursery.start(partial(serve, settings, sim=True))
                assert capsys.readouterr().out == f"listening on http://127.0.0.1:{port}\n"
                base = f"http://127.0.0.1:{port}"
                health = await client.get(f"{base}/health")
                assert health.status_code == 200
                assert health.json() == {"status": "ok"}

                async def lonely_member() -> None:
                    replies.append(
                        await client.post(f"{base}/verify", json=_row(0, "g-shutdown", "ice"))
                    )

                nursery.start_soon(lonely_member)
                while not (await client.get(f"{base}/cohorts")).json():  # noqa: ASYNC110
                    await trio.sleep(0.01)
                os.kill(os.getpid(), signal.SIGTERM)
            # serve() returned: the group's waiter got its 503 first.
            assert len(replies) == 1
            assert replies[0].status_code == 503
            assert replies[0].json() == {"detail": SHUTTING_DOWN, "reason": "shutting_down"}
            with pytest.raises(httpx.ConnectError):
                await client.get(f"{base}/health")


async def test_probe_warns_once_and_never_fails(caplog: pytest.LogCaptureFixture) -> None:
    closed = bind_socket("127.0.0.1", 0)
    dead_port = closed.getsockname()[1]
    closed.close()
    settings = settings_from_mapping({"judge": {"base_url": f"http://127.0.0.1:{dead_port}/v1"}})
    with trio.fail_after(10):
        report = await probe_judge(settings, None)
    # refused: no answer, and down from the start (serve then opens the engine in an outage)
    assert report == ProbeReport(answered=False, unreachable=(f"http://127.0.0.1:{dead_port}/v1",))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(
        f"judge probe GET http://127.0.0.1:{dead_port}/v1/models failed: ConnectError"
    )
    assert warnings[0].endswith("; serving anyway")

    caplog.clear()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            sim_port = await nursery.start(partial(serve_sim_judge, SimConfig()))
            ok = settings_from_mapping({"judge": {"base_url": f"http://127.0.0.1:{sim_port}/v1"}})
            assert await probe_judge(ok, None) == ProbeReport(answered=True)
            nursery.cancel_scope.cancel()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_probe_warns_when_the_judge_does_not_serve_the_configured_model(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_sim_judge, SimConfig()))
            url = f"http://127.0.0.1:{port}/v1"
            wrong = settings_from_mapping({"judge": {"base_url": url, "model": "qwen3-genrm"}})
            assert (await probe_judge(wrong, None)).answered is True  # a warning, never a failure
            assert warnings() == [
                "judge probe: judge.model 'qwen3-genrm' is not among the models the judge serves "
                "('genrm-sim'); judge calls naming it will likely fail"
            ]
            caplog.clear()
            from_params = settings_from_mapping(
                {
                    "judge": {"base_url": url},
                    "genrm_responses_create_params": {"input": [], "model": "other"},
                }
            )
            assert (await probe_judge(from_params, None)).answered is True
            assert len(warnings()) == 1
            assert warnings()[0].startswith(
                "judge probe: genrm_responses_create_params.model 'other' is not among"
            )
            caplog.clear()
            for fine in ({"base_url": url, "model": "genrm-sim"}, {"base_url": url}):
                report = await probe_judge(settings_from_mapping({"judge": fine}), None)
                assert report.answered is True
            assert warnings() == []
            nursery.cancel_scope.cancel()


def test_the_model_warning_names_a_bounded_number_of_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from genrm_trio.judge.probe import PROBE_IDS_SHOWN, _check_model

    settings = settings_from_mapping({"judge": {"base_url": "http://j/v1", "model": "m"}})
    served = [f"model-{i}-" + "x" * 200 for i in range(PROBE_IDS_SHOWN + 3)]
    body = {"object": "list", "data": [{"id": name} for name in served]}
    _check_model(settings, json.dumps(body).encode())
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.count("'model-") == PROBE_IDS_SHOWN
    assert "… (3 more)" in warning
    assert len(warning) < 1200
    caplog.clear()
    for reply in (b"not json", json.dumps({"data": 1}).encode()):
        _check_model(settings, reply)  # not a model list: nothing to compare, no warning
    assert not caplog.records


# --- real processes: sim-judge + serve, a 4-rollout group end to end, SIGTERM → 0 ----------------


def test_processes_score_a_group_end_to_end_then_stop_with_0(tmp_path: Path) -> None:
    config = {
        "num_rollouts_per_prompt": 4,
        "cohort_collection_timeout_s": 20,
        "cohort_evaluation_timeout_s": 20,
        "judge_request_timeout_s": 5,
        "genrm_parse_retry_sleep_s": 0.01,
    }
    judge = procs.start_judge(tmp_path, timeout=20.0)
    server: procs.Proc | None = None
    try:
        assert judge.url.startswith("http://127.0.0.1:")
        server = procs.start_server(tmp_path, config, judge_url=judge.url + "/v1", timeout=20.0)
        assert server.url.startswith("http://127.0.0.1:")
        base = server.url

        async def score_group() -> list[httpx.Response]:
            replies: list[httpx.Response] = []
            async with httpx.AsyncClient(trust_env=False, timeout=20.0) as client:
                assert (await client.get(f"{base}/health")).status_code == 200

                async def member(i: int) -> None:
                    answer = f"answer {i}: ice is slippery because of a thin liquid-like layer"
                    body = _row(i, "g-e2e", answer)
                    replies.append(await client.post(f"{base}/verify", json=body))

                with trio.fail_after(20):
                    async with trio.open_nursery() as nursery:
                        for i in range(4):
                            nursery.start_soon(member, i)
            return replies

        replies = trio.run(score_group)
        assert sorted(r.status_code for r in replies) == [200] * 4
        rows = sorted((r.json() for r in replies), key=lambda row: row["_ng_rollout_index"])
        assert [row["_ng_rollout_index"] for row in rows] == [0, 1, 2, 3]
        for row in rows:
            assert row["mask_sample"] is False
            assert row["failure_kind"] is None
            assert math.isfinite(row["reward"])
        assert server.stop(10.0) == 0
        assert judge.stop(10.0) == 0
    finally:
        for proc in (server, judge):
            if proc is not None:
                proc.close()
    serve_log = (tmp_path / "serve.err").read_text()
    assert "Traceback" not in serve_log
    assert "failed; serving anyway" not in serve_log  # the simulated judge answers /v1/models
    assert "masked rows carry a placeholder reward 0.0" in serve_log
    assert "Traceback" not in (tmp_path / "judge.err").read_text()


# --- the demo ------------------------------------------------------------------------------------


def test_demo_runs_and_every_group_comes_out_as_intended() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False, color_system=None)
    assert run_demo(console=console) == 0
    text = out.getvalue()
    assert "Rewards per rollout and group" in text
    assert text.count("masked") >= 3
    assert "env.should_mask_flagged_samples: true" in text
    assert "demo OK" in text
