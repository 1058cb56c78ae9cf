"""The review page in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright): a receipt
made through the real proxy is listed, opened (the request as journaled, its timeline), and a person settles it
with a note.

scripts/ensure-chromium installs the browser (`make test` runs it); Playwright never downloads one here.
A screenshot of the settled receipt is written to tests/artifacts/admin.png for a person to look at, and one of the
page's header (the journal at a glance) to tests/artifacts/review-glance.png.
"""

import asyncio
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from support.e2e import settled, settled_history
from support.proxy import start_inprocess_proxy
from support.server import free_port
from support.upstream import start_upstream

from proxy_addon.config import load_config
from proxy_addon.reconcile.worker import Reconciler
from tests.conftest import IN_CI, migrate

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
NOTE = "Checked the payment provider's dashboard: charge ch_4711 exists, created once at 14:02."


def _need_browser():
    problem = None
    if not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} is missing (scripts/ensure-chromium installs it)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed (pip install -e '.[test]')"
    if problem:
        if IN_CI:
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)


@pytest.fixture
def admin_proxy(sqlite_url, tmp_path):
    """A real proxy whose `running` hook started the admin server (admin.enabled), and a real upstream."""
    yield from _admin_proxy(sqlite_url, tmp_path, approval=False)


@pytest.fixture
def approval_proxy(sqlite_url, tmp_path):
    """As admin_proxy, its upstream's writes needing a person's approval."""
    yield from _admin_proxy(sqlite_url, tmp_path, approval=True)


def _admin_proxy(sqlite_url, tmp_path, approval: bool):
    migrate(sqlite_url)
    upstream = start_upstream()
    port = free_port()
    config = tmp_path / "config.yaml"
    hosts = f'hosts:\n  "127.0.0.1:{upstream.port}": {{approval: required}}\n' if approval else ""
    config.write_text(f"secret_file: {tmp_path / 'secret'}\nadmin: {{enabled: true, listen_port: {port}}}\n{hosts}")
    proxy = start_inprocess_proxy(config, sqlite_url, tmp_path / "confdir")
    admin_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(admin_url + "/openapi.json", timeout=1, trust_env=False).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    pytest.fail("the proxy's admin server did not answer within 15 s")
                time.sleep(0.1)
        yield proxy, upstream, admin_url, load_config(config)
    finally:
        proxy.stop()
        upstream.stop()


def test_a_person_settles_an_unknown_receipt_in_the_browser(admin_proxy):
    _need_browser()
    from playwright.sync_api import expect, sync_playwright

    proxy, upstream, admin_url, config = admin_proxy
    store = proxy.addon.store
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as agent:
        answer = agent.post(f"{upstream.base}/status/503/charges?attempt=1", json={"amount": 4200, "currency": "EUR"},
                            headers={"Authorization": "Bearer sk_live_browser"})
    assert answer.status_code == 504
    op = answer.headers["X-Receipt-Id"]
    assert settled(store, op).state == "outcome_unknown"
    report = asyncio.run(Reconciler(config, store, worker_id="test-reconciler").run_once())
    assert report.claimed == 1 and settled(store, op).state == "manual_review"  # no rule names it: a person decides

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            page.goto(admin_url + "/")
            row = page.locator("#receipts tbody tr", has_text=op)
            expect(row).to_have_count(1)
            expect(row).to_contain_text("manual_review")
            expect(row).to_contain_text("POST /status/503/charges")
            page.screenshot(path=str(ARTIFACTS / "admin-list.png"), full_page=True)

            row.get_by_role("link", name=op).click()
            expect(page.locator("h1")).to_contain_text(f"127.0.0.1:{upstream.port}")
            # the request as journaled, on the page where the person decides: URL, headers, the body pretty-printed
            request = page.locator("#request")
            expect(request).to_contain_text(f"POST http://127.0.0.1:{upstream.port}/status/503/charges?attempt=1")
            expect(page.locator("#request-headers")).to_contain_text("authorization")
            expect(page.locator("#request-headers")).to_contain_text("[REDACTED]")
            expect(page.locator("#request-body")).to_have_text('{\n  "amount": 4200,\n  "currency": "EUR"\n}')
            expect(page.locator("#request-body-summary")).to_contain_text("JSON")
            assert "sk_live_browser" not in page.content()
            expect(page.locator("#timeline li")).to_have_count(5)  # planned submitted unknown reconciling review
            page.get_by_label("it happened (succeeded)").check()
            page.get_by_label("Note (kept in the history)").fill(NOTE)
            page.get_by_label("External id (optional)").fill("ch_4711")
            page.get_by_label("Your name (optional)").fill("Ana (on call)")
            page.screenshot(path=str(ARTIFACTS / "admin-form.png"), full_page=True)
            page.get_by_role("button", name="Resolve").click()

            expect(page.get_by_role("status")).to_contain_text("Resolved")
            expect(page.locator("#state")).to_have_text("succeeded")
            last = page.locator("#timeline li").last
            expect(last).to_contain_text(NOTE)
            expect(last).to_contain_text("person:Ana (on call)")
            expect(page.locator("#resolve")).to_have_count(0)  # settled: no form any more
            page.screenshot(path=str(ARTIFACTS / "admin.png"), full_page=True)
        finally:
            browser.close()

    after = settled(store, op)
    assert after.state == "succeeded" and after.external_id == "ch_4711"
    last = settled_history(store, op)[-1]
    assert (last.from_state, last.to_state) == ("manual_review", "succeeded") and last.detail["note"] == NOTE
    assert (ARTIFACTS / "admin.png").stat().st_size > 10_000


