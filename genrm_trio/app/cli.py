"""The `genrm-trio` command (docs/configuration.md, "Command line"): serve, sim-judge, demo,
bench, calibrate, checkpoint, gym-root, and the watching commands of app/watch.py
(grafana-dashboard, prometheus-rules, prometheus-config, top).

Exit codes: 0 after a graceful stop, 2 for a usage or config error, 1 for any other start-up
failure. A usage mistake (an unknown command or flag, a flag without its value, a value argparse
rejects, flags that do not go together) prints the command's usage line, then
`genrm-trio COMMAND: error: …` with `did you mean …?` when a command, flag or choice is close. A
config error is one stderr line `genrm-trio: config error: {file}: {key}: {message}`, no
traceback. Other start-up failures are one line too: a busy port prints `genrm-trio: cannot
listen on {host}:{port}: address already in use`, a state file held by another server
`genrm-trio: state file {path}: in use by another genrm-trio process (pid {pid}: {command})`.
Output cut short by its reader (`genrm-trio grafana-dashboard | head`) ends the command quietly
with exit code 1.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar, final, get_args

import trio

from genrm_trio import __version__
from genrm_trio.app.arguments import (
    PROG,
    finite_number,
    non_negative,
    port_number,
    positive_int,
    probability,
    say,
)
from genrm_trio.app.checkpoint_cli import add_checkpoint_arguments
from genrm_trio.app.logs import configure_logging
from genrm_trio.app.watch import add_watch_commands
from genrm_trio.config import (
    JUDGE_API_ALIASES,
    JUDGE_API_CHOICES,
    ConfigError,
    JudgeApiName,
    Settings,
    did_you_mean,
    load_settings,
)
from genrm_trio.domain.exceptions import describe, first_leaf

COMMANDS: Final = (
    "serve, demo, sim-judge, bench, calibrate, checkpoint, gym-root, grafana-dashboard, "
    "prometheus-rules, prometheus-config or top"
)
FLAGS_FILE: Final = "<flags>"

log = logging.getLogger("genrm_trio.cli")

_E = TypeVar("_E", bound=BaseException)


# --- usage errors ------------------------------------------------------------------------------


class UsageError(Exception):
    """A usage mistake a command finds after parsing (flags that do not go together): reported
    as argparse reports its own, with the command's usage line."""


