"""From a request to an intent: what the proxy read off the request, and the Intent it journals for it.

Pure: no network, no database. The request comes in as data (`RequestRead`: protocols/facts.py's RequestFacts
is one), its protocol's part with it (`ProtocolCall`: the operation name, the name a rule's `call` matches, and
the write's identity in its body). The fingerprint is rules/fingerprint.py's, what is secret rules/redaction.py's, the account
rules/account.py's; this module puts them together for one request.
"""

import re
from typing import Protocol
from urllib.parse import urlencode

from proxy_addon.rules.account import AccountHasher
from proxy_addon.rules.fingerprint import BodyIdentity, analyse_body, identity_pairs, intent_fingerprint
from proxy_addon.rules.operations import OperationRule
from proxy_addon.rules.policy import HostPolicy, match_rule
from proxy_addon.rules.records import Intent
from proxy_addon.rules.redaction import redact_headers, redact_pairs
from proxy_addon.rules.signing import split_pairs, unsigned_body

_ID_SEGMENT = re.compile(r"^(\d+|[0-9a-fA-F-]{16,}|[A-Za-z0-9_-]{24,})$")


class ProtocolCall(Protocol):
    """What the request's protocol says of it (protocols/base.py's Call)."""

    @property
    def operation(self) -> str | None: ...  # the operation name it gives (None: the rule's, or METHOD host path)

    @property
    def name(self) -> str | None: ...  # what a rule's `call` matches

    def identity(self, body: BodyIdentity, rule: OperationRule | None) -> BodyIdentity: ...


class RequestRead(Protocol):
    """What the proxy read off the request, decoded for identity (protocols/facts.py's RequestFacts)."""

    @property
    def method(self) -> str: ...

    @property
    def scheme(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def path(self) -> str: ...  # without the query

    @property
    def query(self) -> list[tuple[str, str]]: ...

    @property
    def headers(self) -> list[tuple[str, str]]: ...

    @property
    def content_type(self) -> str | None: ...

    @property
    def body(self) -> bytes: ...  # Content-Encoding undone

    @property
    def call(self) -> ProtocolCall: ...

    @property
    def agent(self) -> str | None: ...  # who sent it, as proxy authentication named it; None: anonymous


def operation_name(facts: RequestRead, rule: OperationRule | None) -> str:
    """The rule's name, else `METHOD host path-template` with id-like segments shown as `{id}`."""
    if rule is not None:
        return rule.name
    segments = ["{id}" if _ID_SEGMENT.match(s) else s for s in facts.path.split("/")]
    return f"{facts.method} {facts.host} {'/'.join(segments)}"


def build_intent(
    facts: RequestRead,
    policy: HostPolicy,
    hasher: AccountHasher,
    instance_id: str,
    max_stored_body: int,
    idempotency_key: str | None,
    operation_id: str,
) -> tuple[Intent, OperationRule | None]:
    """The intent to journal for this request (fingerprint, account, redacted copy) and the rule it matched."""
    matched = match_rule(policy, facts.method, facts.path, facts.call.name, facts.query)  # a rule may name the protocol's call
    rule = matched[0] if matched else None
    body = analyse_body(
        facts.content_type,
        unsigned_body(facts.headers, facts.body),
        policy.redact_fields,
        rule.fingerprint if rule else None,
        hasher.digest,
        policy.signing,
    )
    body = facts.call.identity(body, rule)  # GraphQL, MCP: the protocol's identity of the write
    query = redact_pairs(facts.query, policy.redact_fields)
    signed_query = split_pairs(facts.query, policy.signing)  # a presigned URL's signature counts for nothing
    identity_query = identity_pairs(signed_query.kept, policy.redact_fields, hasher.digest)
    fingerprint = intent_fingerprint(facts.method, facts.host, facts.port, facts.path, identity_query, body)
    # the host's idempotency key header is the agent's key for one write, never its credential
    key_header = policy.idempotency_key_header.lower()
    account = hasher.account_of(
        [(n, v) for n, v in facts.headers if n.lower() != key_header],
        policy.redact_headers,
        policy.signing,
        signed_query.signers + list(body.signers),
    )
    stored = body.stored
    intent = Intent(
        operation_id=operation_id,
        operation=facts.call.operation or operation_name(facts, rule),
        method=facts.method,
        scheme=facts.scheme,
        host=facts.host.lower(),
        port=facts.port,
        path=facts.path,
        query=urlencode(query) or None,
        intent_fingerprint=fingerprint,
        account=account,
        idempotency_key=idempotency_key,
        request_headers=redact_headers(facts.headers, policy.redact_headers),
        request_body=stored[:max_stored_body] if stored else None,
        request_body_size=len(facts.body),
        request_body_truncated=len(stored) > max_stored_body,
        body_note=body.note,
        proxy_instance=instance_id,
        agent=facts.agent,  # recorded, never part of the fingerprint or the account (agents/identity.py says why)
    )
    return intent, rule
