"""The dashboard and alert rules against a real Prometheus (docs/operations.md, "Watching it").

Prometheus (Debian's package; `.ci/run` installs it) scrapes a real `genrm-trio serve` every
second, over two simulated judge replicas and over one (a single `--judge-url`: a fleet of one),
with the scrape config and rule file the commands print and the server's bearer token from a
file. A clean phase of load, then a phase where one member of every group fails its
comparisons; then every panel query and every variable of the dashboard must return a finite
value (the queue wait a line per priority class, the replica stalls a 0 per replica: none
stalled), and every alert expression is evaluated: none true after the clean phase, the
masked-rollout alert true after the failure phase (and pending in Prometheus's own rule
evaluation), and every series an alert rule reads exists.
"""

from __future__ import annotations

import math
import re
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from procs import command
from prom import (
    Prometheus,
    alert_rules,
    binary,
    dashboard,
    finite_values,
    metric_names,
    panel_targets,
    running_prometheus,
    substitute,
    variable_query,
)
from watched import Watched, load, watched_server

from genrm_trio.app.watch import JOB_NAME, RULES_FILE

pytestmark = pytest.mark.slow

PHASE_S = 4.0
# Grafana's $__rate_interval for the test's queries: long enough to span the whole run
RATE_INTERVAL = "1m"
MASKED_ALERT = "GenRMTrioMaskedRollouts"


def printed(*args: str) -> str:
    """What `genrm-trio ARGS` prints (the installed command, as an operator runs it)."""
    done = subprocess.run([*command(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_for(description: str, check: Any, within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {description}"
        time.sleep(0.2)


def scraped_after(prometheus: Prometheus, http: httpx.Client, moment: float) -> float:
    """Wait for a scrape of genrm-trio later than unix time `moment`; returns its time."""

    def check() -> float | None:
        result = prometheus.query(http, "timestamp(genrm_trio_judge_inflight)")
        stamps = [float(item["value"][1]) for item in result]
        return max(stamps) if stamps and max(stamps) > moment else None

    stamp: float = wait_for(f"a scrape after {moment}", check)
    return stamp


def variable_values(
    prometheus: Prometheus, http: httpx.Client, at: float, watched: Watched
) -> dict[str, str]:
    """Each dashboard variable's value, found through its own label_values query: the first
    value for single-valued ones, the All value (`.*`) for the others."""
    chosen: dict[str, str] = {}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = variable_query(variable)
        values = prometheus.label_values(http, label, substitute(selector, chosen, RATE_INTERVAL))
        expected = {
            "job": [JOB_NAME],
            "instance": [watched.target],
            "replica": sorted(watched.replicas),
        }[variable["name"]]
        assert sorted(values) == expected, (variable["name"], values)
        chosen[variable["name"]] = variable["allValue"] if variable["includeAll"] else values[0]
    return chosen


@pytest.mark.parametrize("replicas", [1, 2])
def test_dashboard_and_rules_against_a_real_prometheus(tmp_path: Path, replicas: int) -> None:
    binary("prometheus")
    with watched_server(tmp_path, replicas=replicas) as watched:
        key_file = tmp_path / "scrape.token"
        key_file.write_text(watched.token + "\n")
        rules_file = tmp_path / RULES_FILE
        rules_file.write_text(printed("prometheus-rules"))
        config = printed(
            "prometheus-config",
            "--target",
            watched.target,
            "--interval",
            "1s",
            "--api-key-file",
            str(key_file),
            "--rules",
            str(rules_file),
        )
        with (
            running_prometheus(tmp_path, config) as prometheus,
            httpx.Client(trust_env=False, timeout=10.0) as http,
        ):
            # /metrics needs the token, and the scrape has it
            assert http.get(f"{watched.url}/metrics").status_code == 401
            wait_for(
                "the target to be up",
                lambda: prometheus.query(http, f'up{{job="{JOB_NAME}"}} == 1'),
            )
            [target] = prometheus.get(http, "/api/v1/targets")["activeTargets"]
            assert (target["health"], target["lastError"]) == ("up", "")

            clean_groups = trio.run(partial(load, watched, PHASE_S, failing=False))
            clean_end = scraped_after(prometheus, http, time.time())
            failing_groups = trio.run(partial(load, watched, PHASE_S, failing=True))
            failed_end = scraped_after(prometheus, http, time.time())
            assert clean_groups >= 3 and failing_groups >= 3, (clean_groups, failing_groups)

            # every alert is quiet after a healthy run, each expression evaluates, and every
            # series it reads is there (an alert on a series never exported would never fire)
            for rule in alert_rules():
                assert prometheus.query(http, rule["expr"], clean_end) == [], rule["alert"]
                for name in metric_names(rule["expr"]):
                    assert prometheus.query(http, name, failed_end), (rule["alert"], name)
            [masked] = [rule for rule in alert_rules() if rule["alert"] == MASKED_ALERT]
            # quiet for the right reason: the fraction is there, and 0
            fraction = masked["expr"].rpartition(">")[0]
            [quiet] = prometheus.query(http, fraction, clean_end)
            assert float(quiet["value"][1]) == 0.0
            [firing] = prometheus.query(http, masked["expr"], failed_end)
            assert firing["metric"]["instance"] == watched.target
            assert 0.05 < float(firing["value"][1]) <= 1.0

            # every panel query and variable gives at least one finite value
            values = variable_values(prometheus, http, failed_end, watched)
            for title, ref, expr in panel_targets():
                query = substitute(expr, values, RATE_INTERVAL)
                result = prometheus.query(http, query, failed_end)
                assert finite_values(result), (title, ref, query, result)
                if "by (le, priority)" in expr:  # one line per class; complete ones were judged
                    lines = {item["metric"]["priority"]: item for item in result}
                    assert set(lines) == {"complete", "collecting"}, result
                    assert finite_values([lines["complete"]]), result
                if "genrm_trio_judge_replica_stalls_total" in expr:  # at 0 from the start
                    per_replica = {i["metric"]["replica"]: i["value"][1] for i in result}
                    assert per_replica == dict.fromkeys(watched.replicas, "0"), result

            # Prometheus's own rule evaluation: every rule healthy, the masked alert pending
            def evaluated() -> dict[str, Any] | None:
                groups = prometheus.get(http, "/api/v1/rules")["groups"]
                rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
                return rules if rules[MASKED_ALERT]["state"] == "pending" else None

            rules = wait_for("the masked-rollout alert to be pending", evaluated)
            assert set(rules) == {rule["alert"] for rule in alert_rules()}
            for name, rule in rules.items():
                assert (rule["health"], rule.get("lastError", "")) == ("ok", ""), name
            others = {name: rule["state"] for name, rule in rules.items() if name != MASKED_ALERT}
            assert set(others.values()) <= {"inactive", "pending"}, others
            [alert] = rules[MASKED_ALERT]["alerts"]
            assert math.isfinite(float(alert["value"]))
            # its description gives the masked rows, total and split, from its own queries
            split = re.search(
                r"rows answered mask_sample: true: (\d+) \((\d+) masked alone, (\d+) with "
                r"their whole group\)",
                alert["annotations"]["description"],
            )
            assert split is not None, alert["annotations"]
            total, alone, whole = (int(n) for n in split.groups())
            # each an increase() over 10 minutes, extrapolated, rounded on its own
            assert abs(total - (alone + whole)) <= 1 and alone > 0 and whole == 0, split.group(0)
        assert "level=error" not in prometheus.log(), prometheus.log()
