"""Debian's Prometheus in tests (scripts/ensure-prometheus installs it): the alert rules and the dashboard as
files, the metric names their PromQL uses, promtool, and a real `prometheus` server on a free loopback port with
its own config and data directory."""

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from support.server import free_port, listens
from tests.conftest import IN_CI

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "receipts.json"
PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"
# Grafana's own variables, as a Prometheus query would get them
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
METRIC = re.compile(r"\b(receipts_[a-z0-9_]+|up)\b")


def need(binary: str) -> str:
    """The binary's path; a missing one fails in CI and skips elsewhere (scripts/ensure-prometheus installs it)."""
    if shutil.which(binary) is None and not Path(binary).exists():
        problem = f"{binary} is missing (scripts/ensure-prometheus installs Debian's prometheus)"
        if IN_CI:
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    return binary


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    board = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def as_prometheus_query(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def metric_names_used() -> dict[str, list[str]]:
    """Each metric name (a sample's name, as scraped) the rules and the panels use -> where."""
    used: dict[str, list[str]] = {}
    sources = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    sources += [(f"panel {title!r}", expr) for title, expr in dashboard_queries()]
    for where, expr in sources:
        for name in METRIC.findall(expr):
            used.setdefault(name, []).append(where)
    return used


@dataclass
class PrometheusServer:
    """A real Prometheus scraping `targets` every second and evaluating `rule_files` every second."""

    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10, trust_env=False)
        document = answer.json()
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def alert_state(self, name: str) -> str | None:
        """`inactive` (evaluated, not active), `pending`, `firing`; None before its first evaluation."""
        for group in self.api("rules", type="alert")["groups"]:
            for rule in group["rules"]:
                if rule["name"] == name:
                    evaluated = not rule.get("lastEvaluation", "0001").startswith("0001")  # Go's zero time: not yet
                    return rule["state"] if evaluated and rule["health"] == "ok" else None
        raise AssertionError(f"no alert rule {name}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_prometheus(workdir: Path, targets: list[str], rule_files: list[Path]) -> PrometheusServer:
    """`prometheus` with a config of its own in `workdir` (job `receipts`, as the rules and panels expect)."""
    need(PROMETHEUS)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(f) for f in rule_files],
        "scrape_configs": [{"job_name": "receipts", "static_configs": [{"targets": targets}]}],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = workdir / "prometheus.log"
    process = subprocess.Popen(
        [PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = PrometheusServer(process, port, log)
    try:
        poll(lambda: process.poll() is not None or listens(process.pid, port), 30, "prometheus to listen")
        if process.poll() is not None:
            raise AssertionError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
        poll(lambda: _ready(server), 30, "prometheus to be ready")
    except BaseException:
        server.stop()
        raise
    return server


def _ready(server: PrometheusServer) -> bool:
    try:
        return httpx.get(f"{server.url}/-/ready", timeout=2, trust_env=False).status_code == 200
    except httpx.TransportError:
        return False


def poll(predicate: Callable[[], Any], seconds: float, what: str) -> Any:
    """The predicate's first truthy value, polled every 0.1 s for at most `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(0.1)
