"""`preset: azure-blob` against Azurite (Microsoft's Azure Storage emulator, from npm; nobody here wrote it), the
agent's writes made by the azure-storage-blob SDK through the proxy, with no rule written by hand. The account
has two keys: the agent signs with the first, the reconciler its reads with the second (Shared Key, from
AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY); Azurite checks every signature. For each write (Create Container,
Put Blob, Put Block List, Delete Blob) `receipts rules check` proves its read rule; one Azurite committed whose
answer was lost ends `succeeded` (with the ETag); one Azurite never received ends `safe_to_retry`; the agent's
retry is forwarded exactly when the verdict allows it.
"""

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient
from support.e2e import stop_process, tag, wait_for
from support.faulty_front import DELAY, LOST
from support.presets import PresetWorld, preset_world
from support.proxy import REPO
from support.server import free_port, listens

AZURITE = REPO / ".node" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
AGENT_KEY = "YWdlbnQta2V5LWFnZW50LWtleS1hZ2VudC1rZXktYWdlbnQta2V5"  # the account's key1
RECONCILER_KEY = "cmVjb25jaWxlci1rZXktcmVjb25jaWxlci1rZXktcmVjb25jaWxlcg=="  # its key2
Predicate = Callable[[str, str, bytes], bool]


@pytest.fixture(scope="module")
def azurite(tmp_path_factory) -> Iterator[int]:
    if not AZURITE.exists():
        pytest.fail(f"{AZURITE} is missing: run scripts/ensure-azurite (make test does)", pytrace=False)
    port, tmp = free_port(), tmp_path_factory.mktemp("azurite-blob")
    log = open(tmp / "azurite.log", "wb")
    proc = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--skipApiVersionCheck", "--loose"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp, env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{AGENT_KEY}:{RECONCILER_KEY}"},
    )
    try:
        assert wait_for(lambda: proc.poll() is not None or listens(proc.pid, port), 30) and proc.poll() is None, (tmp / "azurite.log").read_text()[-2000:]
        yield port
    finally:
        stop_process(proc)
        log.close()


@pytest.fixture(scope="module")
def world(azurite, tmp_path_factory) -> Iterator[PresetWorld]:
    mp = pytest.MonkeyPatch()
    mp.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)  # the reconciler's own key, not the agent's
    mp.setenv("AZURE_STORAGE_KEY", RECONCILER_KEY)
    try:
        with preset_world("azure-blob", azurite, tmp_path_factory.mktemp("azure")) as w:
            yield w
    finally:
        mp.undo()


def direct(azurite: int) -> BlobServiceClient:
    """A client straight to Azurite: to set up and to look, never through the proxy."""
    return BlobServiceClient(f"http://127.0.0.1:{azurite}/{ACCOUNT}", credential={"account_name": ACCOUNT, "account_key": AGENT_KEY})


def agent(world: PresetWorld) -> BlobServiceClient:
    """The agent's client, through the proxy, with no retries of its own (the test makes the retry)."""
    return BlobServiceClient(f"{world.front.base}/{ACCOUNT}", credential={"account_name": ACCOUNT, "account_key": AGENT_KEY},
                             proxies={"http": world.proxy.url}, retry_total=0, read_timeout=30)


def receipt_of(call: Callable[[], Any]) -> str:
    """The receipt id of a call the proxy answered outcome_unknown (the SDK raises it)."""
    with pytest.raises(HttpResponseError) as raised:
        call()
    headers = raised.value.response.headers
    assert headers["x-receipt-state"] == "outcome_unknown", headers
    return headers["x-receipt-id"]


def to(method: str, name: str, query: str = "") -> Predicate:
    """The requests for this container or blob (its last path segments), with this in their query."""
    return lambda m, target, _b: m == method and urlsplit(target).path.endswith("/" + quote(name)) and query in urlsplit(target).query


def proven(world: PresetWorld, operation: str, capsys, monkeypatch) -> dict:
    health = world.rules_check(capsys, monkeypatch)[operation]
    assert (health["proven"], health["positive"]["result"], health["negative"]["result"]) == (True, "passed", "passed"), health
    return health


def settled_as(world: PresetWorld, operation_id: str, state: str) -> str | None:
    receipt = world.store.receipts.get(operation_id)
    assert receipt is not None and receipt.state == state, world.store.receipts.history(operation_id)[-1].detail
    return receipt.external_id


def container(azurite: int) -> ContainerClient:
    return direct(azurite).create_container(f"c-{uuid.uuid4().hex[:12]}")