@final
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows every default as `(default: X)` and whose usage errors
    say which command, flag or choice was probably meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            assert action.choices is not None  # only choices are checked here
            close = did_you_mean(str(value), [str(choice) for choice in action.choices])
            if not close:
                raise
            raise argparse.ArgumentError(
                action, f"{exc.message}; did you mean {close[0]!r}?"
            ) from None

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """Flags no command of this parser takes: the error, with the closest flag it has."""
        known = [flag for action in self._actions for flag in action.option_strings]
        hints = [
            close[0]
            for extra in extras
            if extra.startswith("-")
            for close in [did_you_mean(extra.partition("=")[0], known)]
            if close
        ]
        hint = f" (did you mean {' or '.join(hints)}?)" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> _Parser:
    """The parser of the (sub)command `args` were parsed for: its usage line is the one a usage
    error shows."""
    while True:
        choices = next(
            (
                action
                for action in parser._actions
                if isinstance(action, argparse._SubParsersAction)
            ),
            None,
        )
        name = None if choices is None else getattr(args, choices.dest, None)
        if choices is None or name not in choices.choices:
            assert isinstance(parser, _Parser)
            return parser
        parser = choices.choices[name]


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help text with `(default: X)` after every flag that has a real default.

    Like argparse.ArgumentDefaultsHelpFormatter, minus the noise: no `(default: None)`,
    `(default: False)` or `(default: [])`, and nothing when the help already names it (a flag
    whose default is a config key's writes `(default: X; …)` itself).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        noise = default is None or default is False or default == [] or default is argparse.SUPPRESS
        if noise or "(default" in text or "%(default)" in text or not action.option_strings:
            return action.help
        return f"{text} (default: %(default)s)"


def _config_error(exc: ConfigError, file: str = FLAGS_FILE) -> int:
    say(f"config error: {exc.file or file}: {exc.key}: {exc.message}")
    return 2


def _stdout_closed() -> int:
    """Whoever read stdout went away (`genrm-trio grafana-dashboard | head`): no traceback, and
    stdout goes to /dev/null so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


# --- serve --------------------------------------------------------------------------------------


def _serve_settings(args: argparse.Namespace) -> Settings:
    """Settings from `--config` plus the flags (flags win), checked for what serve needs."""
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.judge_url is not None:  # once: a URL as before; repeated: the replicas of a fleet
        urls: list[str] = args.judge_url
        overrides["judge.base_url"] = urls[0] if len(urls) == 1 else urls
    if args.judge_api is not None:
        overrides["judge.api"] = args.judge_api
    if args.state is not None:
        overrides["state_path"] = args.state
    if args.num_rollouts_per_prompt is not None:
        overrides["num_rollouts_per_prompt"] = args.num_rollouts_per_prompt
    settings = load_settings(args.config, instance=args.instance, overrides=overrides)
    file = str(args.config) if args.config is not None else FLAGS_FILE
    sim = args.judge == "sim"
    if not sim and settings.judge.base_url is None:
        reference = settings.genrm_model_server or {}
        unresolved = (
            f"the block's genrm_model_server ({reference.get('name')!r}) has no host and port "
            "in this file (Gym fills them in when it launches the server); "
            if reference
            else ""
        )
        raise ConfigError(
            file,
            "judge.base_url",
            f"serve needs a judge: {unresolved}give --judge-url URL, set judge.base_url in the "
            "config file, or use --judge sim for simulated rewards",
        )
    if not sim and not settings.judge.api_chosen:
        # said here in the words of the command line; the judge's constructor
        # (make_judge) refuses the same settings for library users
        if args.judge_url is not None:
            raise ConfigError(
                FLAGS_FILE,
                "--judge-api",
                "--judge-url needs --judge-api (or judge.api in the config file): "
                f"{JUDGE_API_CHOICES}",
            )
        raise ConfigError(file, "judge.api", f"required with judge.base_url: {JUDGE_API_CHOICES}")
    if settings.state_path is not None:
        parent = Path(settings.state_path).expanduser().absolute().parent
        if not parent.is_dir():
            key = "--state" if args.state is not None else "state_path"
            raise ConfigError(
                FLAGS_FILE if args.state is not None else file,
                key,
                f"directory {str(parent)!r} does not exist",
            )
    return settings


def _run_serve(args: argparse.Namespace) -> int:
    return run_service(partial(_serve_settings, args), sim=args.judge == "sim")


def run_service(load: Callable[[], Settings], *, sim: bool = False) -> int:
    """Load the settings and serve until SIGINT/SIGTERM; the exit code. What `genrm-trio serve`
    and NeMo Gym's app.py run (a config error is one stderr line and exit 2)."""
    from genrm_trio.app.serve import ListenError, serve, tuned_gc
    from genrm_trio.store.sqlite import StoreError

    try:
        settings = load()
    except ConfigError as exc:
        return _config_error(exc)

    # What serving runs, imported before the collector is tuned (serve() imports it lazily).
    import genrm_trio.engine.engine
    import genrm_trio.http.app
    import genrm_trio.judge.client
    import genrm_trio.judge.probe  # noqa: F401

    code = 0
    try:
        with tuned_gc():
            trio.run(partial(serve, settings, sim=sim))
    except* ConfigError as group:
        code = _config_error(_first(group, ConfigError))
    except* ListenError as group:
        say(str(_first(group, ListenError)))
        code = 1
    except* StoreError as group:
        # Raised inside the serve nurseries (the store opens after the judge probe), so it
        # arrives wrapped; its message already names the file and the problem.
        say(str(_first(group, StoreError)))
        code = 1
    except* KeyboardInterrupt:
        code = 0  # a second Ctrl-C before the signal receiver was installed
    except* Exception as group:
        log.error("stopped by an unexpected error", exc_info=group)
        say(f"error: {describe(group)}")  # every error, on one line
        code = 1
    return code


def _first(group: BaseExceptionGroup[Any], kind: type[_E]) -> _E:
    """The first ``kind`` leaf of a group ``except*`` matched on ``kind`` (so there is one)."""
    leaf = first_leaf(group, kind)
    if leaf is None:
        raise AssertionError(f"no {kind.__name__} in {group!r}") from group
    return leaf


def _add_serve(sub: Any) -> None:
    parser = sub.add_parser(
        "serve",
        help="run the GenRM compare service",
        description=(
            "Run the service. Prints 'listening on http://HOST:PORT' once ready; SIGINT/SIGTERM "
            "stop it gracefully (exit 0)."
        ),
    )
    defaults = Settings()
    parser.add_argument("--config", metavar="FILE", help="YAML config: flat keys or a Gym file")
    parser.add_argument("--instance", metavar="NAME", help="Gym config: which genrm_compare block")
    # No argparse defaults here: a flag given overrides the config file, one not given does not.
    parser.add_argument(
        "--host", metavar="HOST", help=f"numeric bind address (default: {defaults.host})"
    )
    parser.add_argument(
        "--port",
        metavar="PORT",
        type=port_number,
        help=f"bind port (default: {defaults.port}; 0 picks a free port)",
    )
    judge = parser.add_mutually_exclusive_group()
    judge.add_argument(
        "--judge-url",
        metavar="URL",
        action="append",
        help="judge base URL ending in /v1; repeat it for a fleet of judge replicas",
    )
    judge.add_argument(
        "--judge",
        choices=["sim"],
        help="'sim': the in-process simulated judge (rewards are simulated)",
    )
    parser.add_argument(
        "--judge-api",
        choices=[*get_args(JudgeApiName), *JUDGE_API_ALIASES],
        help="how to ask the judge (judge.api): chat_completions or openai_responses for vLLM "
        "or any OpenAI-compatible server, genrm_model behind Gym's genrm_model server; "
        "required with --judge-url unless the config file sets judge.api",
    )
    parser.add_argument(
        "--state",
        metavar="FILE",
        help="SQLite state file (created if absent; its directory must exist) (default: none, "
        "state in memory only)",
    )
    parser.add_argument(
        "--num-rollouts-per-prompt",
        metavar="N",
        type=positive_int,
        help="rollouts per group, as the trainer sends them (default: "
        f"{defaults.num_rollouts_per_prompt}; no grouping, no judging)",
    )
    parser.set_defaults(handler=_run_serve)


# --- sim-judge ----------------------------------------------------------------------------------


async def _sim_judge_main(config: Any, host: str, port: int) -> None:
    from genrm_trio.testing import serve_sim_judge

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(partial(serve_sim_judge, config, host=host, port=port))
            shown = f"[{host}]" if ":" in host else host
            print(f"listening on http://{shown}:{bound}", flush=True)
            async for signum in signals:
                log.info("received %s: stopping", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()


def _run_sim_judge(args: argparse.Namespace) -> int:
    from genrm_trio.app.serve import ListenError, bind_socket, tuned_gc
    from genrm_trio.testing.flags import judgment_from_args, sim_config_from_args

    api_key: str | None = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, "")
        if not api_key:
            return _config_error(
                ConfigError(
                    FLAGS_FILE,
                    "--api-key-env",
                    f"environment variable {args.api_key_env} is unset or empty",
                )
            )
    try:
        judgment = judgment_from_args(
            args.judgment,
            noise=args.judgment_noise,
            bias=args.judgment_bias,
            beta=args.judgment_beta,
        )
        config = sim_config_from_args(
            latency_ms=args.latency_ms,
            jitter_ms=args.jitter_ms,
            seed=args.seed,
            fault_rate=args.fault_rate,
            fault_kind=args.fault_kind,
            faults=args.fault,
            api_key=api_key,
            sticky_faults=args.sticky_faults,
            length_model=args.length_model,
            capacity=args.capacity,
            judgment=judgment,
            rate_limits=_sim_rate_limits(args),
            context_tokens=args.context_tokens,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    served: Any = config
    if args.policy:
        from genrm_trio.testing import PolicyStandIn, sim_asgi_app

        served = sim_asgi_app(config, policy=PolicyStandIn(seed=args.seed))
    try:
        # Fail fast with the one-line message; hypercorn would nest the error and leak the socket.
        bind_socket(args.host, args.port).close()
    except ListenError as exc:
        say(str(exc))
        return 1
    code = 0
    try:
        with tuned_gc():
            trio.run(_sim_judge_main, served, args.host, args.port)
    except* OSError as group:
        say(f"cannot listen on {args.host}:{args.port}: {_first(group, OSError).strerror}")
        code = 1
    except* KeyboardInterrupt:
        code = 0
    return code


def _sim_rate_limits(args: argparse.Namespace) -> Any:
    """The sim judge's rate limits of `--rpm` / `--tpm` (None without either)."""
    from genrm_trio.testing.ratelimit import SimRateLimits

    if args.rpm is None and args.tpm is None:
        return None
    return SimRateLimits(
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
        headers=args.rate_limit_headers,
        retry_after=args.retry_after,
    )


def _fault_spec(value: str) -> str:
    """A `--fault` value, checked when parsed (a usage error if bad), kept as written."""
    from genrm_trio.testing.flags import parse_fault_rule

    try:
        parse_fault_rule(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _add_sim_judge(sub: Any) -> None:
    parser = sub.add_parser(
        "sim-judge",
        help="serve the simulated GenRM judge (every judge API under /v1)",
        description=(
            "Serve the simulated judge: deterministic verdicts, latency and scripted faults. "
            "Point serve at it with --judge-url http://HOST:PORT/v1 --judge-api API (any)."
        ),
    )
    parser.add_argument("--host", metavar="HOST", default="127.0.0.1", help="numeric bind address")
    parser.add_argument(
        "--port",
        metavar="PORT",
        type=port_number,
        default=8000,
        help="bind port; 0 picks a free port",
    )
    _add_sim_latency(parser)
    _add_sim_faults(parser)
    _add_sim_budgets(parser)
    _add_sim_judgment(parser)
    _add_sim_rate_limits(parser)
    parser.add_argument(
        "--api-key-env", metavar="VAR", help="require this variable's value as bearer token"
    )
    parser.add_argument(
        "--policy",
        action="store_true",
        help=(
            "also stand in for the policy model: an ordinary chat or Responses request (not "
            "judge-shaped) gets a deterministic answer, a different one each time a prompt "
            "comes again, at once and without faults (a test tool: no GPU needed for a Gym trial)"
        ),
    )
    parser.set_defaults(handler=_run_sim_judge)


def _add_sim_latency(parser: Any) -> None:
    """Each call's latency, and the seed of its jitter and of the random faults."""
    parser.add_argument(
        "--latency-ms", metavar="MS", type=non_negative, default=0.0, help="per-call latency"
    )
    parser.add_argument(
        "--jitter-ms",
        metavar="MS",
        type=non_negative,
        default=0.0,
        help="uniform extra latency, 0 to this",
    )
    parser.add_argument(
        "--seed", metavar="N", type=int, default=0, help="seed for jitter and random faults"
    )


def _add_sim_faults(parser: Any) -> None:
    """Random faults (a share of calls or of pairs) and scripted ones (--fault)."""
    from genrm_trio.testing.faults import FAULT_KINDS

    parser.add_argument(
        "--fault-rate",
        metavar="FRACTION",
        type=probability,
        default=0.0,
        help="share of calls that get a random fault (with --sticky-faults: of pairs)",
    )
    parser.add_argument(
        "--fault-kind",
        choices=FAULT_KINDS,
        default="http_500",
        help="the kind of the random faults of --fault-rate",
    )
    parser.add_argument(
        "--sticky-faults",
        action="store_true",
        help="random faults depend on the pair's content only: a drawn pair fails every retry "
        "(--fault-rate 0.1 --sticky-faults: about a tenth of the pairs fail, the rest answer)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        type=_fault_spec,
        metavar="KIND[,KEY=VALUE...]",
        help=(
            "scripted fault for comparisons whose answers contain TEXT (match=TEXT; every "
            "comparison without match); repeatable. Keys: match, position (first, second, either "
            f"or both), times, status, retry_after, body, delay, chars. Kinds: "
            f"{', '.join(FAULT_KINDS)}"
        ),
    )


def _add_sim_budgets(parser: Any) -> None:
    """What the simulated judge can take: output tokens per verdict, context, calls at once."""
    from genrm_trio.testing.verdicts import LENGTH_PRESETS

    parser.add_argument(
        "--length-model",
        choices=sorted(LENGTH_PRESETS),
        default=None,
        help=(
            "output tokens each verdict needs, drawn per pair and attempt from this preset; a "
            "request whose max_output_tokens / max_tokens is lower gets an exhausted budget "
            "(default: no length model; a [need=N] marker in an answer still applies)"
        ),
    )
    parser.add_argument(
        "--context-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "a context window of N tokens, as vLLM's max_model_len: a call whose prompt plus "
            "output budget exceed it gets vLLM's HTTP 400, and GET /v1/models reports it "
            "(default: no window)"
        ),
    )
    parser.add_argument(
        "--capacity",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "serve at most N calls at once, the rest queued first-in first-out, like a saturated "
            "vLLM fleet; each call's latency runs while it is served (default: unlimited)"
        ),
    )


def _add_sim_judgment(parser: Any) -> None:
    """A noisy judge instead of deterministic verdicts (docs/benchmarks.md, "Reward quality")."""
    from genrm_trio.testing.judgment import JUDGMENT_PRESETS

    parser.add_argument(
        "--judgment",
        choices=sorted(JUDGMENT_PRESETS),
        default=None,
        help=(
            "a noisy judge: verdicts from latent answer qualities, comparative (one noisy "
            "judgment of the difference drives ranking and scores) or pointwise (each score "
            "measures its own answer; the ranking is a separate position-biased preference); "
            "docs/benchmarks.md, 'Reward quality' (default: deterministic verdicts)"
        ),
    )
    parser.add_argument(
        "--judgment-noise",
        metavar="NUMBER",
        type=non_negative,
        default=None,
        help="noise sd of the judgment (comparative) or of each score (pointwise) (default: "
        "the family's, 1.11 or 0.75)",
    )
    parser.add_argument(
        "--judgment-bias",
        metavar="NUMBER",
        type=finite_number,
        default=None,
        help="position bias toward the first answer (default: the family's, 0.57 or 0.90)",
    )
    parser.add_argument(
        "--judgment-beta",
        metavar="NUMBER",
        type=non_negative,
        default=None,
        help="pointwise preference sharpness beta (default: 1.57)",
    )


def _add_sim_rate_limits(parser: Any) -> None:
    from genrm_trio.testing.ratelimit import RETRY_AFTER_FORMS

    parser.add_argument(
        "--rpm",
        type=positive_int,
        default=None,
        metavar="N",
        help="a hosted API's requests per minute: a call beyond them gets 429 (default: none)",
    )
    parser.add_argument(
        "--tpm",
        type=positive_int,
        default=None,
        metavar="N",
        help=(
            "a hosted API's tokens per minute, a call costing its prompt tokens plus its "
            "max_tokens: a call beyond them gets 429 (default: none)"
        ),
    )
    parser.add_argument(
        "--no-rate-limit-headers",
        dest="rate_limit_headers",
        action="store_false",
        help="with --rpm/--tpm, send no x-ratelimit-* headers (default: on every reply)",
    )
    parser.add_argument(
        "--retry-after",
        choices=RETRY_AFTER_FORMS,
        default="seconds",
        help=(
            "how a 429 says when to come back: retry-after seconds, retry-after-ms, retry-after "
            "as an HTTP date, only the x-ratelimit-reset-* headers, or not at all "
            "(default: seconds)"
        ),
    )


# --- demo and bench -----------------------------------------------------------------------------


def _run_demo(args: argparse.Namespace) -> int:
    from genrm_trio.app.demo import run_demo

    return run_demo(verbose=args.verbose)


def _add_demo(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="simulated judge + service in-process: four 16-rollout groups, one with failures",
        description=(
            "Start the simulated judge and the service on 127.0.0.1, score four 16-rollout groups "
            "over HTTP (one with injected judge failures) and show rewards and masks."
        ),
    )
    parser.add_argument("--verbose", action="store_true", help="also show the service's log")
    parser.set_defaults(handler=_run_demo)


def _run_gym_root(args: argparse.Namespace) -> int:
    from genrm_trio.app.gym import gym_root

    print(gym_root())
    return 0


def gym_main() -> int:
    """What NeMo Gym's app.py runs: serve the launched instance until Gym's SIGINT."""
    from genrm_trio.app.gym import settings_from_gym_env

    # Gym shows (and may tee to its log directory) what its servers print on stdout.
    configure_logging(logging.INFO, stdout=True)
    return run_service(partial(settings_from_gym_env, os.environ))


def _add_gym_root(sub: Any) -> None:
    parser = sub.add_parser(
        "gym-root",
        help="print the directory to give NeMo Gym as --search-dir",
        description=(
            "Print the absolute path of the directory that holds genrm-trio's NeMo Gym "
            "resources server (resources_servers/genrm_trio: app.py, requirements.txt, "
            'configs/genrm_trio.yaml). Use it as: gym env start --search-dir "$(genrm-trio '
            'gym-root)" ...'
        ),
    )
    parser.set_defaults(handler=_run_gym_root)


def _add_bench(sub: Any) -> None:
    from genrm_trio.app.bench import BENCH_DESCRIPTION, add_bench_arguments, run_bench_command

    parser = sub.add_parser(
        "bench",
        help="load generator: throughput, latency percentiles, judge-call counts",
        description=BENCH_DESCRIPTION,
    )
    add_bench_arguments(parser)
    parser.set_defaults(handler=run_bench_command)


def _add_calibrate(sub: Any) -> None:
    from genrm_trio.app.calibrate import add_calibrate_arguments, run_calibrate_command

    parser = sub.add_parser(
        "calibrate",
        help="measure the judge on your rollouts and recommend a comparison schedule",
        description=(
            "Judge every pair of a few rollout groups in both orders (N(N-1) calls a group) "
            "with the config's judge, measure its position bias, order consistency and cycle "
            "share, estimate each schedule's Kendall tau under the fitted judge, and print the "
            'cheapest schedule within 0.02 of the best (docs/operations.md, "Calibrating the '
            'judge").'
        ),
    )
    add_calibrate_arguments(parser)
    parser.set_defaults(handler=run_calibrate_command)


# --- entry point --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="GenRM pairwise-comparison rewards for RL rollout groups, on trio.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    adders: Sequence[Callable[[Any], None]] = (
        _add_serve,
        _add_demo,
        _add_sim_judge,
        _add_bench,
        _add_calibrate,
        add_checkpoint_arguments,
        _add_gym_root,
        add_watch_commands,
    )
    for add in adders:
        add(sub)
    return parser


