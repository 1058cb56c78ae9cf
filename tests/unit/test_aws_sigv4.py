"""The reconciler's SigV4 signature is botocore's, byte for byte: S3's path as sent, another service's encoded once
more, a sorted query, the content type and X-Amz-Target among the signed headers, a session token."""

import datetime as dt
import json

import botocore.auth
import httpx
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy_addon.reconcile.aws_sigv4 import region_of, sign

NOW = dt.datetime(2026, 5, 4, 3, 2, 1, tzinfo=dt.UTC)


def botocore_signature(request: httpx.Request, service: str, token: str | None, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda **_: NOW.replace(tzinfo=None))
    aws = AWSRequest(method=request.method, url=str(request.url), data=request.content,
                     headers={k: v for k, v in request.headers.items() if k in ("content-type", "x-amz-target")})
    auth = (S3SigV4Auth if service == "s3" else SigV4Auth)(Credentials("AKIDEXAMPLE", "secret/key", token), service, "eu-west-1")
    auth.add_auth(aws)
    return aws.headers["Authorization"]


@pytest.mark.parametrize(
    ("service", "method", "url", "headers", "body"),
    [
        ("s3", "HEAD", "http://127.0.0.1:9000/bucket/dir/my%20file.txt", {}, b""),
        ("s3", "GET", "http://bucket.s3.eu-west-1.amazonaws.com/a%2Bb?list-type=2&prefix=a%20b", {}, b""),
        ("dynamodb", "POST", "https://dynamodb.eu-west-1.amazonaws.com/",
         {"content-type": "application/x-amz-json-1.0", "x-amz-target": "DynamoDB_20120810.Scan"},
         json.dumps({"TableName": "t"}).encode()),
    ],
)
@pytest.mark.parametrize("token", [None, "session-token"])
def test_the_signature_is_botocores(service, method, url, headers, body, token, monkeypatch):
    ours = httpx.Request(method, url, headers=headers, content=body)
    sign(ours, service, "eu-west-1", "AKIDEXAMPLE", "secret/key", token, NOW)
    assert ours.headers["authorization"] == botocore_signature(
        httpx.Request(method, url, headers=headers, content=body), service, token, monkeypatch
    )
    assert ours.headers["x-amz-date"] == "20260504T030201Z"
    assert ours.headers.get("x-amz-security-token") == token


def test_the_region_is_the_rules_else_the_hosts_else_the_environments(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert region_of("dynamodb.eu-west-1.amazonaws.com", None) == "eu-west-1"
    assert region_of("bucket.s3.us-west-2.amazonaws.com", None) == "us-west-2"
    assert region_of("s3-eu-central-1.amazonaws.com", None) == "eu-central-1"
    assert region_of("127.0.0.1", None) == "ap-south-1"
    assert region_of("dynamodb.eu-west-1.amazonaws.com", "sa-east-1") == "sa-east-1"
