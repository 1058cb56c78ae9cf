"""config.yaml's `defaults:` and `hosts:`: what a host may set, and the signing schemes it adds. ReceiptsConfig
merges them into the rules' HostPolicy (rules/policy.py)."""

import re
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from proxy_addon import presets
from proxy_addon.rules.approvals import ApprovalSetting
from proxy_addon.rules.operations import OperationRule, ProtocolName
from proxy_addon.rules.policy import AfterSuccess, InFlight, UpstreamConnections
from proxy_addon.rules.redaction import SECRET_HEADER_NAMES
from proxy_addon.rules.signing import Signing
from proxy_addon.units import PositiveDuration, StrictModel

# The secret headers named outright; rules/redaction.py adds every name containing auth, token, key, ...
BUILTIN_SECRET_HEADERS = SECRET_HEADER_NAMES
DEFAULT_REDACT_FIELDS = ("password", "token", "secret", "api_key")


class SigningSettings(StrictModel):
    """An in-house per-request signing scheme, beside the recognised ones (rules/signing.py): `signers` maps a header
    to a pattern whose `signer` group is the key id (only it counts for the account; the header is a secret);
    `per_attempt` names headers, query and form fields that count for neither the account nor the identity."""

    signers: dict[str, str] = Field(default_factory=dict)
    per_attempt: list[str] = Field(default_factory=list)

    @field_validator("signers")
    @classmethod
    def _signer_patterns(cls, signers: dict[str, str]) -> dict[str, str]:
        for header, pattern in signers.items():
            try:
                compiled = re.compile(pattern)
            except re.error as e:
                raise ValueError(f"signers.{header}: not a regular expression: {e}") from None
            if "signer" not in compiled.groupindex:
                raise ValueError(f"signers.{header}: the pattern needs a (?P<signer>...) group naming the key id")
        return signers


def merge_signing(*layers: SigningSettings | None) -> Signing:
    """defaults, then the host: signers by header (the host's win), per_attempt names added together."""
    signers: dict[str, re.Pattern[str]] = {}
    per_attempt: set[str] = set()
    for layer in layers:
        if layer is None:
            continue
        signers.update({h.lower(): re.compile(p) for h, p in layer.signers.items()})
        per_attempt.update(n.lower() for n in layer.per_attempt)
    return Signing(signers, frozenset(per_attempt))


class HostOverrides(StrictModel):
    """What a host may set; anything left out comes from `defaults` (`upstream_deadline: null` on a host
    turns a default deadline off)."""

    upstream_timeout: PositiveDuration | None = None
    upstream_deadline: PositiveDuration | None = None
    connect_timeout: PositiveDuration | None = None
    upstream_keepalive: PositiveDuration | None = None
    upstream_connections: UpstreamConnections | None = None
    unknown_statuses: list[Annotated[int, Field(ge=100, le=599)]] | None = None
    after_success: AfterSuccess | None = None
    in_flight: InFlight | None = None
    redact_headers: list[str] | None = None
    redact_fields: list[str] | None = None
    inject_idempotency_key: bool | None = None
    idempotency_key_header: str | None = None
    journal: bool | None = None  # false: this host's traffic passes through (true: journal a model API too)
    protocol: ProtocolName | None = None
    signing: SigningSettings | None = None
    approval: ApprovalSetting | None = None  # `required`: a person approves each intent before it is forwarded


class Defaults(StrictModel):
    upstream_timeout: PositiveDuration = 30.0  # idle: the longest wait for the answer to begin, and between its reads
    upstream_deadline: PositiveDuration | None = None  # the whole exchange, when set
    connect_timeout: PositiveDuration = 10.0
    # an HTTP/1.1 connection idle this long is not used again (nor longer than the upstream's Keep-Alive: timeout);
    # an HTTP/2 one is checked with a PING first. Under the 5 s idle timeout of Apache, Node.js, uvicorn and
    # hypercorn by a second: their close cannot cross our request on the wire.
    upstream_keepalive: PositiveDuration = 4.0
    upstream_connections: UpstreamConnections = "reuse"  # fresh: a new connection (and handshake) per write
    unknown_statuses: list[Annotated[int, Field(ge=100, le=599)]] = Field(default_factory=lambda: [500, 502, 503, 504])
    after_success: AfterSuccess = AfterSuccess()
    in_flight: InFlight = InFlight()
    redact_headers: list[str] = Field(default_factory=list)
    redact_fields: list[str] = Field(default_factory=lambda: list(DEFAULT_REDACT_FIELDS))
    inject_idempotency_key: bool = False
    idempotency_key_header: str = "Idempotency-Key"
    journal: bool = True  # false: every host passes through unless its entry says journal: true
    protocol: ProtocolName = "auto"  # auto | rest | graphql | jsonrpc: how requests are read (protocols/)
    approval: ApprovalSetting = ApprovalSetting()  # not required unless a host or a rule says so
    signing: SigningSettings = SigningSettings()  # in-house per-request signatures (rules/signing.py knows the common ones)


class HostConfig(HostOverrides):
    preset: str | None = None  # tested operation and read rules for a known API (presets/); the host's own keys win
    operations: list[OperationRule] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return presets.with_preset(data) if isinstance(data, dict) else data

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and name not in presets.known_presets():
            raise ValueError(presets.unknown_preset(name))
        return name
