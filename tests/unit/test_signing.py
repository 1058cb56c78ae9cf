"""Requests signed per attempt (rules/signing.py): an SDK's two attempts of one call are one account and one intent;
two signers are two accounts; nothing readable is stored. Signed by the SDKs' own signers where one is installed
(botocore, azure-core), else with the header exactly as the scheme's specification shows it."""

import re
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from botocore.auth import HmacV1Auth, S3SigV4QueryAuth, SigV2Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.protocols.facts import RequestFacts, split_query
from proxy_addon.rules.account import ANONYMOUS, AccountHasher
from proxy_addon.rules.intent import build_intent
from proxy_addon.rules.redaction import REDACTED
from proxy_addon.rules.signing import account_part, split_pairs

HASHER = AccountHasher(b"s" * 32)
POLICY = parse_config("{}").policy_for("email.us-east-1.amazonaws.com", 443)
SES_BODY = b"Action=SendEmail&Version=2010-12-01&Source=a%40example.com&Destination.ToAddresses.member.1=b%40example.com"
FORM = "application/x-www-form-urlencoded; charset=utf-8"
KEY_A = Credentials("AKIAEXAMPLEKEYA00001", "secret-a-" + "x" * 31)
KEY_B = Credentials("AKIAEXAMPLEKEYB00002", "secret-b-" + "y" * 31)
SESSION = Credentials("ASIAEXAMPLESESSION01", "secret-s-" + "z" * 31, token="FwoGZXIvYXdzEXAMPLESESSIONTOKEN")


def facts_of(method: str, url: str, headers, body: bytes, content_type: str | None = FORM) -> RequestFacts:
    scheme, _, rest = url.partition("://")
    host, _, raw_path = rest.partition("/")
    path, query = split_query("/" + raw_path)
    hdrs = [(k, v) for k, v in headers]
    return RequestFacts(method, scheme, host, 443, path, query, hdrs, content_type, body, url=url)


def intent_of(facts: RequestFacts, policy=POLICY):
    return build_intent(facts, policy, HASHER, "inst", 65536, None, "op_x")[0]


def signing_time(when: datetime):
    """botocore signs with the time it reads here: an attempt a few seconds later, without waiting for it."""
    return mock.patch("botocore.auth.get_current_datetime", return_value=when.replace(tzinfo=None))


def sigv4_attempt(creds: Credentials, when: datetime, attempt: int, service: str = "ses") -> RequestFacts:
    """One botocore attempt of one SendEmail call: signed anew at `when`, with the SDK's attempt headers."""
    url = "https://email.us-east-1.amazonaws.com/"
    req = AWSRequest("POST", url, data=SES_BODY, headers={"Content-Type": FORM})
    req.headers["amz-sdk-invocation-id"] = "0b1f3c0e-1111-4a6b-9c9d-000000000001"
    req.headers["amz-sdk-request"] = f"attempt={attempt}; max=4"
    with signing_time(when):
        SigV4Auth(creds, service, "us-east-1").add_auth(req)
    return facts_of("POST", url, req.headers.items(), SES_BODY)


T0 = datetime(2026, 12, 3, 16, 0, 0, tzinfo=UTC)


def test_an_sdk_retry_signed_anew_is_the_same_account_and_intent():
    first, retry = sigv4_attempt(KEY_A, T0, 1), sigv4_attempt(KEY_A, T0 + timedelta(seconds=3), 2)
    first_auth = dict(first.headers)["Authorization"]
    assert first_auth != dict(retry.headers)["Authorization"]  # the signature really changed between attempts
    assert dict(first.headers)["X-Amz-Date"] != dict(retry.headers)["X-Amz-Date"]
    a, b = intent_of(first), intent_of(retry)
    assert a.account == b.account != ANONYMOUS
    assert a.intent_fingerprint == b.intent_fingerprint
    assert a.request_headers["authorization"] == REDACTED
    stored = repr(a)
    assert first_auth.split("Signature=")[1] not in stored and KEY_A.access_key not in stored


def test_two_access_keys_are_two_accounts():
    a, b = intent_of(sigv4_attempt(KEY_A, T0, 1)), intent_of(sigv4_attempt(KEY_B, T0, 1))
    assert a.account != b.account
    assert a.intent_fingerprint == b.intent_fingerprint  # the same body: only the account tells them apart