def test_create_container(world, azurite, capsys, monkeypatch):
    t, azure = tag(), agent(world)
    azure.create_container(f"known-{t}")
    lost = world.unknown(DELAY, to("PUT", f"lost-{t}"), lambda: receipt_of(lambda: azure.create_container(f"lost-{t}")))
    unseen = world.unknown(LOST, to("PUT", f"unseen-{t}"), lambda: receipt_of(lambda: azure.create_container(f"unseen-{t}")))
    health = proven(world, "azure.blob.create_container", capsys, monkeypatch)
    assert health["positive"]["evidence"]["matched_id"] == direct(azurite).get_container_client(f"known-{t}").get_container_properties().etag

    world.reconcile()
    committed = direct(azurite).get_container_client(f"lost-{t}").get_container_properties()
    assert settled_as(world, lost, "succeeded") == committed.etag
    settled_as(world, unseen, "safe_to_retry")

    with pytest.raises(HttpResponseError):
        azure.create_container(f"lost-{t}")  # refused: not sent again
    azure.create_container(f"unseen-{t}")
    assert world.forwarded(to("PUT", f"lost-{t}")) == 1 and world.forwarded(to("PUT", f"unseen-{t}")) == 1
    assert direct(azurite).get_container_client(f"unseen-{t}").exists()


def test_put_blob(world, azurite, capsys, monkeypatch):
    t, box = tag(), container(azurite)
    blobs = agent(world).get_container_client(box.container_name)

    def put(name: str) -> Callable[[], Any]:
        return lambda: blobs.upload_blob(name, name.encode(), overwrite=True)

    put(f"known-{t}.txt")()
    lost_name, unseen_name = f"dir/lost {t}.txt", f"unseen-{t}.txt"
    lost = world.unknown(DELAY, to("PUT", lost_name), lambda: receipt_of(put(lost_name)))
    unseen = world.unknown(LOST, to("PUT", unseen_name), lambda: receipt_of(put(unseen_name)))
    health = proven(world, "azure.blob.put_blob", capsys, monkeypatch)
    assert health["positive"]["evidence"]["matched_id"] == box.get_blob_client(f"known-{t}.txt").get_blob_properties().etag

    world.reconcile()
    assert settled_as(world, lost, "succeeded") == box.get_blob_client(lost_name).get_blob_properties().etag
    settled_as(world, unseen, "safe_to_retry")

    with pytest.raises(HttpResponseError):
        put(lost_name)()
    put(unseen_name)()
    assert world.forwarded(to("PUT", lost_name)) == 1 and world.forwarded(to("PUT", unseen_name)) == 1
    assert box.download_blob(unseen_name).readall() == unseen_name.encode()


def test_put_block_list(world, azurite, capsys, monkeypatch):
    t, box = tag(), container(azurite)
    blobs = agent(world).get_container_client(box.container_name)

    def staged(name: str) -> Callable[[], Any]:
        """Put Block through the proxy (no rule: it is only journaled); then the Put Block List to send."""
        block = BlobBlock(block_id=uuid.uuid4().hex)
        blobs.get_blob_client(name).stage_block(block.id, name.encode() * 3)
        return lambda: blobs.get_blob_client(name).commit_block_list([block])

    staged(f"known-{t}")()
    commit_lost, commit_unseen = staged(f"lost-{t}"), staged(f"unseen-{t}")
    lost = world.unknown(DELAY, to("PUT", f"lost-{t}", "comp=blocklist"), lambda: receipt_of(commit_lost))
    unseen = world.unknown(LOST, to("PUT", f"unseen-{t}", "comp=blocklist"), lambda: receipt_of(commit_unseen))
    proven(world, "azure.blob.put_block_list", capsys, monkeypatch)

    world.reconcile()
    assert settled_as(world, lost, "succeeded") == box.get_blob_client(f"lost-{t}").get_blob_properties().etag
    settled_as(world, unseen, "safe_to_retry")

    with pytest.raises(HttpResponseError):
        commit_lost()
    commit_unseen()  # the blocks are still staged: the retry commits them
    assert world.forwarded(to("PUT", f"lost-{t}", "comp=blocklist")) == 1
    assert world.forwarded(to("PUT", f"unseen-{t}", "comp=blocklist")) == 1
    assert box.download_blob(f"unseen-{t}").readall() == f"unseen-{t}".encode() * 3


def test_delete_blob(world, azurite, capsys, monkeypatch):
    t, box = tag(), container(azurite)
    for name in ("known", "gone", "kept"):
        box.upload_blob(f"{name}-{t}", b"x")
    blobs = agent(world).get_container_client(box.container_name)
    blobs.delete_blob(f"known-{t}")
    gone = world.unknown(DELAY, to("DELETE", f"gone-{t}"), lambda: receipt_of(lambda: blobs.delete_blob(f"gone-{t}")))
    kept = world.unknown(LOST, to("DELETE", f"kept-{t}"), lambda: receipt_of(lambda: blobs.delete_blob(f"kept-{t}")))
    proven(world, "azure.blob.delete_blob", capsys, monkeypatch)

    world.reconcile()
    settled_as(world, gone, "succeeded")
    settled_as(world, kept, "safe_to_retry")  # still there: the delete did not happen
    blobs.delete_blob(f"kept-{t}")
    assert world.forwarded(to("DELETE", f"kept-{t}")) == 1
    assert list(box.list_blobs()) == []
