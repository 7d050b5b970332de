"""The shipped Grafana dashboard, alert rules and scrape config (docs/operations.md, "Watching
it"): what Grafana's import needs, that every metric and label they name is one genrm-trio
exports (a renamed metric fails here), promtool's checks and rule unit tests, and the commands
that print them. The live evaluation against a real Prometheus is test_prometheus_live.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fake_replicas import replica_stats
from prom import alert_rules, binary, dashboard, panel_targets, variable_query
from prometheus_client.parser import text_string_to_metric_families

from genrm_trio.app.cli import main
from genrm_trio.app.watch import (
    JOB_NAME,
    RULES_FILE,
    dashboard_text,
    rules_text,
    scrape_config,
)
from genrm_trio.metrics import Metrics

HERE = Path(__file__).parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PROMETHEUS_LABELS = {"job", "instance"}  # added by the scrape


def exported() -> dict[str, dict[str, set[str]]]:
    """Every sample name a server exports (with a judge fleet) -> label -> values seen."""
    metrics = Metrics()
    metrics.watch_replicas(lambda: [replica_stats("10.0.0.2:8000")])
    out: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            labels = out.setdefault(sample.name, {})
            for name, value in sample.labels.items():
                labels.setdefault(name, set()).add(value)
    return out


_SELECTOR = re.compile(r"\b((?:genrm_trio_|process_)[a-zA-Z0-9_:]*|up)\b(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]


def selectors(expr: str) -> Iterator[Selector]:
    for match in _SELECTOR.finditer(expr):
        yield Selector(match.group(1), tuple(_MATCHER.findall(match.group(2) or "")))


def all_queries() -> list[tuple[str, str]]:
    """(where, expr) of every dashboard query, variable query and alert rule."""
    queries = [(f"panel {title!r} {ref}", expr) for title, ref, expr in panel_targets()]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            queries.append((f"variable {variable['name']}", variable["definition"]))
    queries += [(f"rule {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    return queries


# --- every name and label is one genrm-trio exports ---------------------------------------------


@pytest.mark.parametrize(("where", "expr"), all_queries())
def test_every_metric_and_label_is_one_genrm_trio_exports(where: str, expr: str) -> None:
    names = exported()
    found = list(selectors(expr))
    assert found, f"{where}: no genrm-trio metric in {expr!r}"
    for selector in found:
        if selector.metric == "up":  # Prometheus's own, per scrape target
            assert selector.matchers == (("job", "=", JOB_NAME),), (where, selector)
            continue
        assert selector.metric in names, f"{where}: {selector.metric} is not exported"
        labels = names[selector.metric]
        for label, op, value in selector.matchers:
            assert label in labels or label in PROMETHEUS_LABELS, (
                f"{where}: {selector.metric} has no label {label!r} (it has {sorted(labels)})"
            )
            if "$" in value or label not in labels or op in ("!~",):
                continue
            known = labels[label]
            wanted = value.split("|") if op == "=~" else [value]
            assert set(wanted) <= known, f"{where}: {selector.metric}{{{label}}} has {known}"


@pytest.mark.parametrize(("where", "expr"), all_queries())
def test_every_label_a_query_groups_by_is_one_its_series_carry(where: str, expr: str) -> None:
    """`sum by (le, priority)`: a misspelt or dropped label would merge the lines silently."""
    names = exported()
    carried = PROMETHEUS_LABELS | {"le"}
    for selector in selectors(expr):
        carried |= set(names.get(selector.metric, {}))
    for grouping in re.finditer(r"\bby \(([^)]*)\)", expr):
        for label in (name.strip() for name in grouping.group(1).split(",")):
            assert label in carried, f"{where}: no series of {expr!r} has a label {label!r}"


def test_the_exported_names_include_what_the_panels_need() -> None:
    """The issue's panel list, by metric: each is queried by at least one panel."""
    queried = {s.metric for _, _, expr in panel_targets() for s in selectors(expr)}
    needed = {
        "genrm_trio_cohorts_terminal_total",
        "genrm_trio_masked_rollouts_total",
        "genrm_trio_failed_comparisons_total",
        "genrm_trio_cohort_rollouts_total",
        "genrm_trio_group_latency_seconds_bucket",
        "genrm_trio_reward_latency_seconds_bucket",
        "genrm_trio_judge_attempt_seconds_bucket",
        "genrm_trio_judge_inflight",
        "genrm_trio_judge_queued",
        "genrm_trio_judge_queue_wait_seconds_bucket",
        "genrm_trio_eager_comparisons_total",
        "genrm_trio_judge_calls_total",
        "genrm_trio_judge_retries_total",
        "genrm_trio_judge_budget_escalations_total",
        "genrm_trio_judge_replica_calls_total",
        "genrm_trio_judge_replica_failures_total",
        "genrm_trio_judge_replica_inflight",
        "genrm_trio_judge_replica_ejected",
        "genrm_trio_judge_replica_stalls_total",
        "genrm_trio_judge_replica_ejections_total",
        "genrm_trio_judge_unreachable",
        "genrm_trio_judge_unreachable_seconds_total",
        "genrm_trio_active_cohorts",
        "genrm_trio_deadline_failures_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    }
    assert needed <= queried, needed - queried


# --- the dashboard is what Grafana imports ------------------------------------------------------


def test_the_dashboard_has_grafanas_import_structure() -> None:
    board = dashboard()
    assert board["title"] == "genrm-trio" and board["uid"] == "genrm-trio"
    assert board["id"] is None  # Grafana assigns it on import
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["time"] == {"from": "now-1h", "to": "now"}
    [source] = board["__inputs"]
    assert source == {
        "name": "DS_PROMETHEUS",
        "label": "Prometheus",
        "description": source["description"],
        "type": "datasource",
        "pluginId": "prometheus",
        "pluginName": "Prometheus",
    }
    requires = {item["id"]: item for item in board["__requires"]}
    assert int(requires["grafana"]["version"].split(".")[0]) >= 10
    assert requires["prometheus"]["type"] == "datasource"
    panel_types = {p["type"] for p in board["panels"]} - {"row"}
    assert panel_types <= {item["id"] for item in board["__requires"] if item["type"] == "panel"}
    # the import's data source choice reaches the panels only through the datasource variable
    text = dashboard_text()
    assert text.count("${DS_PROMETHEUS}") == 2


def test_the_dashboard_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance", "replica"]
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    assert source["current"]["value"] == "${DS_PROMETHEUS}"
    for name in ("job", "instance", "replica"):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        assert variable["query"]["query"] == variable["definition"]
        assert variable_query(variable)[1] == name
    for name in ("instance", "replica"):  # several processes, several replicas
        assert variables[name]["includeAll"] and variables[name]["multi"]
        assert variables[name]["allValue"] == ".*"
    assert variable_query(variables["replica"])[0].startswith(
        "genrm_trio_judge_replica_calls_total{"
    )


def test_every_panel_is_importable_and_says_what_bad_looks_like() -> None:
    panels = dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert grid["x"] >= 0 and grid["w"] >= 1 and grid["x"] + grid["w"] <= 24
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']!r} overlaps another panel"
        cells |= covered
        if panel["type"] == "row":
            assert grid["w"] == 24 and panel["panels"] == []
            continue
        assert panel["type"] == "timeseries"
        assert " — bad: " in panel["title"], panel["title"]
        assert panel["description"]
        assert panel["datasource"] == DATASOURCE
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert target["expr"].strip() and target["legendFormat"]
        assert "unit" in panel["fieldConfig"]["defaults"]


def test_every_panel_query_applies_the_variables_and_survives_added_labels() -> None:
    for title, ref, expr in panel_targets():
        for selector in selectors(expr):
            matchers = set(selector.matchers)
            assert {("job", "=~", "$job"), ("instance", "=~", "$instance")} <= matchers, (
                title,
                ref,
            )
            if selector.metric.startswith("genrm_trio_judge_replica_"):
                assert ("replica", "=~", "$replica") in matchers, (title, ref)
        # quantiles sum the buckets by le and named labels only, so a label added to a
        # histogram later (a `priority`, say) merges instead of splitting the line
        for quantile in re.finditer(r"histogram_quantile\(([^,]+),\s*(\w+)", expr):
            assert quantile.group(2) == "sum", (title, ref)
            rest = expr[quantile.end() :].lstrip()
            assert re.match(r"by \(le(, \w+)*\) \(rate\(", rest), (title, ref)
        assert "rate(" not in expr or "[$__rate_interval]" in expr, (title, ref)


# --- the alert rules -----------------------------------------------------------------------------


def test_each_rule_has_a_comment_beside_it_and_a_severity() -> None:
    lines = rules_text().splitlines()
    alerts = [i for i, line in enumerate(lines) if line.strip().startswith("- alert: ")]
    assert len(alerts) == len(alert_rules()) >= 8
    for i in alerts:
        above = []
        j = i - 1
        while lines[j].strip().startswith("#"):
            above.append(lines[j])
            j -= 1
        assert len(above) >= 2, f"no explanation above {lines[i].strip()}"
    names = [rule["alert"] for rule in alert_rules()]
    assert len(set(names)) == len(names)
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_the_rules_cover_what_needs_a_person() -> None:
    assert {rule["alert"] for rule in alert_rules()} == {
        "GenRMTrioMaskedRollouts",
        "GenRMTrioJudgeFailing",
        "GenRMTrioReplicaEjected",
        "GenRMTrioAllReplicasEjected",
        "GenRMTrioJudgeUnreachable",
        "GenRMTrioReplicaStalled",
        "GenRMTrioJudgeQueueGrowing",
        "GenRMTrioJudgeRateLimited",
        "GenRMTrioDeadlineFailures",
        "GenRMTrioDown",
        "GenRMTrioAbsent",
    }


def test_promtool_check_rules(tmp_path: Path) -> None:
    path = tmp_path / RULES_FILE
    path.write_text(rules_text())
    done = subprocess.run(
        [binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_promtool_rule_unit_tests(tmp_path: Path) -> None:
    """Every alert fires when it should and not before, on synthetic series (promtool's own
    rule test runner, with the `for` durations in its virtual time)."""
    (tmp_path / RULES_FILE).write_text(rules_text())
    shutil.copy(HERE / "promtool" / "rules_test.yml", tmp_path / "rules_test.yml")
    done = subprocess.run(
        [binary("promtool"), "test", "rules", "rules_test.yml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_rule_unit_tests_exercise_every_alert() -> None:
    tests = yaml.safe_load((HERE / "promtool" / "rules_test.yml").read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in alert_rules()}


# --- the scrape config --------------------------------------------------------------------------


def test_the_scrape_config_without_a_token() -> None:
    config = yaml.safe_load(scrape_config(["127.0.0.1:8100", "[::1]:8101"]))
    assert config == {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": [
            {
                "job_name": "genrm-trio",
                "metrics_path": "/metrics",
                "scheme": "http",
                "static_configs": [{"targets": ["127.0.0.1:8100", "[::1]:8101"]}],
            }
        ],
    }


def test_the_scrape_config_reads_the_token_from_a_file_and_loads_the_rules() -> None:
    text = scrape_config(
        ["10.0.0.5:8100"], interval="1s", api_key_file="/etc/genrm.token", rules=["/r.yml"]
    )
    config = yaml.safe_load(text)
    assert config["global"] == {"scrape_interval": "1s", "evaluation_interval": "1s"}
    assert config["rule_files"] == ["/r.yml"]
    [job] = config["scrape_configs"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/etc/genrm.token"}
    assert text.startswith("# Prometheus config for genrm-trio")


def test_promtool_check_config_accepts_the_printed_config(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret\n")
    (tmp_path / RULES_FILE).write_text(rules_text())
    path = tmp_path / "prometheus.yml"
    path.write_text(
        scrape_config(
            ["127.0.0.1:8100"],
            api_key_file=str(tmp_path / "token"),
            rules=[str(tmp_path / RULES_FILE)],
        )
    )
    done = subprocess.run(
        [binary("promtool"), "check", "config", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


# --- the commands --------------------------------------------------------------------------------


def test_the_commands_print_the_shipped_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grafana-dashboard"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == dashboard()
    assert main(["prometheus-rules"]) == 0
    assert capsys.readouterr().out == rules_text()


def test_prometheus_config_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["prometheus-config", "--target", "127.0.0.1:8100", "--target", "127.0.0.1:8101"]
    assert main([*argv, "--interval", "5s", "--api-key-file", "tok", "--rules", "r.yml"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    [job] = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:8100", "127.0.0.1:8101"]}]
    # relative paths become absolute: Prometheus would resolve them against the config's dir
    assert job["authorization"]["credentials_file"] == str(tmp_path / "tok")
    assert config["rule_files"] == [str(tmp_path / "r.yml")]
    assert config["global"]["scrape_interval"] == "5s"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--target", "localhost"], "--target: not HOST:PORT: 'localhost'"),
        (["--target", "http://a:1"], "--target: not HOST:PORT: 'http://a:1'"),
        (["--target", "a:1/metrics"], "--target: not HOST:PORT: 'a:1/metrics'"),
        (["--target", "a:99999"], "--target: not HOST:PORT: 'a:99999'"),
        (["--target", "a:1", "--interval", "15"], "--interval: not a Prometheus duration"),
        (["--target", "a:1", "--interval", "0s"], "--interval: not a Prometheus duration"),
        ([], "the following arguments are required: --target"),
    ],
)
def test_prometheus_config_refuses_bad_flags(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prometheus-config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: genrm-trio prometheus-config [-h]")
    line = captured.err.splitlines()[-1]
    assert line.startswith("genrm-trio prometheus-config: error: ")
    assert error in line, line


def test_the_files_ship_as_package_data() -> None:
    pyproject = (HERE.parent / "pyproject.toml").read_text()
    for name in ("grafana-dashboard.json", RULES_FILE):
        assert f'"app/monitoring/{name}"' in pyproject
        assert (HERE.parent / "genrm_trio" / "app" / "monitoring" / name).is_file()


def test_a_missing_prometheus_fails_instead_of_skipping_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """.ci/run sets GENRM_TRIO_REQUIRE_PROMETHEUS: there a missing binary is a failure."""
    import prom

    monkeypatch.setattr(prom.shutil, "which", lambda name: None)
    monkeypatch.delenv(prom.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception):
        prom.binary("promtool")
    monkeypatch.setenv(prom.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="must be installed"):
        prom.binary("promtool")
    assert f"export {prom.REQUIRE_ENV}=1" in (HERE.parent / ".ci" / "run").read_text()
