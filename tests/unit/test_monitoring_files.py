"""The alert rules and the Grafana dashboard gpuhost ships (monitoring/): the rules' own unit tests
under promtool, valid PromQL everywhere, and only metrics gpuhost writes (its family registry,
gpuhost/metrics/families.py, the one the renderer refuses anything else from)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuhost.metrics.families import FAMILIES

ROOT = Path(__file__).parents[2]
RULES = ROOT / "monitoring/prometheus/gpuhost-alerts.yml"
RULE_TESTS = ROOT / "monitoring/prometheus/gpuhost-alerts.test.yml"
DASHBOARD = ROOT / "monitoring/grafana/gpuhost-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing: the Debian package prometheus (./gpuhost-setup)"
)
KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
LABEL_VALUES = re.compile(r"^label_values\((?P<expr>.*),\s*(?P<label>\w+)\)$")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once strings, label matchers,
    ranges and grouping clauses are removed, that are neither a function nor a keyword."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = GROUPING.sub("", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("(") or match.group() in KEYWORDS:
            continue
        names.add(match.group())
    return names


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and the variables' queries."""
    found = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    for var in dashboard()["templating"]["list"]:
        if var["type"] == "query":
            match = LABEL_VALUES.match(var["query"]["query"])
            assert match, f"variable {var['name']}: a label_values(EXPR, LABEL) query"
            found.append(match["expr"])
    return found


def test_the_metric_name_reader_reads_promql():
    expr = (
        'max_over_time(gpuhost_a{x="b or c"}[1d]) unless on (host, guest) '
        'label_replace(gpuhost_b, "u", "$1", "m", "(.*)") or time() - gpuhost_c > 1200'
    )
    assert metric_names(expr) == {"gpuhost_a", "gpuhost_b", "gpuhost_c"}


def test_rules_and_dashboard_use_only_metrics_gpuhost_writes():
    used = {name: metric_names(expr) for name, expr in rule_exprs().items()}
    used |= {f"dashboard #{i}": metric_names(e) for i, e in enumerate(dashboard_exprs())}
    unknown = {
        where: names - set(FAMILIES) for where, names in used.items() if names - set(FAMILIES)
    }
    assert not unknown, f"not written by gpuhost (gpuhost/metrics/families.py): {unknown}"
    assert all(used.values()), "an expression without a metric"


def test_rule_tests_feed_gpuhost_metrics_with_their_labels():
    """The unit tests' input series are gpuhost's families with labels they really carry (up is
    the one stranger: the series that is there when gpuhost's are absent)."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for test in tests:
        for item in test["input_series"]:
            name, _, labels = item["series"].partition("{")
            keys = set(re.findall(r"(\w+)=", labels))
            if name == "up":
                continue
            assert name in FAMILIES, name
            assert keys == set(FAMILIES[name].labels), item["series"]


@needs_promtool
def test_alert_rules_pass_their_promtool_unit_tests():
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    done = subprocess.run(
        [PROMTOOL, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path: Path):
    """Each query, its Grafana variables given values, as a recording rule promtool parses."""
    rules = [
        {
            "record": f"gpuhost_dashboard_query_{i}",
            "expr": expr.replace("$host", "kpro6").replace("$guest", "ct200"),
        }
        for i, expr in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_has_a_row_per_host_and_a_panel_per_guest():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "host", "guest"} <= set(variables)
    assert variables["host"]["multi"] and variables["host"]["includeAll"]
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert len(rows) == 1 and rows[0]["repeat"] == "host" and rows[0]["title"] == "$host"
    guest = [p for p in board["panels"] if p.get("repeat") == "guest"]
    assert len(guest) == 1
    assert guest[0]["targets"][0]["expr"] == 'gpuhost_check_ok{host="$host",guest="$guest"}'
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    # every panel but the row reads its own host's metrics
    for panel in board["panels"][1:]:
        assert all('host="$host"' in t["expr"] for t in panel["targets"]), panel["title"]
