"""deploy/prometheus/: the alert rules pass `promtool test rules`, each alert has a case that fires it and one that
must not (shown by breaking the alert both ways), each says what to do, and the compose scrape config is valid.
Against a real proxy and a real Prometheus: e2e/test_dashboards.py."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.prometheus import ALERT_TESTS, ALERTS, PROMTOOL, REPO, SCRAPE_CONFIG, alert_rules, need

OPERATIONS = REPO / "docs" / "operations.md"
NEVER = "vector(0) > 1"  # an expression that never returns anything
COMPARISON = re.compile(r"\s*(>=|<=|==|>|<)\s*[\d.]+$")


def promtool_test(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([need(PROMTOOL), "test", "rules", "alerts_test.yml"], cwd=directory, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def cases() -> dict[str, dict[str, list[str]]]:
    """Per alert: the names of the test groups that expect it to fire, and of those that expect it quiet."""
    found: dict[str, dict[str, list[str]]] = {}
    for group in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for check in group.get("alert_rule_test", []):
            kind = "fires" if check.get("exp_alerts") else "quiet"
            names = found.setdefault(check["alertname"], {"fires": [], "quiet": []})[kind]
            if group["name"] not in names:
                names.append(group["name"])
    return found


def with_expr(tmp_path: Path, alert: str, change) -> Path:
    """A copy of the rules and their tests in `tmp_path`, with `alert`'s expression changed."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == alert:
                rule["expr"] = change(rule["expr"])
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yml")
    return tmp_path


def test_the_rules_pass_their_promtool_tests():
    checked = subprocess.run([need(PROMTOOL), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    run = promtool_test(ALERT_TESTS.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout + run.stderr


def test_every_alert_has_a_case_that_fires_it_and_one_that_must_not():
    names = {r["alert"] for r in alert_rules()}
    found = cases()
    assert set(found) == names
    assert not [alert for alert, kinds in found.items() if not (kinds["fires"] and kinds["quiet"])]


@pytest.mark.parametrize("alert", [r["alert"] for r in alert_rules()])
def test_each_alert_s_cases_can_fail(alert, tmp_path):
    """Made never to fire, its firing case fails; with its threshold gone (fires on any series), a quiet case fails."""
    kinds = cases()[alert]
    [expr] = [r["expr"] for r in alert_rules() if r["alert"] == alert]
    assert COMPARISON.search(expr), f"{alert}: no threshold at the end of its expression"
    for broken, change, expected in (("never", lambda _e: NEVER, kinds["fires"]), ("always", lambda e: COMPARISON.sub("", e), kinds["quiet"])):
        (tmp_path / broken).mkdir()
        run = promtool_test(with_expr(tmp_path / broken, alert, change))
        output = run.stdout + run.stderr
        assert run.returncode != 0 and any(f"name: {name}," in output for name in expected), f"{alert} {broken}: {output[-800:]}"


def test_each_alert_says_what_it_is_and_what_to_do():
    docs = OPERATIONS.read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", docs, re.M)}
    for rule in alert_rules():
        name, notes = rule["alert"], rule["annotations"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert notes["summary"] and notes["description"], name
        runbook = notes["runbook"]
        target, _, todo = runbook.partition(": ")
        assert target == f"docs/operations.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"
        assert "`receipts " in todo or "`curl " in todo or "`docker " in todo, f"{name}: no command to run"


def test_the_compose_scrape_config_is_valid(tmp_path):
    """deploy/prometheus/prometheus.yml as compose mounts it: its rule file beside it, its token file a secret."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    [job] = config["scrape_configs"]
    assert job["job_name"] == "receipts"  # the rules and the panels select it
    assert job["authorization"]["credentials_file"] == "/run/secrets/receipts_admin_token"
    token = tmp_path / "token"
    token.write_text("0123456789abcdef")
    job["authorization"]["credentials_file"] = str(token)
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = subprocess.run([need(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
