"""Replays that never lie, end to end: a real proxy, an upstream that compresses, pretty-prints and
redirects (support/answering.py), real clients (h11 on a socket for the bytes, httpx, requests, and Node's own
fetch when `node` is on the machine), receipts on SQLite and PostgreSQL.

- A replay is the first answer byte for byte: status, headers (names, order, repeats) and body as delivered,
  Content-Encoding included, less the secret headers that were not stored; every client decodes it.
- 303 See Other is a success (its Location may be the external id); other 3xx are rejections.
- A later PUT, PATCH or DELETE to the same target by the same account ends earlier successes' replay window,
  in the database (so across replicas); a POST does not.
"""

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import requests
from support.answering import AnsweringUpstream, RawAnswer, raw_exchange
from support.e2e import open_store, proxy_client, settled, stop_process, tag
from support.proxy import start_inprocess_proxy, start_proxy_process

NODE = shutil.which("node")
FETCH_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "fetch_via_proxy.mjs"


@pytest.fixture(scope="module")
def upstream():
    up = AnsweringUpstream().start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def env(module_db_url, upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replays")
    config = tmp / "config.yaml"
    config.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "hosts:\n"
        '  "127.0.0.1":\n'
        "    operations:\n"
        '      - {name: things.create, method: POST, path: "/see-other/{tag}", external_id: "header:Location"}\n'
    )
    proxy = start_inprocess_proxy(config, module_db_url, tmp / "confdir")
    try:
        with open_store(module_db_url) as store, proxy_client(proxy.url) as client:
            yield {"proxy": proxy, "store": store, "client": client, "up": upstream, "config": config, "url": module_db_url}
    finally:
        proxy.stop()


def without(answer: RawAnswer, *names: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in answer.headers if k.lower() not in names]


# -- byte for byte ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gzip", "br", "pretty"])
def test_a_replay_is_the_first_answer_byte_for_byte(env, kind):
    up, port = env["up"], env["proxy"].port
    path = f"/{kind}/{tag()}"
    body = json.dumps({"title": path}).encode()
    first = raw_exchange(port, "POST", up.base + path, body)
    assert first.status == 201 and first.header("X-Receipt-State") == "succeeded", first
    again = raw_exchange(port, "POST", up.base + path, body)
    assert again.header("X-Receipt-Replayed") == "true", again
    assert again.status == first.status
    assert again.body == first.body  # as delivered: compressed, pretty-printed, not re-serialised
    # every header as the upstream named, ordered and repeated them, less Set-Cookie (a secret, never stored)
    assert without(again, "x-receipt-replayed") == without(first, "set-cookie")
    assert first.header("Set-Cookie") is not None and again.header("Set-Cookie") is None
    assert up.count(path) == 1
    stored = settled(env["store"], first.header("X-Receipt-Id"))
    assert b"upstream-cookie-secret" not in json.dumps(stored.response_headers).encode()


def test_a_compressed_answer_with_a_secret_field_is_stored_redacted_and_never_replayed(env):
    up, client, store = env["up"], env["client"], env["store"]
    path = f"/secret/{tag()}"
    first = client.post(up.base + path, json={"title": path})
    assert first.status_code == 201 and first.json()["token"] == "resp-secret-in-gzip"
    receipt = settled(store, first.headers["X-Receipt-Id"])
    stored = receipt.response_body
    plain = gzip.decompress(stored) if stored[:2] == b"\x1f\x8b" else stored  # main kept compressed answers as they came
    assert b"resp-secret-in-gzip" not in plain
    assert json.loads(receipt.response_body)["token"] == "[REDACTED]"  # decoded to find it; stored redacted
    assert receipt.response_body_redacted is True
    again = client.post(up.base + path, json={"title": path})
    assert again.status_code == 409 and "X-Receipt-Replayed" not in again.headers
    doc = again.json()
    assert doc["type"].endswith("duplicate-succeeded")
    assert (doc["operation_id"], doc["upstream_status"]) == (receipt.operation_id, 201)
    assert up.count(path) == 1


