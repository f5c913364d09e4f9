"""The shipped operational files: Prometheus alert rules (checked and unit-tested with
promtool, from Debian's `prometheus` package) and the Grafana dashboard.

That every metric they query is really exported is checked against live processes in
tests/test_observe.py; here, against what the exporter declares.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import prometheus_client
import pytest

from tenure import metrics
from tenure.exec.textfile import write_last_run
from tenure.observability import exporter as observe
from tests.support.env import ROOT

ALERTS = ROOT / "deploy/prometheus/alerts.yml"
ALERTS_TEST = ROOT / "deploy/prometheus/alerts_test.yml"
DASHBOARD = ROOT / "deploy/grafana/tenure.json"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian package `prometheus`: "
    "apt-get install -y --no-install-recommends prometheus)",
)


def rule_exprs(text: str) -> dict[str, str]:
    """``{alert name: expr}`` from a rules file whose exprs are block scalars (``expr: |``)."""
    found: dict[str, str] = {}
    lines = text.splitlines()
    alert = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        named = re.match(r"^\s*- alert:\s*(\S+)", line)
        if named:
            alert = named.group(1)
        expr = re.match(r"^(\s*)expr:\s*(.*)$", line)
        i += 1
        if not expr:
            continue
        indent, rest = len(expr.group(1)), expr.group(2).strip()
        if rest not in ("|", "|-", ">", ">-"):
            found[alert] = rest
            continue
        block = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            block.append(lines[i].strip())
            i += 1
        found[alert] = "\n".join(block).strip()
    return found


def queried_metrics(text: str) -> set[str]:
    return set(re.findall(r"\btenure_[a-z0-9_]+\b", text))


def queried_labels(promql: str) -> set[str]:
    """Label names PromQL groups or matches on (``by``/``on``/... lists, selectors)."""
    found: set[str] = set()
    clauses = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
    for names in re.findall(clauses, promql):
        found |= {n.strip() for n in names.split(",") if n.strip()}
    for selector in re.findall(r"\{([^{}]*)\}", promql):
        found |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return found


def printed_labels(template: str) -> set[str]:
    """Label names a Grafana legend (``{{label}}``) or an alert annotation
    (``{{ $labels.label }}``) prints."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", template)) | set(
        re.findall(r"\$labels\.(\w+)", template)
    )


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def dashboard_legends() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t.get("legendFormat", "") for p in dashboard["panels"] for t in p.get("targets", [])]


def test_label_helpers_find_what_rules_and_legends_use() -> None:
    """Guard: the label checks in test_observe see the labels, not nothing."""
    expr = 'sum by (job_key, site) (x{outcome="a", topic=~"b"}) unless on (job) y'
    assert queried_labels(expr) == {"job_key", "site", "outcome", "topic", "job"}
    assert printed_labels("{{job_key}} {{ site }}; {{ $labels.instance }}") == {
        "job_key",
        "site",
        "instance",
    }
    assert "job_key" in queried_labels("\n".join(rule_exprs(ALERTS.read_text()).values()))
    assert "job_key" in printed_labels(ALERTS.read_text())
    assert "job_key" in printed_labels("\n".join(dashboard_legends()))


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", str(ALERTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rule_exprs(ALERTS.read_text()))} rules found" in out.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    out = promtool("test", "rules", str(ALERTS_TEST))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    alerts = set(rule_exprs(ALERTS.read_text()))
    assert {
        "TenureStaleTokenRejected",
        "TenureLeaseLost",
        "TenureLeaseRenewalErrors",
        "TenureOutboxBacklog",
        "TenureJobNoRecentSuccess",
        "TenureJobQuarantined",
        "TenureExecSlotUnrecorded",
    } <= alerts
    tests = ALERTS_TEST.read_text()
    # An `alertname: X` followed (before the next alertname) by a non-empty exp_alerts.
    fired = set(
        re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels:", tests, flags=re.MULTILINE)
    )
    assert alerts - fired == set(), "alerts without a promtool test that fires them"
    quiet = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]", tests))
    assert alerts - quiet == set(), "alerts without a promtool test where they stay quiet"


@needs_promtool
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("> 600", "> 6000"),  # the backlog threshold
        ("> 3 * max", "> 4 * max"),  # N slots
        ("severity: warning", "severity: page"),
        ("[15m]", "[1m]"),  # the stale-rejection window
        ("(tenure_job_quarantined) == 1", "(tenure_job_quarantined) == 2"),
        ('{outcome="slot_unrecorded"}', '{outcome="failed"}'),
        # One alert per job key, whatever scrape jobs export it; the label is job_key.
        (
            "max by (job_key) (tenure_job_quarantined)",
            "max by (job, job_key) (tenure_job_quarantined)",
        ),
        ("sum by (job_key, site)", "sum by (exported_job, site)"),
    ],
)
def test_the_unit_tests_notice_a_changed_rule(tmp_path: Path, old: str, new: str) -> None:
    """Guard: the promtool tests pin the rules' behaviour, they do not merely run them."""
    text = ALERTS.read_text()
    assert old in text
    (tmp_path / "alerts.yml").write_text(text.replace(old, new, 1))
    shutil.copy(ALERTS_TEST, tmp_path / "alerts_test.yml")
    out = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert out.returncode != 0, out.stdout


def _declared(tmp: Path) -> set[str]:
    """Sample names the exporter can produce: the sink's families and the database
    collector's, with the suffixes Prometheus exposes; and what `tenure exec
    --metrics-textfile` writes for node_exporter."""
    registry = prometheus_client.CollectorRegistry()
    unsubscribe = metrics.install_prometheus(registry)
    unsubscribe()
    families = list(registry.collect())
    # Describing needs no connection: the Database only parses its DSN here.
    unused = observe.Database("postgresql://nobody@127.0.0.1:1/none", "tenure")
    families += observe.DatabaseCollector(unused).describe()
    out: set[str] = set()
    for family in families:
        if family.type == "counter":
            out |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            out |= {family.name + s for s in ("_bucket", "_count", "_sum", "_created")}
        else:
            out.add(family.name)
    textfile = tmp / "job.prom"
    write_last_run(textfile, "job", "succeeded", 0, 0.1, token=1)
    out |= {
        line.split("{", 1)[0]
        for line in textfile.read_text().splitlines()
        if line and not line.startswith("#")
    }
    return out


def test_queried_metrics_are_declared_by_the_exporter(tmp_path: Path) -> None:
    declared = _declared(tmp_path)
    in_rules = queried_metrics("\n".join(rule_exprs(ALERTS.read_text()).values()))
    in_dashboard = queried_metrics("\n".join(dashboard_exprs()))
    assert in_rules and in_dashboard
    assert in_rules - declared == set()
    assert in_dashboard - declared == set()


def test_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tenure-overview" and dashboard["title"] == "tenure"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    [variable] = dashboard["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            # Low-cardinality labels only: nothing selects on an owner or a token.
            assert "owner" not in target["expr"] and "token=" not in target["expr"]
