"""The settings in force for one host (HostPolicy: config.yaml's `defaults` merged with the host's own entry, by
config/), and the operation rule a request matches in them (`match_rule`). Pure: what every rule reads of a
host's settings comes in as this data."""

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from proxy_addon.rules.approvals import NO_APPROVAL, ApprovalSetting
from proxy_addon.rules.operations import OperationRule, ProtocolName
from proxy_addon.rules.redaction import SecretFields, SecretHeaders
from proxy_addon.rules.signing import NO_SIGNING, Signing
from proxy_addon.units import Duration, PositiveDuration, StrictModel

Query = Sequence[tuple[str, str]]  # a request's query, parsed: (name, value) in order

UpstreamConnections = Literal["reuse", "fresh"]


class AfterSuccess(StrictModel):
    policy: Literal["replay", "refuse", "allow"] = "replay"
    window: Duration = 900.0


class InFlight(StrictModel):
    """A repeat of a write whose receipt is still in flight (planned or submitted): `refuse` it (409
    duplicate-open), or `wait` up to `max_wait` for the original's verdict and answer it as a repeat after it."""

    policy: Literal["refuse", "wait"] = "refuse"
    max_wait: PositiveDuration = 30.0


@dataclass(frozen=True)
class HostPolicy:
    """The settings in force for one host (defaults merged with the host's own), with its operation rules."""

    upstream_timeout: float
    upstream_deadline: float | None
    connect_timeout: float
    unknown_statuses: frozenset[int]
    after_success: AfterSuccess
    in_flight: InFlight
    redact_headers: SecretHeaders  # the configured ones; `name in` applies rules/redaction.py's whole rule
    redact_fields: SecretFields
    inject_idempotency_key: bool
    idempotency_key_header: str
    operations: tuple[OperationRule, ...]
    journal: bool = True  # false: passes through (the host's `journal: false`, or a model API)
    protocol: ProtocolName = "auto"
    model_api: bool = False  # a well-known model API host (rules/hosts.py)
    signing: Signing = NO_SIGNING
    upstream_keepalive: float = 4.0  # an idle connection is used again only within this (and the upstream's bound)
    upstream_connections: UpstreamConnections = "reuse"  # fresh: a new connection per write
    approval: ApprovalSetting = NO_APPROVAL  # a rule's own `approval` wins (rules/approvals.py)

    def match_operation(self, method: str, path: str) -> tuple[OperationRule, dict[str, str]] | None:
        for rule in self.operations:
            if rule.method != method:
                continue
            m = rule.path_regex.match(path)
            if m:
                return rule, m.groupdict()
        return None


def match_rule(
    policy: HostPolicy, method: str, path: str, name: str | None, query: Query = ()
) -> tuple[OperationRule, dict[str, str]] | None:
    """The operation rule for a request, with its path parameters: the first naming this call, else the route's
    (a rule's `query` must hold too)."""
    route_match = None
    for rule in policy.operations:
        if rule.method != method or (rule.call is not None and (name is None or not fnmatchcase(name, rule.call))):
            continue
        if not rule.matches_query(query):
            continue
        m = rule.path_regex.match(path)
        if m is None:
            continue
        if rule.call is not None:
            return rule, m.groupdict()
        if route_match is None:
            route_match = rule, m.groupdict()
    return route_match
