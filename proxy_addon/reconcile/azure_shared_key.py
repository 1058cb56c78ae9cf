"""Signing the reconciler's reads to Azure Storage with Shared Key, as an httpx auth: a read rule with
`azure_shared_key: true` (the azure-blob preset) reads with the reconciler's own account key, from its environment
(`AZURE_STORAGE_ACCOUNT`, `AZURE_STORAGE_KEY`: the names Azure's CLI reads), never stored.

The algorithm is Azure's (docs: "Authorize with Shared Key"): the method, eleven standard headers (Content-Length
empty when 0), the `x-ms-*` headers sorted, and the resource (`/account/path`, then each query parameter as
`name:value` on a line of its own, sorted), signed with HMAC-SHA256 under the base64-decoded key. Chosen over a
SAS token because it needs no token minted and renewed for the reconciler, and the same key reads any container;
tests/unit/test_azure_shared_key.py checks it against the azure-storage SDK's own signer.
"""

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Generator
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import parse_qsl

import httpx

from proxy_addon.exceptions import ReadNotPossibleError

API_VERSION = "2021-08-06"  # x-ms-version when the rule's headers give none; Azurite and Azure both read it
_STANDARD_HEADERS = (
    "content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
    "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range",
)


class SharedKey(httpx.Auth):
    """Signs each request with the account and key in the environment at read time."""

    def __init__(self, now: datetime | None = None):
        self.now = now  # a fixed time: the tests

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        account, key = os.environ.get("AZURE_STORAGE_ACCOUNT"), os.environ.get("AZURE_STORAGE_KEY")
        if not account or not key:
            raise ReadNotPossibleError("azure_shared_key: AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY are not set")
        sign(request, account, key, self.now or datetime.now(UTC))
        yield request


def sign(request: httpx.Request, account: str, key: str, now: datetime) -> None:
    """Add `x-ms-date` (and `x-ms-version`, when missing) and `Authorization: SharedKey account:signature`."""
    try:
        secret = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ReadNotPossibleError("azure_shared_key: AZURE_STORAGE_KEY is not base64") from e
    request.headers["x-ms-date"] = format_datetime(now.astimezone(UTC), usegmt=True)
    request.headers.setdefault("x-ms-version", API_VERSION)
    headers = {k.lower(): v for k, v in request.headers.items()}
    if headers.get("content-length") == "0":
        del headers["content-length"]
    standard = [headers.get(name, "") for name in _STANDARD_HEADERS]
    ms = "".join(f"{name}:{headers[name]}\n" for name in sorted(n for n in headers if n.startswith("x-ms-")))
    to_sign = "\n".join([request.method, *standard]) + "\n" + ms + canonical_resource(request, account)
    signature = base64.b64encode(hmac.new(secret, to_sign.encode(), hashlib.sha256).digest()).decode()
    request.headers["authorization"] = f"SharedKey {account}:{signature}"


def canonical_resource(request: httpx.Request, account: str) -> str:
    """`/account/path` as sent (Azurite's path holds the account again), then the query's parameters by name."""
    path = request.url.raw_path.decode("ascii").partition("?")[0] or "/"
    params: dict[str, list[str]] = {}
    for name, value in parse_qsl(request.url.query.decode("ascii"), keep_blank_values=True):
        params.setdefault(name.lower(), []).append(value)
    return f"/{account}{path}" + "".join(f"\n{name}:{','.join(sorted(v))}" for name, v in sorted(params.items()))