def test_a_person_approves_a_waiting_write_in_the_browser(approval_proxy):
    _need_browser()
    from playwright.sync_api import expect, sync_playwright

    proxy, upstream, admin_url, _config = approval_proxy
    store = proxy.addon.store
    url = f"{upstream.base}/refunds?order=88"
    body, secret = {"order": 88, "amount": 1999}, {"Authorization": "Bearer sk_live_approval"}
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as agent:
        for _ in range(2):
            asked = agent.post(url, json=body, headers=secret)
            assert asked.status_code == 403 and asked.json()["type"].endswith("approval-required")
        approval_id = asked.json()["approval_id"]
        assert upstream.count("POST") == 0

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(15_000)
                page.goto(admin_url + "/")
                page.get_by_role("link", name="Approvals").click()
                card = page.locator(f"#{approval_id}")
                expect(card).to_contain_text(f"POST http://127.0.0.1:{upstream.port}/refunds?order=88")
                expect(card.locator(".operation")).to_have_text("POST 127.0.0.1 /refunds")
                expect(card.locator(".asked")).to_have_text("2")
                expect(card.locator(".account")).to_have_text(store.approvals.get(approval_id).account)
                expect(page.locator(f"#{approval_id}-headers")).to_contain_text("[REDACTED]")
                expect(page.locator(f"#{approval_id}-body")).to_have_text('{\n  "amount": 1999,\n  "order": 88\n}')
                assert "sk_live_approval" not in page.content()
                card.get_by_label("Note (kept with the approval)").fill("Refund 88 matches the ticket")
                card.get_by_label("Your name (optional)").fill("Ana")
                card.get_by_role("button", name="Approve").click()
                expect(page.get_by_role("status")).to_contain_text("approved")
                expect(page.locator(f"#{approval_id}")).to_have_count(0)  # no longer in the queue
                page.screenshot(path=str(ARTIFACTS / "admin-approvals.png"), full_page=True)

                forwarded = agent.post(url, json=body, headers=secret)
                assert forwarded.status_code == 201 and upstream.count("POST") == 1
                page.reload()
                past = page.locator(f"#past-{approval_id}")
                expect(past).to_contain_text("used")
                expect(past).to_contain_text("Ana")
                expect(past).to_contain_text("Refund 88 matches the ticket")
                expect(past.get_by_role("link", name=forwarded.headers["x-receipt-id"])).to_have_count(1)
            finally:
                browser.close()
    decided = store.approvals.get(approval_id)
    assert (decided.state, decided.decided_by, decided.operation_id) == ("used", "Ana", forwarded.headers["x-receipt-id"])


