"""Requests signed per attempt: who signs counts for the account; the signature, its dates and nonces for nothing.

An SDK signs every attempt of a call anew: AWS SigV4 computes a new signature over a new `X-Amz-Date`, OAuth 1.0a
draws a new nonce and timestamp, RFC 9421 stamps `created`. If those parts counted the way every other secret
header counts for the account (rules/redaction.py), each attempt of one call would be a new account, so a new intent,
and the SDK's own retry of a timed-out write would be forwarded. So for a recognised scheme only the signer
counts: its key id (hashed with the account key, like any credential) for the account, and the per-attempt parts
for neither the account nor the intent's identity. Two signers stay two accounts.

Recognised, in the `Authorization` header: AWS SigV4 and SigV4a (`AWS4-HMAC-SHA256`, `AWS4-ECDSA-P256-SHA256`),
S3's SigV2 (`AWS`) and SigV3 (`X-Amzn-Authorization: AWS3-HTTPS`), Google Cloud Storage HMAC (`GOOG4-HMAC-SHA256`, `GOOG4-RSA-SHA256`, `GOOG1`), Azure Storage
`SharedKey` and `SharedKeyLite`, OAuth 1.0a (`OAuth`); HTTP Message Signatures (RFC 9421 `Signature-Input` and
`Signature`, and the older `Signature: keyId=...` draft); and signatures in a query or a form (presigned URLs'
`X-Amz-*` and `X-Goog-*`, SigV2's `AWSAccessKeyId` with its `Signature` and `Timestamp`, OAuth 1.0a's `oauth_*`). One AWS key is one account however it signs (header or
presigned URL, SigV4 or SigV2). An in-house scheme is declared in config (`signing`, `SigningSettings`).

Headers that change per attempt but are not secret (`amz-sdk-request`, `x-stainless-retry-count`...) never
counted: only a request's body, method, target and query make its identity. They are listed here so that a
configured `redact_headers` cannot make them count for the account either.
"""

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

SIGNER = "signer"  # the name a signer's key id is hashed under for the account (beside the other credentials)

# Never count for the account, even when secret: parts of a signature or of an SDK's attempt.
PER_ATTEMPT_HEADERS = frozenset(
    {
        "signature",  # RFC 9421: the signature itself (the draft's `keyId=` form names its signer: below)
        "x-amz-date",
        "x-amz-security-token",  # a session credential of the access key id, which counts instead
        "x-amz-content-sha256",  # body-derived: the body counts for itself
        "x-goog-date",
        "x-ms-date",
        "date",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "x-amz-user-agent",
        "x-ms-client-request-id",
        "x-stainless-retry-count",
        "x-stainless-read-timeout",
        "x-stainless-timeout",
        "x-stripe-client-telemetry",
    }
)

# Query (and form) parameters of a signature, by the parameter that marks the scheme: the marker's scheme
# family, the parameter naming the signer (its value up to the first `/` is the key id), and the per-attempt
# parameters that count for nothing.
@dataclass(frozen=True)
class QueryScheme:
    family: str
    marker: str
    signer: tuple[str, ...]
    per_attempt: frozenset[str]


_AWS_V4_QUERY = frozenset(
    {
        "x-amz-algorithm",
        "x-amz-credential",
        "x-amz-date",
        "x-amz-expires",
        "x-amz-signedheaders",
        "x-amz-signature",
        "x-amz-security-token",
        "x-amz-region-set",
    }
)
QUERY_SCHEMES = (
    QueryScheme("aws", "x-amz-credential", ("x-amz-credential",), _AWS_V4_QUERY),
    QueryScheme(  # SigV2: S3's presigned URLs, and the query services' signed parameters (in a query or a form)
        "aws",
        "awsaccesskeyid",
        ("awsaccesskeyid",),
        frozenset(
            {
                "awsaccesskeyid",
                "signature",
                "signatureversion",
                "signaturemethod",
                "timestamp",
                "expires",
                "securitytoken",
                "x-amz-security-token",
            }
        ),
    ),
    QueryScheme("goog", "x-goog-credential", ("x-goog-credential",), frozenset(n.replace("amz", "goog") for n in _AWS_V4_QUERY)),
    QueryScheme(
        "oauth1",
        "oauth_signature",
        ("oauth_consumer_key", "oauth_token"),
        frozenset(
            {
                "oauth_consumer_key",
                "oauth_token",
                "oauth_signature",
                "oauth_signature_method",
                "oauth_timestamp",
                "oauth_nonce",
                "oauth_version",
            }
        ),
    ),
)

