"""Watching a running server (docs/operations.md, "Watching it"): the commands that print the
shipped Grafana dashboard and Prometheus alert rules, a scrape config, and `genrm-trio top`.

`genrm-trio grafana-dashboard` and `genrm-trio prometheus-rules` print files shipped inside the
package (`app/monitoring/`), so `genrm-trio grafana-dashboard > dash.json` works from a pip
install. `genrm-trio prometheus-config --target HOST:PORT` prints a prometheus.yml that scrapes
those targets. `/metrics` needs the server's bearer token when `server.api_key_env` is set; the
config then names a file holding it (`--api-key-file`, Prometheus's `credentials_file`), so the
token itself is never printed.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

__all__ = [
    "DASHBOARD_FILE",
    "JOB_NAME",
    "RULES_FILE",
    "add_watch_commands",
    "dashboard_text",
    "rules_text",
    "scrape_config",
]

JOB_NAME: Final = "genrm-trio"
"""The scrape job of `prometheus-config`; the rules' GenRMTrioDown and GenRMTrioAbsent select it."""
DASHBOARD_FILE: Final = "grafana-dashboard.json"
RULES_FILE: Final = "prometheus-rules.yml"

# Prometheus's duration syntax (e.g. 15s, 1m30s, 500ms), without the optional units it rejects
# for scrape intervals.
_DURATION: Final = re.compile(r"^(?:[0-9]+(?:ms|s|m|h|d|w|y))+$")


def _shipped(name: str) -> str:
    return resources.files("genrm_trio.app").joinpath("monitoring", name).read_text("utf-8")


def dashboard_text() -> str:
    """The Grafana dashboard JSON (Grafana 10+ import format)."""
    return _shipped(DASHBOARD_FILE)


def rules_text() -> str:
    """The Prometheus alert rule file (YAML, with a comment explaining each threshold)."""
    return _shipped(RULES_FILE)


def _target(value: str) -> str:
    """`HOST:PORT` (an IPv6 host in brackets), as Prometheus's static_configs take it."""
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {value!r} ({exc})") from None
    if (
        port is None
        or not parts.hostname
        or parts.path
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {value!r}")
    return value


def _duration(value: str) -> str:
    if not _DURATION.match(value) or not any(c != "0" for c in value if c.isdigit()):
        raise argparse.ArgumentTypeError(f"not a Prometheus duration like 15s or 1m: {value!r}")
    return value


def scrape_config(
    targets: Sequence[str],
    *,
    interval: str = "15s",
    api_key_file: str | None = None,
    rules: Sequence[str] = (),
) -> str:
    """A prometheus.yml scraping `targets` (HOST:PORT) every `interval` under job `genrm-trio`,
    with the bearer token read from `api_key_file` and the rule files `rules` when given."""
    job: dict[str, Any] = {
        "job_name": JOB_NAME,
        "metrics_path": "/metrics",
        "scheme": "http",
        "static_configs": [{"targets": list(targets)}],
    }
    if api_key_file is not None:
        job["authorization"] = {"type": "Bearer", "credentials_file": api_key_file}
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
    }
    if rules:
        config["rule_files"] = list(rules)
    config["scrape_configs"] = [job]
    header = (
        "# Prometheus config for genrm-trio (genrm-trio prometheus-config): run it as it is\n"
        "# (prometheus --config.file=FILE) or merge its scrape_configs entry into yours.\n"
    )
    if api_key_file is None:
        header += (
            "# No --api-key-file: fine for a server without server.api_key_env; with one,\n"
            "# /metrics answers 401 and the target shows as down.\n"
        )
    else:
        header += (
            "# The bearer token is read from the credentials_file at every scrape: a file\n"
            "# holding the value of the server's server.api_key_env variable, readable by\n"
            "# the prometheus user.\n"
        )
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _absolute(path: str) -> str:
    # Prometheus resolves relative paths against the config file's directory, not the cwd
    return str(Path(path).expanduser().absolute())


def _write(text: str) -> int:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


def _run_dashboard(args: argparse.Namespace) -> int:
    return _write(dashboard_text())


def _run_rules(args: argparse.Namespace) -> int:
    return _write(rules_text())


def _run_config(args: argparse.Namespace) -> int:
    key_file = None if args.api_key_file is None else _absolute(args.api_key_file)
    rules = [_absolute(path) for path in args.rules]
    return _write(
        scrape_config(args.target, interval=args.interval, api_key_file=key_file, rules=rules)
    )


def _run_top(args: argparse.Namespace) -> int:
    from genrm_trio.app.top import run_top

    return run_top(args)


def add_watch_commands(subparsers: Any) -> None:
    """Add grafana-dashboard, prometheus-rules, prometheus-config and top to the CLI."""
    parser = subparsers.add_parser(
        "grafana-dashboard",
        help="print the Grafana dashboard JSON (import it into Grafana 10+)",
        description=(
            "Print the Grafana dashboard for genrm-trio's /metrics (Grafana 10+ import format; "
            "it asks for a Prometheus data source). Each panel's title says what a bad value "
            "looks like."
        ),
    )
    parser.set_defaults(handler=_run_dashboard)

    parser = subparsers.add_parser(
        "prometheus-rules",
        help="print the Prometheus alert rules (YAML)",
        description=(
            "Print the Prometheus alert rule file for genrm-trio: masked rollouts, failing "
            "judge, ejected replicas, a growing judge queue, deadline failures, a failing "
            "scrape. A comment beside each rule explains its threshold."
        ),
    )
    parser.set_defaults(handler=_run_rules)

    parser = subparsers.add_parser(
        "prometheus-config",
        help="print a Prometheus config that scrapes genrm-trio",
        description=(
            f"Print a prometheus.yml with one scrape job ({JOB_NAME!r}) for the given targets. "
            "When the server sets server.api_key_env, /metrics needs its bearer token: give "
            "--api-key-file, a file holding the token (the token is never printed)."
        ),
    )
    parser.add_argument(
        "--target",
        required=True,
        action="append",
        type=_target,
        metavar="HOST:PORT",
        help="a genrm-trio server to scrape; repeat it for several processes",
    )
    parser.add_argument(
        "--interval",
        type=_duration,
        default="15s",
        metavar="DURATION",
        help="scrape and rule evaluation interval (default: 15s)",
    )
    parser.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="file holding the server's bearer token (Prometheus reads it at every scrape)",
    )
    parser.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="FILE",
        help="a rule file to load (e.g. the output of genrm-trio prometheus-rules); repeatable",
    )
    parser.set_defaults(handler=_run_config)

    from genrm_trio.app.top import add_top_arguments

    parser = subparsers.add_parser(
        "top",
        help="live terminal view of a running server",
        description=(
            "Show one running server at a glance, refreshed every --interval seconds: groups "
            "per second, masked and failed rates, judge latency, calls in flight and queued, "
            "the judge replicas, the oldest active cohorts. Reads /metrics, /cohorts and "
            "/judge/replicas. Ctrl-C leaves (exit 0)."
        ),
    )
    add_top_arguments(parser)
    parser.set_defaults(handler=_run_top)
