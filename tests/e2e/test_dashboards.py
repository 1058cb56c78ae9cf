"""The alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard (deploy/grafana/) against a real
proxy: every metric name they use is served by its /metrics after mixed traffic, and a real Prometheus (Debian's
/usr/bin/prometheus) scraping it sees the series, runs every panel's query without error, and takes an alert from
inactive to firing when an unknown receipt outlives a threshold set low for the test."""

import re

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.prometheus import ALERTS, as_prometheus_query, dashboard_queries, metric_names_used, poll, start_prometheus
from support.proxy import start_inprocess_proxy
from support.server import free_port
from support.upstream import start_upstream

from tests.conftest import migrate


class GlanceWorld:
    """A real proxy serving its admin server where `receipts_admin_listen` says, a real upstream, and a second
    one whose writes need a person's approval."""

    def __init__(self, sqlite_url: str, tmp_path, monkeypatch):
        monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
        migrate(sqlite_url)
        self.upstream, self.guarded = start_upstream(), start_upstream()
        self.admin_port = free_port()
        config = tmp_path / "config.yaml"
        config.write_text(
            f"secret_file: {tmp_path / 'secret'}\n"
            f'hosts:\n  "127.0.0.1:{self.guarded.port}": {{approval: {{required: true, expires: 1h}}}}\n'
        )
        self.proxy = start_inprocess_proxy(
            config, sqlite_url, tmp_path / "confdir", receipts_admin_listen=f"127.0.0.1:{self.admin_port}"
        )
        self.agent = httpx.Client(proxy=self.proxy.url, trust_env=False, timeout=10)
        poll(self._admin_answers, 15, "the proxy's admin server")

    @property
    def admin(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    def _admin_answers(self) -> bool:
        try:
            return httpx.get(f"http://{self.admin}/metrics", timeout=1, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    def write(self, path: str, upstream=None, **body) -> httpx.Response:
        return self.agent.post(f"{(upstream or self.upstream).base}{path}", json=body or {"n": 1})

    def mixed_traffic(self) -> None:
        """Successes, a replay, a rejection, an unknown and its refused retry, a write held for approval."""
        for n in range(3):
            assert self.write("/location/things", n=n).status_code == 201
        assert self.write("/location/things", n=0).status_code == 201  # replayed from the first
        assert self.write("/status/422/things").status_code == 422
        assert self.write("/status/503/charges").status_code == 504
        assert self.write("/status/503/charges").status_code == 409
        assert self.write("/payouts", self.guarded).status_code == 403  # approval-required, pending

    def scrape(self) -> dict[str, dict[tuple, float]]:
        """Sample name -> labels -> value."""
        body = httpx.get(f"http://{self.admin}/metrics", timeout=10, trust_env=False).text
        samples: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        return samples

    def close(self) -> None:
        self.agent.close()
        self.proxy.stop()
        assert not self.proxy.thread.is_alive(), "the proxy did not stop"
        self.upstream.stop()
        self.guarded.stop()


@pytest.fixture
def world(sqlite_url, tmp_path, monkeypatch):
    w = GlanceWorld(sqlite_url, tmp_path, monkeypatch)
    try:
        yield w
    finally:
        w.close()


def test_every_metric_the_rules_and_the_dashboard_use_is_served_after_mixed_traffic(world):
    before = world.scrape()  # the counters are this process's, which other tests' proxies may have counted in
    world.mixed_traffic()
    served = world.scrape()
    used = metric_names_used()
    assert len(used) >= 15  # the test reads the rules and panels it means to
    missing = {name: where for name, where in used.items() if name != "up" and name not in served}
    assert not missing, f"used but not served: {missing}"

    def grew(name: str, **labels: str) -> float:
        key = tuple(sorted(labels.items()))
        return served[name].get(key, 0) - before.get(name, {}).get(key, 0)

    writes = {s: grew("receipts_writes_total", host="127.0.0.1", state=s) for s in ("succeeded", "rejected", "outcome_unknown")}
    assert writes == {"succeeded": 3, "rejected": 1, "outcome_unknown": 1}  # the replay and the refusal are not writes
    assert sum(served["receipts_writes_total"].values()) - sum(before.get("receipts_writes_total", {}).values()) == 5
    assert grew("receipts_duplicates_total", reason="duplicate_open") == 1
    assert grew("receipts_duplicates_total", reason="duplicate_succeeded_replay") == 1
    assert grew("receipts_approvals_awaited_total", state="pending") == 1
    assert 0 < served["receipts_approval_wait_ratio"][()] < 0.01  # seconds of an hour's expiry
    assert served["receipts_proxy_instances"][(("status", "live"),)] == 1
    assert served["receipts_oldest_age_seconds"][(("state", "outcome_unknown"),)] > 0
    assert served["receipts_oldest_age_seconds"][(("state", "manual_review"),)] == 0


def _rules_with_low_threshold(tmp_path) -> tuple:
    """alerts.yml, with ReceiptsUnknownOutcomeTooOld's 30 minutes (and its 5 minutes' wait) made 1 second."""
    rules = yaml.safe_load(ALERTS.read_text())
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "ReceiptsUnknownOutcomeTooOld"]
    lowered = re.sub(r"> 1800$", "> 1", rule["expr"])
    assert lowered != rule["expr"], "the alert's threshold is no longer `> 1800`: update this test"
    rule["expr"], rule["for"] = lowered, "1s"
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(rules))
    return path, "ReceiptsUnknownOutcomeTooOld"


def test_a_real_prometheus_scrapes_the_proxy_runs_every_panel_and_fires_an_alert(world, tmp_path):
    rules, alert = _rules_with_low_threshold(tmp_path)
    prometheus = start_prometheus(tmp_path, [world.admin], [rules])
    try:
        assert poll(lambda: prometheus.alert_state(alert), 30, "the alert's first evaluation") == "inactive"
        world.mixed_traffic()  # makes an unknown receipt
        poll(lambda: prometheus.query('receipts_writes_total{job="receipts",state="outcome_unknown"} > 0'), 30,
             "the proxy's writes in Prometheus")
        poll(lambda: prometheus.alert_state(alert) == "firing", 60, "the alert to fire")
        [firing] = [a for a in prometheus.api("alerts")["alerts"] if a["labels"]["alertname"] == alert]
        assert firing["state"] == "firing" and firing["labels"] == {"alertname": alert, "job": "receipts", "severity": "warning"}
        assert firing["annotations"]["runbook"].startswith("docs/operations.md#receiptsunknownoutcometooold")

        for _title, expr in dashboard_queries():  # every panel's query runs on a real server (an error fails api())
            prometheus.query(as_prometheus_query(expr))
        seen = {s["metric"]["state"] for s in prometheus.query('max by (state) (receipts_by_state{job="receipts"} > 0)')}
        assert {"succeeded", "rejected", "outcome_unknown"} <= seen
    finally:
        prometheus.stop()
    assert prometheus.process.returncode is not None