def exit_process(code: int) -> NoReturn:
    """End the process with `code`, without the cyclic collector's last pass over the heap.

    Interpreter finalization runs a full collection over every object still alive (every module
    loaded, hypercorn's, quart's and pydantic's included): most of a stop's CPU after its last
    reply, and Gym kills a server one second after its SIGINT while it stops its other servers
    on the same cores (docs/benchmarks.md, "Stop under load", has the figures).
    Frozen objects are left out of that pass; they go with the process. `sys.exit`, not
    `os._exit`: atexit handlers and the flush of logs and stdio still run.
    """
    gc.freeze()
    sys.exit(code)


def run() -> NoReturn:
    """The `genrm-trio` console script: `main()` with the command line, then exit."""
    code = main()
    try:
        sys.stdout.flush()  # what is still buffered, while a closed pipe can still be handled
    except BrokenPipeError:
        code = _stdout_closed()
    exit_process(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `genrm-trio` command; returns the exit code."""
    parser = build_parser()
    assert isinstance(parser, _Parser)
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # reported by the command given them, with its usage line
            _command_parser(parser, args).unrecognized(extras)
        if args.command is None:
            parser.error(f"a command is required: {COMMANDS} ({PROG} --help describes them)")
        if args.command in ("serve", "sim-judge"):
            configure_logging(logging.INFO)
        handler: Callable[[argparse.Namespace], int] = args.handler
        try:
            return handler(args)
        except UsageError as exc:
            _command_parser(parser, args).error(str(exc))
    except SystemExit as exc:  # --help, --version, a usage error
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":
    run()