_AUTH_CREDENTIAL = re.compile(r"(?i)^\s*(AWS4|GOOG4)-[A-Z0-9-]+\s+.*?\bCredential\s*=\s*([^/,\s]+)")
_AUTH_KEY_COLON = re.compile(r"(?i)^\s*(AWS|GOOG1|SharedKey|SharedKeyLite)\s+([^:\s]+):")
_AUTH_AWS3 = re.compile(r"(?i)^\s*(AWS)3(?:-HTTPS)?\s+.*?\bAWSAccessKeyId\s*=\s*([^,\s]+)")
_AUTH_OAUTH = re.compile(r"(?i)^\s*OAuth\s+")
_OAUTH_PARAM = re.compile(r'(?i)\b(oauth_consumer_key|oauth_token)\s*=\s*"([^"]*)"')
_KEYID = re.compile(r'(?i)\bkeyid\s*=\s*"([^"]*)"')
_FAMILY = {"aws4": "aws", "aws": "aws", "goog4": "goog", "goog1": "goog", "sharedkey": "azure", "sharedkeylite": "azure"}


@dataclass(frozen=True)
class Signing:
    """The in-house schemes configured for a host (`signing` in config.yaml), beside the recognised ones."""

    # by lower-cased header name: the `signer` group of its pattern is the key id that counts for the account
    signers: Mapping[str, re.Pattern[str]] = field(default_factory=dict)
    per_attempt: frozenset[str] = frozenset()  # lower-cased header, query or form field names

    def header_per_attempt(self, name: str) -> bool:
        return name in PER_ATTEMPT_HEADERS or name in self.per_attempt


NO_SIGNING = Signing()


def account_part(name: str, value: str, signing: Signing = NO_SIGNING) -> tuple[str, str] | None:
    """What one credential header contributes to the account: `(name, value)` for a plain credential (an API
    key, a bearer token), `(SIGNER, family:key id)` for a per-attempt signature, None for a per-attempt part."""
    n = name.lower()
    configured = signing.signers.get(n)
    if configured is not None:
        m = configured.search(value)
        return (SIGNER, f"{n}:{m.group('signer')}") if m else (n, value)
    if signing.header_per_attempt(n) and not (n == "signature" and _KEYID.search(value)):
        return None
    if n in ("authorization", "x-amzn-authorization"):
        return _authorization_signer(value) or (n, value)
    if n in ("signature-input", "signature"):  # RFC 9421 labels' key ids, or the draft's keyId
        keyids = sorted(set(_KEYID.findall(value)))
        return (SIGNER, "httpsig:" + ",".join(keyids)) if keyids else None
    return (n, value)


def _authorization_signer(value: str) -> tuple[str, str] | None:
    m = _AUTH_CREDENTIAL.match(value) or _AUTH_KEY_COLON.match(value) or _AUTH_AWS3.match(value)
    if m:
        return SIGNER, f"{_FAMILY[m.group(1).lower()]}:{m.group(2)}"
    if _AUTH_OAUTH.match(value):
        params = {k.lower(): v for k, v in _OAUTH_PARAM.findall(value)}
        if "oauth_consumer_key" in params:
            return SIGNER, f"oauth1:{params['oauth_consumer_key']}:{params.get('oauth_token', '')}"
    return None


_CHUNK_SIGNATURE = re.compile(rb";chunk-signature=[0-9a-fA-F]*")
_TRAILER_SIGNATURE = re.compile(rb"(?im)^x-amz-trailer-signature:[0-9a-fA-F]*\r?\n")


def unsigned_body(headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """A body AWS signs chunk by chunk (`x-amz-content-sha256: STREAMING-AWS4-...`, as the Java and JavaScript
    SDKs send an upload) without its chunk and trailer signatures, which chain from the attempt's own signature;
    any other body as it is."""
    content_sha = next((v for n, v in headers if n.lower() == "x-amz-content-sha256"), "")
    if not content_sha.upper().startswith("STREAMING-AWS4-"):
        return body
    return _TRAILER_SIGNATURE.sub(b"", _CHUNK_SIGNATURE.sub(b"", body))


@dataclass(frozen=True)
class SignedPairs:
    """Query or form pairs split: what counts for the identity, and the signers that count for the account."""

    kept: list[tuple[str, str]]
    signers: list[tuple[str, str]]


def split_pairs(pairs: Iterable[tuple[str, str]], signing: Signing = NO_SIGNING) -> SignedPairs:
    """Take a presigned URL's (or a signed form's) signature parameters out of what counts for the identity,
    keeping the signer for the account. A parameter counts as a signature's only when the scheme's marker is
    there too: `expires` in an unsigned query is the request's own."""
    pairs = list(pairs)
    names = {k.lower() for k, _ in pairs}
    drop = set(signing.per_attempt)
    signers: list[tuple[str, str]] = []
    for scheme in QUERY_SCHEMES:
        if scheme.marker not in names:
            continue
        drop |= scheme.per_attempt
        ids = [v.split("/", 1)[0] for k, v in pairs if k.lower() in scheme.signer]
        signers.append((SIGNER, f"{scheme.family}:{':'.join(ids)}"))
    if not drop:
        return SignedPairs(pairs, [])
    return SignedPairs([(k, v) for k, v in pairs if k.lower() not in drop], signers)