def test_a_session_credential_counts_by_its_key_id_not_its_token():
    first, retry = sigv4_attempt(SESSION, T0, 1), sigv4_attempt(SESSION, T0 + timedelta(seconds=1), 2)
    assert "X-Amz-Security-Token" in dict(first.headers)
    assert intent_of(first).account == intent_of(retry).account
    assert intent_of(first).account != intent_of(sigv4_attempt(KEY_A, T0, 1)).account


def presigned_put(creds: Credentials, when: datetime, expires: int = 300) -> str:
    req = AWSRequest("PUT", "https://bucket.s3.us-east-1.amazonaws.com/reports/q4.csv")
    with signing_time(when):
        S3SigV4QueryAuth(creds, "s3", "us-east-1", expires=expires).add_auth(req)
    return req.url


def test_a_presigned_url_made_again_is_the_same_intent_of_the_same_signer():
    first, again = presigned_put(KEY_A, T0), presigned_put(KEY_A, T0 + timedelta(minutes=2), expires=600)
    assert first != again
    body = b"id,total\n1,10\n"
    a = intent_of(facts_of("PUT", first, [("Content-Type", "text/csv")], body, "text/csv"))
    b = intent_of(facts_of("PUT", again, [("Content-Type", "text/csv")], body, "text/csv"))
    other = intent_of(facts_of("PUT", presigned_put(KEY_B, T0), [("Content-Type", "text/csv")], body, "text/csv"))
    assert a.intent_fingerprint == b.intent_fingerprint == other.intent_fingerprint
    assert a.account == b.account != other.account
    assert a.account != ANONYMOUS
    assert "X-Amz-Signature=" + REDACTED.replace("[", "%5B").replace("]", "%5D") in (a.query or "")


def test_a_presigned_url_and_a_header_signature_of_one_key_are_one_account():
    url = presigned_put(KEY_A, T0)
    presigned = intent_of(facts_of("PUT", url, [], b"x", "text/plain"))
    assert presigned.account == intent_of(sigv4_attempt(KEY_A, T0, 1)).account


def test_a_session_credential_by_header_and_by_presigned_url_is_one_account():
    """A session credential's token goes with each of its signatures, as a header or in a presigned URL's query:
    it belongs to the signature, and the key id alone counts, however the key signs."""
    header = sigv4_attempt(SESSION, T0, 1)
    assert dict(header.headers)["X-Amz-Security-Token"] == SESSION.token
    url = presigned_put(SESSION, T0)
    assert "X-Amz-Security-Token=" in url
    presigned = intent_of(facts_of("PUT", url, [], b"x", "text/plain"))
    assert presigned.account == intent_of(header).account != ANONYMOUS


def test_sigv2_s3_header_and_query_services_sign_per_attempt_too():
    def s3_v2(creds: Credentials, date: str) -> RequestFacts:
        url = "https://bucket.s3.amazonaws.com/k"
        req = AWSRequest("PUT", url, data=b"v")
        with mock.patch.object(HmacV1Auth, "_get_date", return_value=date):
            HmacV1Auth(creds).add_auth(req)
        return facts_of("PUT", url, req.headers.items(), b"v", "text/plain")

    a, b = s3_v2(KEY_A, "Thu, 03 Dec 2026 16:00:00 GMT"), s3_v2(KEY_A, "Thu, 03 Dec 2026 16:00:05 GMT")
    assert dict(a.headers)["Authorization"] != dict(b.headers)["Authorization"]
    assert intent_of(a).account == intent_of(b).account == intent_of(sigv4_attempt(KEY_A, T0, 1)).account

    def query_v2(creds: Credentials, stamp: str) -> RequestFacts:
        req = AWSRequest("POST", "https://sdb.amazonaws.com/", data={"Action": "PutAttributes", "ItemName": "i1"})
        with mock.patch("botocore.auth.time") as clock:
            clock.strftime.return_value = stamp
            clock.gmtime.return_value = None
            SigV2Auth(creds).add_auth(req)
        body = "&".join(f"{k}={v}" for k, v in req.data.items()).encode()
        return facts_of("POST", "https://sdb.amazonaws.com/", [("Content-Type", FORM)], body)

    c, d = query_v2(KEY_A, "2026-12-03T16:00:00Z"), query_v2(KEY_A, "2026-12-03T16:00:09Z")
    assert c.body != d.body  # a new Timestamp and Signature in the form
    assert intent_of(c).intent_fingerprint == intent_of(d).intent_fingerprint
    assert intent_of(c).account == intent_of(d).account != intent_of(query_v2(KEY_B, "2026-12-03T16:00:00Z")).account


