"""The route modules' own logic (admin/routes/): the resolve body's checks, the error answers (problem+json for
the API, a page for people), logging in without a token, and the review form's failures shown on the page."""

import dataclasses

import pytest

from proxy_addon.admin.app import create_app
from proxy_addon.admin.routes.receipts import Resolution, resolution_fields
from proxy_addon.admin.routes.review import FORM_FIELDS
from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import BadRequestError, InvalidResolutionError
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from tests.conftest import migrate
from tests.support.store import intent, recorded, walk


@pytest.fixture
def store(sqlite_url):
    migrate(sqlite_url)
    engine = make_engine(sqlite_url)
    yield ReceiptStore(engine)
    engine.dispose()


@pytest.fixture
def client(store, tmp_path):
    return create_app(parse_config(f"secret_file: {tmp_path / 's'}"), store).test_client()


def test_resolution_fields():
    assert resolution_fields({"state": "succeeded", "note": "n"}) == {
        "state": "succeeded", "note": "n", "external_id": None, "who": None}
    assert resolution_fields({"state": "x", "note": None, "external_id": "e", "who": "w"})["who"] == "w"
    for body in (["a"], "text", None, 3):
        with pytest.raises(BadRequestError, match="JSON object"):
            resolution_fields(body)
    with pytest.raises(InvalidResolutionError, match=r"unknown field\(s\): a, z"):
        resolution_fields({"state": "succeeded", "z": 1, "a": 2})
    with pytest.raises(InvalidResolutionError, match="external_id must be a string"):
        resolution_fields({"state": "succeeded", "note": "n", "external_id": 5})
    assert list(Resolution.model_fields) == list(FORM_FIELDS)  # the API's body and the page's form: one set of fields


def test_error_answers(client):
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.mimetype == "application/problem+json" and r.get_json()["detail"] == "nothing at /nowhere"
    r = client.get("/ui/nowhere")
    assert r.status_code == 404 and r.mimetype == "text/html" and "Nothing at /ui/nowhere." in r.text
    r = client.delete("/receipts")
    assert r.status_code == 405 and r.get_json()["type"].endswith("method-not-allowed")
    r = client.get("/ui/receipts/op_nope")
    assert r.status_code == 404 and r.mimetype == "text/html"
    r = client.get("/receipts?limit=x")
    assert r.status_code == 400 and r.get_json()["title"] == "Bad request"


def test_without_a_token_login_and_logout_send_the_browser_on(client):
    r = client.get("/login?next=/ui/receipts/op_1")
    assert r.status_code == 302 and r.headers["Location"] == "/ui/receipts/op_1"
    r = client.get("/login?next=//evil.example")
    assert r.headers["Location"] == "/"


def made(store, target: State, **updates) -> str:
    op = recorded(store, dataclasses.replace(intent())).operation_id
    walk(store, op, target, **updates)
    return op


def test_a_refused_verdict_is_shown_on_the_page_with_the_form_kept(client, store):
    review, done = made(store, State.MANUAL_REVIEW), made(store, State.SUCCEEDED, status_code=201)
    html = client.get(f"/ui/receipts/{review}").text
    csrf = html.split('name="csrf_token" value="')[1].split('"')[0]
    r = client.post(f"/ui/receipts/{review}/resolve", data={"state": "rejected", "note": "my note", "csrf_token": csrf})
    assert r.status_code == 422 and "is not a resolution" in r.text and "my note" in r.text
    r = client.post(f"/ui/receipts/{done}/resolve", data={"state": "safe_to_retry", "note": "my note", "csrf_token": csrf})
    assert r.status_code == 409 and "only manual_review or outcome_unknown can be resolved" in r.text
    assert store.receipts.get(review).state == "manual_review" and store.receipts.get(done).state == "succeeded"