def fetch_with_node(proxy_port: int, url: str, body: str) -> dict:
    done = subprocess.run(
        ["node", str(FETCH_SCRIPT), str(proxy_port), "POST", url, body], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("kind", ["gzip", "br"])
def test_real_clients_decode_a_replayed_compressed_answer(env, kind):
    up, proxy = env["up"], env["proxy"]
    url = f"{up.base}/{kind}/{tag()}"
    body = json.dumps({"title": url})
    first = env["client"].post(url, content=body, headers={"Content-Type": "application/json"})
    assert first.status_code == 201 and first.headers["Content-Encoding"] == kind
    text = first.text  # as httpx decoded the original
    assert text.startswith("{\n  ")

    with httpx.Client(proxy=proxy.url, trust_env=False, timeout=30) as client:
        replay = client.post(url, content=body, headers={"Content-Type": "application/json"})
    assert (replay.status_code, replay.headers["X-Receipt-Replayed"], replay.text) == (201, "true", text)

    replay = requests.post(url, data=body, headers={"Content-Type": "application/json"},
                           proxies={"http": proxy.url, "https": proxy.url}, timeout=30)
    assert (replay.status_code, replay.headers["X-Receipt-Replayed"], replay.text) == (201, "true", text)

    if NODE is not None:  # Node's fetch (undici) through the proxy
        replay_node = fetch_with_node(proxy.port, url, body)
        assert (replay_node["status"], replay_node["headers"]["x-receipt-replayed"]) == (201, "true")
        assert replay_node["body"] == text
    assert up.count(url.removeprefix(up.base)) == 1


@pytest.mark.skipif(NODE is None, reason="node is not on this machine")
def test_node_fetch_gets_the_original_through_the_proxy(env):
    """The Node client itself, on a first request: a journaled write with its receipt headers."""
    up, proxy = env["up"], env["proxy"]
    url = f"{up.base}/gzip/{tag()}"
    answer = fetch_with_node(proxy.port, url, json.dumps({"title": url}))
    assert (answer["status"], answer["headers"]["x-receipt-state"]) == (201, "succeeded")
    assert json.loads(answer["body"])["kind"] == "gzip"


# -- 3xx ------------------------------------------------------------------------------------------------------


def test_303_see_other_is_a_success_and_its_repeat_is_not_forwarded(env):
    up, client, store = env["up"], env["client"], env["store"]
    path = f"/see-other/{tag()}"
    first = client.post(up.base + path, json={"title": path})
    assert first.status_code == 303 and first.headers["X-Receipt-State"] == "succeeded", first.text
    receipt = settled(store, first.headers["X-Receipt-Id"])
    assert (receipt.state, receipt.status_code, receipt.operation) == ("succeeded", 303, "things.create")
    assert receipt.external_id == first.headers["Location"] and receipt.external_id.startswith("/things/")
    again = client.post(up.base + path, json={"title": path})  # the POST/Redirect/GET retry: the thing exists
    assert again.status_code == 303 and again.headers["X-Receipt-Replayed"] == "true"
    assert again.headers["Location"] == first.headers["Location"]
    assert up.count(path) == 1


def test_other_3xx_are_rejected_with_their_status(env):
    up, client, store = env["up"], env["client"], env["store"]
    path = f"/found/{tag()}"
    first = client.post(up.base + path, json={"title": path})
    assert first.status_code == 302 and first.headers["X-Receipt-State"] == "rejected"
    receipt = settled(store, first.headers["X-Receipt-Id"])
    assert (receipt.state, receipt.status_code, receipt.error_code) == ("rejected", 302, "upstream_status")
    again = client.post(up.base + path, json={"title": path})  # a rejection blocks nothing
    assert again.status_code == 302 and "X-Receipt-Replayed" not in again.headers
    assert up.count(path) == 2


# -- later writes end the replay window ----------------------------------------------------------------------


def write(env, method: str, path: str, document: dict, headers: dict | None = None, proxy_url: str | None = None):
    if proxy_url is None:
        return env["client"].request(method, env["up"].base + path, json=document, headers=headers)
    with proxy_client(proxy_url) as client:
        return client.request(method, env["up"].base + path, json=document, headers=headers)


def test_put_a_put_b_put_a_forwards_the_third(env):
    path = f"/resource/{tag()}"
    a, b = {"colour": "red"}, {"colour": "blue"}
    first = write(env, "PUT", path, a)
    assert write(env, "PUT", path, b).status_code == 201
    third = write(env, "PUT", path, a)
    assert third.status_code == 201 and "X-Receipt-Replayed" not in third.headers, third.headers
    assert third.headers["X-Receipt-Id"] != first.headers["X-Receipt-Id"]
    assert env["up"].count(path) == 3  # the upstream holds A again
    fourth = write(env, "PUT", path, a)  # nothing changed since the third: its answer stands
    assert fourth.headers["X-Receipt-Replayed"] == "true" and fourth.headers["X-Receipt-Id"] == third.headers["X-Receipt-Id"]
    assert env["up"].count(path) == 3


@pytest.mark.parametrize("method", ["PATCH", "DELETE"])
def test_a_later_patch_or_delete_ends_the_window_too(env, method):
    path = f"/resource/{tag()}"
    write(env, "PUT", path, {"colour": "red"})
    assert write(env, method, path, {"colour": "green"}).status_code == 201
    again = write(env, "PUT", path, {"colour": "red"})
    assert "X-Receipt-Replayed" not in again.headers
    assert env["up"].count(path) == 3


def test_post_a_post_b_post_a_answers_the_third_from_the_first(env):
    path = f"/pretty/{tag()}"
    first = write(env, "POST", path, {"title": "A"})
    write(env, "POST", path, {"title": "B"})
    third = write(env, "POST", path, {"title": "A"})
    assert third.headers["X-Receipt-Replayed"] == "true"
    assert third.headers["X-Receipt-Id"] == first.headers["X-Receipt-Id"]
    assert third.content == first.content
    assert env["up"].count(path) == 2  # a later create does not undo the first: A is not created twice


def test_a_later_write_that_did_not_happen_or_came_from_another_account_ends_nothing(env):
    path = f"/resource/{tag()}"
    first = write(env, "PUT", path, {"colour": "red"}, {"Authorization": "Bearer agent-a"})
    rejected = write(env, "PUT", path + "?status=422", {"colour": "blue"}, {"Authorization": "Bearer agent-a"})
    assert rejected.status_code == 422 and rejected.headers["X-Receipt-State"] == "rejected"
    other = write(env, "PUT", path, {"colour": "blue"}, {"Authorization": "Bearer agent-b"})
    assert other.status_code == 201
    again = write(env, "PUT", path, {"colour": "red"}, {"Authorization": "Bearer agent-a"})
    assert again.headers["X-Receipt-Replayed"] == "true" and again.headers["X-Receipt-Id"] == first.headers["X-Receipt-Id"]


def test_a_later_write_through_another_replica_ends_the_window(env, tmp_path):
    """The rule is in the database: a PUT B through a second proxy (same config, same database) ends the
    window that the first proxy would replay PUT A from."""
    proc, port = start_proxy_process(env["config"], env["url"], tmp_path / "confdir", tmp_path / "replica.log")
    try:
        path = f"/resource/{tag()}"
        first = write(env, "PUT", path, {"colour": "red"})
        assert write(env, "PUT", path, {"colour": "blue"}, proxy_url=f"http://127.0.0.1:{port}").status_code == 201
        third = write(env, "PUT", path, {"colour": "red"})
        assert "X-Receipt-Replayed" not in third.headers and third.headers["X-Receipt-Id"] != first.headers["X-Receipt-Id"]
        assert env["up"].count(path) == 3
    finally:
        stop_process(proc)
