"""Signing the reconciler's reads to AWS (AWS Signature Version 4), as an httpx auth: a read rule with `aws_sigv4`
(the s3 and dynamodb presets) reads with the reconciler's own credentials, from its environment
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, and `AWS_SESSION_TOKEN` for temporary ones), never stored.

The algorithm is AWS's (docs: "Create a signed AWS API request"): a canonical request (method, path, sorted
query, the signed headers, the payload's SHA-256), a string to sign under the date/region/service scope, and an
HMAC-SHA256 chain from the secret key. S3 signs its path as sent; every other service encodes it once more.
tests/unit/test_aws_sigv4.py checks it against botocore's own signer.
"""

import hashlib
import hmac
import os
import re
from collections.abc import Generator
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote

import httpx

from proxy_addon.exceptions import ReadNotPossibleError

ALGORITHM = "AWS4-HMAC-SHA256"
_REGION_IN_HOST = re.compile(r"[.-]([a-z]{2}(?:-gov)?-[a-z]+-\d)\.amazonaws\.com$")


def region_of(host: str, given: str | None) -> str:
    """The rule's region, else the one in an AWS host name (`dynamodb.eu-west-1.amazonaws.com`), else the
    environment's (`AWS_REGION`, `AWS_DEFAULT_REGION`), else us-east-1."""
    if given:
        return given
    m = _REGION_IN_HOST.search(host.lower())
    if m:
        return m.group(1)
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _uri_encode(text: str) -> str:
    return quote(text, safe="-_.~")


class SigV4(httpx.Auth):
    """Signs each request with the credentials in the environment at read time."""

    requires_request_body = True

    def __init__(self, service: str, region: str | None, now: datetime | None = None):
        self.service = service
        self.region = region
        self.now = now  # a fixed time: the tests

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        access_key, secret_key = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not access_key or not secret_key:
            raise ReadNotPossibleError("aws_sigv4: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set")
        sign(request, self.service, region_of(request.url.host, self.region), access_key, secret_key,
             os.environ.get("AWS_SESSION_TOKEN"), self.now or datetime.now(UTC))
        yield request


def sign(
    request: httpx.Request, service: str, region: str, access_key: str, secret_key: str, token: str | None, now: datetime
) -> None:
    """Add `X-Amz-Date` (and S3's `X-Amz-Content-Sha256`), the token and `Authorization` to the request."""
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(request.content).hexdigest()
    request.headers["x-amz-date"] = stamp
    if service == "s3":
        request.headers["x-amz-content-sha256"] = payload  # S3 asks for it; the others only sign it
    if token:
        request.headers["x-amz-security-token"] = token
    names = sorted(n for n in {k.lower() for k in request.headers} if n in ("host", "content-type") or n.startswith("x-amz-"))
    canonical_headers = "".join(f"{n}:{' '.join(request.headers[n].split())}\n" for n in names)
    signed_headers = ";".join(names)
    path = request.url.raw_path.decode("ascii").partition("?")[0] or "/"
    path = path if service == "s3" else quote(path, safe="/-_.~")
    query = sorted((_uri_encode(k), _uri_encode(v)) for k, v in parse_qsl(request.url.query.decode("ascii"), keep_blank_values=True))
    canonical_request = "\n".join(
        [request.method, path, "&".join(f"{k}={v}" for k, v in query), canonical_headers, signed_headers,
         payload]
    )
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope, hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    request.headers["authorization"] = f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed_headers}, Signature={signature}"