def test_the_review_page_shows_the_journal_at_a_glance(admin_proxy, sqlite_url, tmp_path):
    """The header: counts by state, the oldest open and unknown receipts' ages; the chart: the last hour's writes by
    outcome, drawn on the server. An hour of history (bench/core/seeding.py: one receipt every 2 s), then writes
    through the real proxy: successes, a rejection, unknowns (one sent to a person by the reconciler).
    RECEIPTS_DOCS_IMAGES=1 also writes the screenshot docs/operations.md shows (docs/images/review-glance.png)."""
    _need_browser()
    from playwright.sync_api import expect, sync_playwright

    from bench.core.seeding import seed

    proxy, upstream, admin_url, config = admin_proxy
    store = proxy.addon.store
    assert seed(sqlite_url, 1800, upstream.port, 120)["seeded"] == 1800
    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=10) as agent:
        for n in range(2):
            assert agent.post(f"{upstream.base}/location/orders", json={"n": n}).status_code == 201
        assert agent.post(f"{upstream.base}/status/422/orders", json={"n": 9}).status_code == 422
        review = agent.post(f"{upstream.base}/status/503/charges/1", json={"n": 1})
        assert review.status_code == 504 and settled(store, review.headers["X-Receipt-Id"]).state == "outcome_unknown"
        asyncio.run(Reconciler(config, store, worker_id="test-reconciler").run_once())  # no rule: to a person
        unknown = agent.post(f"{upstream.base}/status/503/charges/2", json={"n": 2})
    assert unknown.status_code == 504 and settled(store, unknown.headers["X-Receipt-Id"]).state == "outcome_unknown"
    stats = store.retention.stats()
    assert stats.by_state["manual_review"] == 1 and stats.by_state["outcome_unknown"] == 1
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.set_default_timeout(15_000)
            before = _last_hour(store)  # counted apart from the page's code, before and after it counted
            page.goto(admin_url + "/")
            after = _last_hour(store)
            counts = page.locator("#counts")
            for state, n in stats.by_state.items():
                expect(counts.locator(f'[data-state="{state}"] b')).to_have_text(str(n))
            expect(page.locator("#open-total b")).to_have_text("2")
            expect(page.locator("#unknown-total b")).to_have_text("2")
            expect(page.locator("#oldest-unknown b")).not_to_have_text("-")
            drawn = page.eval_on_selector_all(
                "#writes-chart rect[data-state]", "rects => rects.map(r => [r.dataset.state, Number(r.dataset.count)])"
            )
            by_state: dict[str, int] = {}
            for state, n in drawn:
                by_state[state] = by_state.get(state, 0) + n
            assert by_state.keys() == {"succeeded", "rejected", "outcome_unknown", "manual_review"}
            for state, n in by_state.items():  # the hour's edge moved on while the page was made: between the two
                assert after.get(state, 0) <= n <= before.get(state, 0), (state, n, before, after)
            assert by_state["manual_review"] == 1 and by_state["outcome_unknown"] == 1
            assert page.locator("#writes-chart .bar").count() == 12
            expect(page.locator('#writes-legend [data-state="manual_review"]')).to_contain_text("manual_review 1")
            shot = tmp_path / "review-glance.png"
            page.screenshot(path=str(shot))
            shutil.copy(shot, ARTIFACTS / "review-glance.png")
            if os.environ.get("RECEIPTS_DOCS_IMAGES"):
                DOCS_IMAGES.mkdir(exist_ok=True)
                shutil.copy(shot, DOCS_IMAGES / "review-glance.png")
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000


def _last_hour(store) -> dict[str, int]:
    """Receipts created in the last hour by state, by plain SQL."""
    since = (datetime.now(UTC) - timedelta(hours=1)).replace(tzinfo=None).isoformat(sep=" ")
    with store.engine.connect() as conn:
        return dict(conn.execute(text("SELECT state, COUNT(*) FROM receipts WHERE created_at >= :s GROUP BY state"), {"s": since}).all())
