"""A real Prometheus for the dashboard and alert-rule tests (docs/operations.md, "Watching it").

Debian's `prometheus` package provides `prometheus` and `promtool`; `.ci/run` installs it and
sets GENRM_TRIO_REQUIRE_PROMETHEUS=1, so that in CI a missing binary fails these tests instead
of skipping them. Prometheus runs on 127.0.0.1 with a temporary storage directory and is
stopped by its PID.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from genrm_trio.app.watch import dashboard_text, rules_text

REQUIRE_ENV = "GENRM_TRIO_REQUIRE_PROMETHEUS"
START_TIMEOUT_S = 30.0


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; skips the test when absent, fails instead when
    GENRM_TRIO_REQUIRE_PROMETHEUS is set (CI)."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} not found (apt-get install prometheus)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{message}; {REQUIRE_ENV} is set, so it must be installed")
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def dashboard() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(dashboard_text())
    return value


def alert_rules() -> list[dict[str, Any]]:
    import yaml

    document = yaml.safe_load(rules_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def panel_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of every panel."""
    return [
        (panel["title"], target["refId"], target["expr"])
        for panel in dashboard()["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def substitute(expr: str, values: Mapping[str, str], rate_interval: str) -> str:
    """A dashboard query with its variables replaced, as Grafana sends it."""
    expr = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    assert "$" not in expr, expr
    return expr


_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_]\w*)\)$")


def variable_query(variable: Mapping[str, Any]) -> tuple[str, str]:
    """(series selector, label) of a `label_values(selector, label)` query variable."""
    match = _LABEL_VALUES.match(variable["definition"])
    assert match is not None, variable["definition"]
    return match.group("selector"), match.group("label")


@dataclass
class Prometheus:
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self, http: httpx.Client, expr: str, at: float | None = None) -> list[Any]:
        """An instant query's result vector (at unix time `at`, else now)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        reply = http.get(f"{self.url}/api/v1/query", params=params)
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", (expr, body)
        assert body["data"]["resultType"] == "vector", (expr, body)
        result: list[Any] = body["data"]["result"]
        return result

    def label_values(self, http: httpx.Client, label: str, selector: str) -> list[str]:
        reply = http.get(f"{self.url}/api/v1/label/{label}/values", params={"match[]": selector})
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", (selector, body)
        values: list[str] = body["data"]
        return values

    def get(self, http: httpx.Client, path: str) -> Any:
        reply = http.get(f"{self.url}{path}")
        assert reply.status_code == 200, reply.text
        return reply.json()["data"]


_METRIC = re.compile(r"\b((?:genrm_trio_|process_)[a-zA-Z0-9_:]*|up)\b")


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads."""
    return set(_METRIC.findall(expr))


def finite_values(result: list[Any]) -> list[float]:
    return [v for v in (float(item["value"][1]) for item in result) if math.isfinite(v)]


@contextlib.contextmanager
def running_prometheus(directory: Path, config: str) -> Iterator[Prometheus]:
    """`prometheus` on 127.0.0.1 with `config`, ready when this yields; stopped by its PID."""
    exe = binary("prometheus")
    config_path = directory / "prometheus.yml"
    config_path.write_text(config)
    storage = directory / "tsdb"
    storage.mkdir()
    port = free_port()
    log_path = directory / "prometheus.log"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            [
                exe,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={storage}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=log,
        )
    prometheus = Prometheus(popen, f"http://127.0.0.1:{port}", log_path)
    try:
        with httpx.Client(trust_env=False, timeout=5.0) as http:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                assert popen.poll() is None, f"prometheus exited: {prometheus.log()}"
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{prometheus.url}/-/ready").status_code == 200:
                        break
                assert time.monotonic() < deadline, f"prometheus not ready: {prometheus.log()}"
                time.sleep(0.1)
        yield prometheus
    finally:
        if popen.poll() is None:
            popen.send_signal(signal.SIGTERM)
            try:
                popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=15)
