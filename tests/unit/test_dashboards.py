"""deploy/grafana/: no Grafana server runs here, so the dashboard is checked as a document. The committed JSON is
what deploy/grafana/dashboard.py generates; it has the shape Grafana loads (panels on a 24-column grid, each query
on the `datasource` variable); each query parses (`promtool check rules`); it shows what an operator looks at.
That every query runs on a real Prometheus scraping a real proxy, and names only served metrics:
e2e/test_dashboards.py."""

import importlib.util
import json
import subprocess
import sys

import pytest
import yaml
from support.prometheus import DASHBOARD, DEPLOY, PROMTOOL, as_prometheus_query, dashboard_queries, need

from tests.conftest import IN_CI

GENERATOR = DEPLOY / "grafana" / "dashboard.py"
PANEL_TYPES = {"row", "timeseries", "stat"}


@pytest.fixture(scope="module")
def board() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_committed_dashboard_is_the_generated_one():
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("grafana-foundation-sdk is not installed (pip install -e '.[test]')", pytrace=False)
        pytest.skip("grafana-foundation-sdk is not installed")
    spec = importlib.util.spec_from_file_location("receipts_dashboard", GENERATOR)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    sys.modules["receipts_dashboard"] = generator
    spec.loader.exec_module(generator)
    assert DASHBOARD.read_text() == generator.render(), "run: python deploy/grafana/dashboard.py"


def test_the_dashboard_has_the_shape_grafana_loads(board):
    assert board["uid"] == "receipts-overview" and board["title"] == "receipts"
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    [variable] = board["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource", "prometheus")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        assert p["type"] in PANEL_TYPES, p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        covered = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not covered & cells, f"{p['title']} overlaps another panel"
        cells |= covered
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_every_query_parses(tmp_path):
    """promtool parses each query as the expression of a recording rule, with Grafana's variables filled in."""
    rules = [{"record": f"panel:query_{i}", "expr": as_prometheus_query(expr)} for i, (_t, expr) in enumerate(dashboard_queries())]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([need(PROMTOOL), "check", "rules", str(tmp_path / "queries.yml")], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_the_dashboard_shows_what_an_operator_looks_at(board):
    """Writes by state and by host, open and unknown receipts and their ages, refusals and replays, reconcile
    verdicts, journal latency, approvals, instances."""
    exprs = " ".join(expr for _title, expr in dashboard_queries())
    for must in (
        "sum by (state) (rate(receipts_writes_total", "sum by (host) (rate(receipts_writes_total",
        "receipts_oldest_age_seconds", 'receipts_by_state{job="receipts", state=~"outcome_unknown|reconciling|manual_review"}',
        "rate(receipts_duplicates_total", "rate(receipts_journal_unavailable_total", "rate(receipts_reconcile_verdicts_total",
        "receipts_journal_seconds_bucket", "receipts_verdict_seconds_bucket", "receipts_approvals_pending",
        "receipts_approval_wait_ratio", "up{", "receipts_proxy_instances",
    ):  # fmt: skip
        assert must in exprs, must
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Writes", "Open and unknown receipts", "Refusals and replays", "Reconcile", "Journal", "Approvals", "Instances"]


def test_the_provisioning_points_grafana_at_the_dashboard_and_prometheus():
    [source] = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090" and source["isDefault"]
    [provider] = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/receipts.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/etc/grafana/dashboards"