# The headers as each scheme's specification or SDK writes them: (first attempt, retry, another signer)
SCHEMES = {
    "sigv4a": (
        "AWS4-ECDSA-P256-SHA256 Credential=AKIAEXAMPLEKEYA00001/20261203/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date;x-amz-region-set, Signature=3045022100aa",
        "AWS4-ECDSA-P256-SHA256 Credential=AKIAEXAMPLEKEYA00001/20261203/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date;x-amz-region-set, Signature=3046022100bb",
        "AWS4-ECDSA-P256-SHA256 Credential=AKIAEXAMPLEKEYB00002/20261203/s3/aws4_request, "
        "SignedHeaders=host;x-amz-date;x-amz-region-set, Signature=3045022100aa",
    ),
    "goog4": (
        "GOOG4-HMAC-SHA256 Credential=GOOGTS7C7FUP3AIRVJTE2BCD/20261203/europe-west1/storage/goog4_request, "
        "SignedHeaders=host;x-goog-date, Signature=5a3d0b1c",
        "GOOG4-HMAC-SHA256 Credential=GOOGTS7C7FUP3AIRVJTE2BCD/20261203/europe-west1/storage/goog4_request, "
        "SignedHeaders=host;x-goog-date, Signature=77e1f00d",
        "GOOG4-HMAC-SHA256 Credential=GOOGOTHERKEY0000000000000/20261203/europe-west1/storage/goog4_request, "
        "SignedHeaders=host;x-goog-date, Signature=5a3d0b1c",
    ),
    "azure-sharedkey": (
        "SharedKey myaccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08=",
        "SharedKey myaccount:9Jq2DlCqE6c0Yr6nVb8mFOY7d7u2rN4W1xG0yY2hPjs=",
        "SharedKey otheraccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08=",
    ),
    "azure-sharedkeylite": (
        "SharedKeyLite myaccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08=",
        "SharedKeyLite myaccount:u3Gm0W9v5eU0pQ5cXUzY3n2s1Ywq8pZm4aD6yR5tQfA=",
        "SharedKeyLite otheraccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08=",
    ),
    "oauth1": (  # RFC 5849 3.5.1
        'OAuth realm="Example", oauth_consumer_key="9djdj82h48djs9d2", oauth_token="kkk9d7dh3k39sjv7", '
        'oauth_signature_method="HMAC-SHA1", oauth_timestamp="137131201", oauth_nonce="7d8f3e4a", '
        'oauth_signature="bYT5CMsGcbgUdFHObYMEfcx6bsw%3D"',
        'OAuth realm="Example", oauth_consumer_key="9djdj82h48djs9d2", oauth_token="kkk9d7dh3k39sjv7", '
        'oauth_signature_method="HMAC-SHA1", oauth_timestamp="137131209", oauth_nonce="19a0c2e1", '
        'oauth_signature="r6%2FTJjbCOr97%2F%2BUU0NsvSne7s5g%3D"',
        'OAuth realm="Example", oauth_consumer_key="9djdj82h48djs9d2", oauth_token="otheruser0000000", '
        'oauth_signature_method="HMAC-SHA1", oauth_timestamp="137131201", oauth_nonce="7d8f3e4a", '
        'oauth_signature="bYT5CMsGcbgUdFHObYMEfcx6bsw%3D"',
    ),
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_each_authorization_scheme_counts_its_signer_alone(scheme):
    first, retry, other = (
        intent_of(facts_of("POST", "https://api.example.com/v1/send", [("Authorization", v), ("Content-Type", FORM)], b"a=1"))
        for v in SCHEMES[scheme]
    )
    assert first.account == retry.account != ANONYMOUS
    assert first.account != other.account
    assert first.intent_fingerprint == retry.intent_fingerprint == other.intent_fingerprint


def test_azure_sdk_shared_key_signs_per_attempt_and_counts_by_account_name():
    from azure.core.pipeline import PipelineRequest
    from azure.core.pipeline.transport import HttpRequest
    from azure.storage.queue._shared.authentication import SharedKeyCredentialPolicy

    def signed(account: str, date: str) -> RequestFacts:
        url = f"https://{account}.queue.core.windows.net/jobs/messages"
        req = HttpRequest("POST", url, headers={"x-ms-date": date, "x-ms-version": "2021-02-12", "Content-Type": "application/xml"})
        SharedKeyCredentialPolicy(account, "a2V5" * 22).on_request(PipelineRequest(req, mock.Mock(options={})))
        return facts_of("POST", url, req.headers.items(), b"<QueueMessage><MessageText>hi</MessageText></QueueMessage>", "application/xml")

    a, b = signed("acct1", "Thu, 03 Dec 2026 16:00:00 GMT"), signed("acct1", "Thu, 03 Dec 2026 16:00:04 GMT")
    assert dict(a.headers)["Authorization"] != dict(b.headers)["Authorization"]
    assert intent_of(a).account == intent_of(b).account
    c = signed("acct2", "Thu, 03 Dec 2026 16:00:00 GMT")
    assert intent_of(c).account not in (intent_of(a).account, ANONYMOUS)


RFC9421_INPUT = 'sig1=("@method" "@authority" "content-digest");created=1618884473;keyid="test-key-ecc-p256";nonce="{n}"'


def test_http_message_signatures_count_the_key_id_alone():
    def signed(keyid: str, created: int, nonce: str, sig: str) -> RequestFacts:
        headers = [
            ("Signature-Input", RFC9421_INPUT.replace("1618884473", str(created)).replace("test-key-ecc-p256", keyid).format(n=nonce)),
            ("Signature", f"sig1=:{sig}:"),
            ("Content-Type", "application/json"),
        ]
        return facts_of("POST", "https://api.example.com/v1/pay", headers, b'{"amount": 5}', "application/json")

    a = intent_of(signed("test-key-ecc-p256", 1618884473, "b3k2pp5k7z", "wXcJHyPuzGjdL8k=="))
    b = intent_of(signed("test-key-ecc-p256", 1618884480, "9x0r3ma1pc", "Ma8yZ0e/Tq1zm3Q=="))
    c = intent_of(signed("test-key-rsa-pss", 1618884473, "b3k2pp5k7z", "wXcJHyPuzGjdL8k=="))
    assert a.account == b.account != ANONYMOUS
    assert a.account != c.account
    assert a.request_headers["signature"] == a.request_headers["signature-input"] == REDACTED


def test_the_draft_signature_header_names_its_signer():
    one = account_part("Signature", 'keyId="rsa-key-1",algorithm="hs2019",headers="(request-target) date",signature="abc="')
    two = account_part("Signature", 'keyId="rsa-key-1",algorithm="hs2019",headers="(request-target) date",signature="xyz="')
    assert one == two == ("signer", "httpsig:rsa-key-1")


def test_oauth1_in_the_query_and_in_a_form():
    def query(ts: str, nonce: str, sig: str, token: str = "kkk9d7dh3k39sjv7") -> str:
        return (
            f"https://api.example.com/1/statuses/update?status=hi&oauth_consumer_key=9djdj82h48djs9d2&oauth_token={token}"
            f"&oauth_signature_method=HMAC-SHA1&oauth_timestamp={ts}&oauth_nonce={nonce}&oauth_signature={sig}"
        )

    a = intent_of(facts_of("POST", query("137131201", "7d8f", "bYT5"), [], b""))
    b = intent_of(facts_of("POST", query("137131209", "19a0", "r6TJ"), [], b""))
    c = intent_of(facts_of("POST", query("137131201", "7d8f", "bYT5", token="otheruser"), [], b""))
    assert a.intent_fingerprint == b.intent_fingerprint == c.intent_fingerprint
    assert a.account == b.account != c.account
    form = b"status=hi&oauth_consumer_key=9djdj82h48djs9d2&oauth_token=t1&oauth_timestamp={}&oauth_nonce={}&oauth_signature={}"
    d = intent_of(facts_of("POST", "https://api.example.com/1/statuses/update", [("Content-Type", FORM)], form.replace(b"{}", b"1", 3)))
    e = intent_of(facts_of("POST", "https://api.example.com/1/statuses/update", [("Content-Type", FORM)], form.replace(b"{}", b"2", 3)))
    assert d.intent_fingerprint == e.intent_fingerprint and d.account == e.account != ANONYMOUS


def test_a_parameter_counts_as_a_signatures_only_beside_its_schemes_marker():
    pairs = [("expires", "2026-12-31"), ("signature", "yes")]
    assert split_pairs(pairs).kept == pairs  # no AWSAccessKeyId: these are the request's own fields
    signed = split_pairs([*pairs, ("AWSAccessKeyId", "AKIAEXAMPLEKEYA00001")])
    assert signed.kept == [] and signed.signers == [("signer", "aws:AKIAEXAMPLEKEYA00001")]


def test_a_bearer_token_still_counts_whole():
    a = intent_of(facts_of("POST", "https://api.example.com/v1/x", [("Authorization", "Bearer one")], b"a=1"))
    b = intent_of(facts_of("POST", "https://api.example.com/v1/x", [("Authorization", "Bearer two")], b"a=1"))
    assert a.account != b.account
    assert account_part("Authorization", "Bearer one") == ("authorization", "Bearer one")


def test_sdk_attempt_headers_count_for_nothing_even_when_configured_secret():
    policy = parse_config("defaults: {redact_headers: [amz-sdk-request, x-stainless-retry-count]}").policy_for("a.example", 443)

    def attempt(n: int) -> str:
        headers = [("Authorization", "Bearer t"), ("amz-sdk-request", f"attempt={n}; max=3"), ("x-stainless-retry-count", str(n))]
        return intent_of(facts_of("POST", "https://a.example/v1", headers, b"a=1"), policy).account

    assert attempt(1) == attempt(2)


IN_HOUSE = """
defaults:
  signing:
    signers: {X-Acme-Auth: 'key=(?P<signer>[A-Za-z0-9]+)'}
    per_attempt: [X-Acme-Time, acme_ts]
"""


def test_an_in_house_scheme_from_config():
    policy = parse_config(IN_HOUSE).policy_for("api.acme.example", 443)

    def signed(key: str, ts: str, sig: str):
        url = f"https://api.acme.example/v1/orders?acme_ts={ts}"
        headers = [("X-Acme-Auth", f"key={key},sig={sig}"), ("X-Acme-Time", ts)]
        return intent_of(facts_of("POST", url, headers, b"item=1"), policy)

    a, b, c = signed("k1", "100", "aaa"), signed("k1", "105", "bbb"), signed("k2", "100", "aaa")
    assert a.intent_fingerprint == b.intent_fingerprint == c.intent_fingerprint
    assert a.account == b.account != c.account
    assert a.request_headers["x-acme-auth"] == REDACTED  # a configured signer header is a secret
    without = parse_config("{}").policy_for("api.acme.example", 443)
    assert intent_of(facts_of("POST", "https://api.acme.example/v1/orders?acme_ts=100", [], b"item=1"), without).intent_fingerprint != (
        intent_of(facts_of("POST", "https://api.acme.example/v1/orders?acme_ts=105", [], b"item=1"), without).intent_fingerprint
    )


@pytest.mark.parametrize("pattern, problem", [("key=(", "not a regular expression"), ("key=(\\w+)", "(?P<signer>...)")])
def test_a_bad_signer_pattern_is_one_clear_line(pattern, problem):
    with pytest.raises(ConfigError) as e:
        parse_config(f"defaults: {{signing: {{signers: {{X-Acme-Auth: '{pattern}'}}}}}}")
    assert problem in str(e.value) and "signers.X-Acme-Auth" in str(e.value) and "\n" not in str(e.value)


def test_nothing_readable_of_a_signature_is_stored():
    facts = sigv4_attempt(SESSION, T0, 1)
    intent = intent_of(facts)
    text = repr(intent)
    for secret in (SESSION.access_key, SESSION.token, dict(facts.headers)["Authorization"].split("Signature=")[1]):
        assert secret not in text
    assert re.fullmatch(r"acct:[0-9a-f]{40}", intent.account)


def chunked_upload(seed: str) -> bytes:
    """An upload signed chunk by chunk (AWS's STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER): each chunk signature
    chains from the attempt's own seed signature."""
    sig = lambda n: (seed * 64)[n : n + 64]  # noqa: E731
    return (
        f"400;chunk-signature={sig(0)}\r\n".encode() + b"a" * 1024 + b"\r\n"
        + f"0;chunk-signature={sig(1)}\r\n".encode()
        + f"x-amz-checksum-crc32c:sOO8/Q==\r\nx-amz-trailer-signature:{sig(2)}\r\n\r\n".encode()
    )


def test_an_upload_signed_chunk_by_chunk_is_one_intent_across_attempts():
    headers = [("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"), ("Content-Encoding", "aws-chunked")]
    url = "https://bucket.s3.us-east-1.amazonaws.com/big.bin"

    def put(seed: str, body_headers=headers):
        return intent_of(facts_of("PUT", url, body_headers, chunked_upload(seed), "application/octet-stream"))

    a, b = put("ab12"), put("cd34")
    assert a.intent_fingerprint == b.intent_fingerprint
    assert b"chunk-signature" not in (a.request_body or b"") and "ab12ab12" not in repr(a)  # nor stored
    plain = [("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]
    assert put("ab12", plain).intent_fingerprint != put("cd34", plain).intent_fingerprint  # not a signed stream
