"""`preset: stripe` against localstripe (a stateful Stripe server nobody here wrote, from PyPI), with no rule
written by hand: `receipts rules check` proves each read rule the writes used (positive and negative controls);
a write localstripe committed whose answer was lost ends `succeeded` with localstripe's id; one it never received
ends `safe_to_retry` where the preset says retry is safe, else `manual_review`; and the agent's retry is
forwarded exactly when the verdict allows it.
"""

import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import parse_qsl

import httpx
import pytest
from support.e2e import stop_process, tag, wait_for
from support.presets import PresetWorld, preset_world
from support.server import free_port, listens

KEY = "sk_test_receipts"
AUTH = {"Authorization": f"Bearer {KEY}"}

# operation: (path, the form of a write tagged `t`, what a never-received write ends as)
CREATES = {
    "stripe.customers.create": ("/v1/customers", lambda t: {"email": f"{t}@example.com", "name": f"Ann {t}"}, "safe_to_retry"),
    "stripe.products.create": ("/v1/products", lambda t: {"name": f"Widget {t}", "metadata[sku]": t}, "safe_to_retry"),
    "stripe.payment_intents.create": (
        "/v1/payment_intents", lambda t: {"amount": "2000", "currency": "usd", "metadata[order]": t}, "manual_review",
    ),
}


@pytest.fixture(scope="module")
def localstripe(tmp_path_factory) -> Iterator[int]:
    port = free_port()
    log = open(tmp_path_factory.mktemp("localstripe") / "log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "localstripe", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: proc.poll() is not None or listens(proc.pid, port), 30) and proc.poll() is None, "localstripe did not start"
        yield port
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture(scope="module")
def world(localstripe, tmp_path_factory) -> Iterator[PresetWorld]:
    mp = pytest.MonkeyPatch()
    mp.setenv("STRIPE_API_KEY", KEY)  # the reconciler's key: the preset's reads name ${STRIPE_API_KEY}
    try:
        with preset_world("stripe", localstripe, tmp_path_factory.mktemp("stripe")) as w:
            yield w
    finally:
        mp.undo()


def on_stripe(localstripe: int, path: str, form: dict[str, str]) -> list[dict]:
    """The objects localstripe holds with the write's fields, read from it directly (not through the proxy)."""
    listed = httpx.get(f"http://127.0.0.1:{localstripe}{path}?limit=100", headers=AUTH).json()["data"]
    fields = {k: v for k, v in form.items() if "[" not in k}
    return [o for o in listed if all(str(o.get(k)) == v for k, v in fields.items()) and _metadata(form) <= o["metadata"].items()]


def _metadata(form: dict[str, str]) -> set[tuple[str, str]]:
    return {(k[len("metadata["):-1], v) for k, v in form.items() if k.startswith("metadata[")}


def same_body(form: dict[str, str]):
    return lambda m, _t, body: m == "POST" and dict(parse_qsl(body.decode())) == form


@pytest.mark.parametrize("operation", list(CREATES))
def test_an_unknown_create_settles_by_the_preset_alone(world, localstripe, operation, capsys, monkeypatch):
    path, form_of, never_received_ends = CREATES[operation]
    t = tag()
    known = world.succeeded("POST", path, data=form_of(f"known-{t}"), headers=AUTH)
    lost = form_of(f"lost-{t}")
    lost_op = world.lost_answer("POST", path, data=lost, headers=AUTH)
    unseen = form_of(f"unseen-{t}")
    unseen_op = world.never_received("POST", path, data=unseen, headers=AUTH)
    (committed,) = on_stripe(localstripe, path, lost)
    assert on_stripe(localstripe, path, unseen) == []

    health = world.rules_check(capsys, monkeypatch)[operation]
    assert (health["proven"], health["positive"]["result"], health["negative"]["result"]) == (True, "passed", "passed"), health
    assert health["positive"]["evidence"]["matched_id"] == known.external_id

    world.reconcile()
    lost_receipt, unseen_receipt = world.store.receipts.get(lost_op), world.store.receipts.get(unseen_op)
    assert (lost_receipt.state, lost_receipt.external_id) == ("succeeded", committed["id"]), world.store.receipts.history(lost_op)[-1].detail
    assert unseen_receipt.state == never_received_ends, world.store.receipts.history(unseen_op)[-1].detail

    # the agent's retries: forwarded exactly when the verdict allows it
    world.send("POST", path, data=lost, headers=AUTH)
    world.send("POST", path, data=unseen, headers=AUTH)
    assert world.forwarded(same_body(lost)) == 1 and len(on_stripe(localstripe, path, lost)) == 1
    retried = never_received_ends == "safe_to_retry"
    assert world.forwarded(same_body(unseen)) == (1 if retried else 0)
    assert len(on_stripe(localstripe, path, unseen)) == (1 if retried else 0)


def test_an_unknown_delete_settles_by_the_preset_alone(world, localstripe, capsys, monkeypatch):
    def customer() -> str:
        return httpx.post(f"http://127.0.0.1:{localstripe}/v1/customers", data={"name": tag()}, headers=AUTH).json()["id"]

    known, gone, kept = customer(), customer(), customer()
    world.succeeded("DELETE", f"/v1/customers/{known}", headers=AUTH)
    gone_op = world.lost_answer("DELETE", f"/v1/customers/{gone}", headers=AUTH)
    kept_op = world.never_received("DELETE", f"/v1/customers/{kept}", headers=AUTH)

    health = world.rules_check(capsys, monkeypatch)["stripe.customers.delete"]
    assert (health["proven"], health["positive"]["result"], health["negative"]["result"]) == (True, "passed", "passed"), health

    world.reconcile()
    assert world.store.receipts.get(gone_op).state == "succeeded"
    assert world.store.receipts.get(kept_op).state == "safe_to_retry"  # still there: the delete did not happen
    world.send("DELETE", f"/v1/customers/{kept}", headers=AUTH)
    assert httpx.get(f"http://127.0.0.1:{localstripe}/v1/customers/{kept}", headers=AUTH).status_code == 404
