"""The reconciler's Azure Shared Key signature is the azure-storage SDK's, byte for byte: a blob's path as sent
(Azurite's holds the account again), the query's parameters by name, the content type among the signed headers;
without the account and key in the environment, the read is one that cannot be made (a failed read)."""

import datetime as dt

import httpx
import pytest
from azure.core.pipeline import PipelineContext, PipelineRequest
from azure.core.rest import HttpRequest
from azure.storage.blob._shared.authentication import SharedKeyCredentialPolicy

from proxy_addon.exceptions import ReadNotPossibleError
from proxy_addon.reconcile.azure_shared_key import SharedKey, sign

NOW = dt.datetime(2026, 5, 4, 3, 2, 1, tzinfo=dt.UTC)
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # Azurite's published key


def sdk_authorization(request: httpx.Request) -> str:
    """The SDK's own policy, signing a request with our request's headers (as the SDK would send them)."""
    headers = {k: v for k, v in request.headers.items() if k not in ("authorization", "host")}
    theirs = PipelineRequest(HttpRequest(request.method, str(request.url), headers=headers), PipelineContext(None))
    SharedKeyCredentialPolicy(ACCOUNT, KEY).on_request(theirs)
    return theirs.http_request.headers["Authorization"]


@pytest.mark.parametrize(
    ("method", "url", "headers"),
    [
        ("HEAD", "http://127.0.0.1:10000/devstoreaccount1/cont/dir/a%20b~.txt", {}),
        ("HEAD", "https://acct.blob.core.windows.net/cont?restype=container", {}),
        ("GET", "https://acct.blob.core.windows.net/cont?restype=container&comp=list&prefix=a%20b", {"x-ms-version": "2020-10-02"}),
        ("GET", "http://127.0.0.1:10000/devstoreaccount1/cont/b", {"content-type": "application/xml", "x-ms-client-request-id": "r1"}),
    ],
)
def test_the_signature_is_the_sdks(method, url, headers):
    ours = httpx.Request(method, url, headers=headers)
    sign(ours, ACCOUNT, KEY, NOW)
    assert ours.headers["x-ms-date"] == "Mon, 04 May 2026 03:02:01 GMT"
    assert ours.headers["x-ms-version"] == headers.get("x-ms-version", "2021-08-06")
    assert ours.headers["authorization"].startswith(f"SharedKey {ACCOUNT}:")
    assert ours.headers["authorization"] == sdk_authorization(ours)


def test_no_account_or_key_in_the_environment_is_a_read_that_cannot_be_made(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    with pytest.raises(ReadNotPossibleError, match="AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY are not set"):
        next(SharedKey(NOW).auth_flow(httpx.Request("HEAD", "http://127.0.0.1/a/b")))
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", "not base64!")
    with pytest.raises(ReadNotPossibleError, match="not base64"):
        next(SharedKey(NOW).auth_flow(httpx.Request("HEAD", "http://127.0.0.1/a/b")))
