"""config.yaml: loading, validation (one clear line naming the key), and the per-host policy lookups.

Everything is parsed once at load: durations, JSON paths and path templates are compiled here, so that
the request path never re-reads or re-parses configuration.
"""

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from proxy_addon import presets
from proxy_addon.db import DEFAULT_DATABASE_URL, anchor_sqlite_url
from proxy_addon.exceptions import ConfigError
from proxy_addon.log import get_logger
from proxy_addon.protocols.hosts import check_host_key, find_host_entry, is_model_api
from proxy_addon.rules.approvals import NO_APPROVAL, ApprovalSetting
from proxy_addon.rules.operations import MUTATING_METHODS, OperationRule, ProtocolName, method_token
from proxy_addon.rules.redaction import SECRET_HEADER_NAMES, SecretFields, SecretHeaders
from proxy_addon.rules.signing import NO_SIGNING, Signing
from proxy_addon.units import Duration, PositiveDuration, Size, StrictModel

# The secret headers named outright; rules/redaction.py adds every name containing auth, token, key, ...
BUILTIN_SECRET_HEADERS = SECRET_HEADER_NAMES
DEFAULT_REDACT_FIELDS = ("password", "token", "secret", "api_key")
MIN_ADMIN_TOKEN_LENGTH = 16
RENAMED_PROXY_KEYS = {"journal_threads": "database_threads"}  # old name: new name


class AfterSuccess(StrictModel):
    policy: Literal["replay", "refuse", "allow"] = "replay"
    window: Duration = 900.0


class InFlight(StrictModel):
    """A repeat of a write whose receipt is still in flight (planned or submitted): `refuse` it (409
    duplicate-open), or `wait` up to `max_wait` for the original's verdict and answer it as a repeat after it."""

    policy: Literal["refuse", "wait"] = "refuse"
    max_wait: PositiveDuration = 30.0


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


UpstreamConnections = Literal["reuse", "fresh"]


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


class DatabaseSettings(StrictModel):
    url: str | None = None


class ProxySettings(StrictModel):
    methods: list[str] = Field(default_factory=lambda: list(MUTATING_METHODS))
    fail_open: bool = False
    max_body: Size = 32 * 1024 * 1024  # a journaled body longer than this: 413, nothing forwarded
    journal_timeout: PositiveDuration = 15.0  # the longest a write waits for its receipt: then 503, never forwarded
    max_stored_body: Size = 65536
    max_stored_response: Size = 65536
    heartbeat_interval: Duration = 5.0
    instance_dead_after: Duration = 15.0
    database_threads: int = Field(default=8, ge=1, le=64)  # the store's reads and general writes, off the event loop
    pass_model_apis: bool = True  # well-known model API hosts pass through unless their entry says journal: true
    # a succeeded or outcome_unknown verdict commits while its answer travels (request/handler.py); false: every
    # verdict commits before its answer
    answer_first: bool = True

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        return [method_token(m) for m in methods]  # any method token: PURGE and MKCOL as well as POST

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Keys that were renamed keep working, with one deprecation line in the log."""
        if not isinstance(data, dict):
            return data
        for old, new in RENAMED_PROXY_KEYS.items():
            if old in data:
                if new in data:
                    raise ValueError(f"proxy.{old} is the old name of proxy.{new}: give only proxy.{new}")
                get_logger("receipts.config").warning("config_key_deprecated", key=f"proxy.{old}", use=f"proxy.{new}")
                data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data


class ReconcileSettings(StrictModel):
    interval: Duration = 10.0
    in_proxy: bool = False
    lease: Duration = 60.0
    concurrency: int = Field(default=4, ge=1, le=64)
    per_host_rate: float = Field(default=5.0, gt=0)
    batch_size: int = Field(default=50, ge=1, le=1000)
    backoff: Duration = 5.0
    verify_tls: bool = True


class AdminSettings(StrictModel):
    """The admin HTTP server (JSON API, review page, /metrics): off unless enabled; a token when not on loopback."""

    enabled: bool = False
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(default=8081, ge=0, le=65535)
    token_env: str = Field(default="RECEIPTS_ADMIN_TOKEN", min_length=1)

    @property
    def token(self) -> str | None:
        """Read from the environment variable `token_env` (surrounding whitespace aside); never kept in the
        config file."""
        return (os.environ.get(self.token_env) or "").strip() or None

    @property
    def loopback(self) -> bool:
        if self.listen_host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.listen_host.strip("[]")).is_loopback
        except ValueError:
            return False

    @model_validator(mode="after")
    def _token_when_exposed(self) -> "AdminSettings":
        if not self.loopback and not self.token:
            raise ValueError(
                f"listen_host {self.listen_host} is not a loopback address, so a token is required: "
                f"set {self.token_env} (or listen on 127.0.0.1)"
            )
        token = os.environ.get(self.token_env)
        if self.enabled and token is not None and token != "" and len(token.strip()) < MIN_ADMIN_TOKEN_LENGTH:
            raise ValueError(
                f"{self.token_env} is too short ({len(token.strip())} characters, whitespace aside): "
                f"use at least {MIN_ADMIN_TOKEN_LENGTH}, e.g. $(openssl rand -hex 16)"
            )
        return self


class LoggingSettings(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class AuditSettings(StrictModel):
    # the Ed25519 key `receipts checkpoint` signs with, made on first use, its public key beside it as `.pub`;
    # relative to the config file's directory (load_config), like secret_file
    signing_key_file: str = ".receipts-audit-key"


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
    model_api: bool = False  # a well-known model API host (protocols/hosts.py)
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


class RetentionSettings(StrictModel):
    """`retention:`, off when absent: terminal receipts older than `terminal` (a host's own age in `hosts`) are
    pruned in the background by the proxy, a batch at a time, every `interval` (store/retention.py)."""

    terminal: PositiveDuration
    interval: PositiveDuration = 3600.0
    hosts: dict[str, PositiveDuration] = Field(default_factory=dict)

    @field_validator("hosts")
    @classmethod
    def _lower_hosts(cls, hosts: dict[str, float]) -> dict[str, float]:
        return {check_host_key(k): v for k, v in hosts.items()}


class ReceiptsConfig(StrictModel):
    database: DatabaseSettings = DatabaseSettings()
    defaults: Defaults = Defaults()
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    proxy: ProxySettings = ProxySettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()
    audit: AuditSettings = AuditSettings()
    retention: RetentionSettings | None = None
    secret_file: str = ".receipts-secret"  # relative to the config file's directory (load_config)

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        """A section left with only comments (`hosts:`) is empty, not an error."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @field_validator("hosts")
    @classmethod
    def _lower_hosts(cls, hosts: dict[str, HostConfig]) -> dict[str, HostConfig]:
        return {check_host_key(k): v for k, v in hosts.items()}

    def model_post_init(self, _context: Any) -> None:
        object.__setattr__(self, "_policies", {})

    def policy_for(self, host: str, port: int) -> HostPolicy:
        """`host:port` wins over `host`; both inherit `defaults`. Cached: config is immutable once loaded."""
        key = (host.lower(), port)
        cache: dict[tuple[str, int], HostPolicy] = self._policies  # type: ignore[attr-defined]
        policy = cache.get(key)
        if policy is None:
            policy = cache[key] = self._build_policy(*key)
        return policy

    def _build_policy(self, host: str, port: int) -> HostPolicy:
        entry = find_host_entry(self.hosts, host, port) or HostConfig()  # host:port > host > longest *.suffix
        d = self.defaults

        def pick(name: str) -> Any:
            value = getattr(entry, name)
            return getattr(d, name) if value is None else value

        signing = merge_signing(d.signing, entry.signing)

        return HostPolicy(
            upstream_timeout=pick("upstream_timeout"),
            # None is "inherit" for every other key; a host that writes `upstream_deadline: null` means "none"
            upstream_deadline=entry.upstream_deadline if "upstream_deadline" in entry.model_fields_set else d.upstream_deadline,
            connect_timeout=pick("connect_timeout"),
            upstream_keepalive=pick("upstream_keepalive"),
            upstream_connections=pick("upstream_connections"),
            unknown_statuses=frozenset(pick("unknown_statuses")),
            after_success=pick("after_success"),
            in_flight=pick("in_flight"),
            redact_headers=SecretHeaders(h.lower() for h in [*d.redact_headers, *(entry.redact_headers or []), *signing.signers]),
            redact_fields=SecretFields(f.lower() for f in [*d.redact_fields, *(entry.redact_fields or [])]),
            inject_idempotency_key=pick("inject_idempotency_key"),
            idempotency_key_header=pick("idempotency_key_header"),
            operations=tuple(entry.operations),
            signing=signing,
            approval=pick("approval"),
            **self._journal_policy(entry, host),
        )

    def _journal_policy(self, entry: HostConfig, host: str) -> dict[str, Any]:
        """Whether the host is journaled, and how its requests are read: a model API passes through unless
        its own entry says journal: true (or proxy.pass_model_apis is false)."""
        model_api = self.proxy.pass_model_apis and entry.journal is None and is_model_api(host)
        journal = entry.journal if entry.journal is not None else self.defaults.journal and not model_api
        return {"journal": journal, "protocol": entry.protocol or self.defaults.protocol, "model_api": model_api}


def load_config(path: str | Path) -> ReceiptsConfig:
    """Read and validate a config file; any problem is one ConfigError line naming the file and the key.

    Relative paths in it (a `sqlite:///relative.db` URL, `secret_file`, and their defaults) are made absolute
    against the file's own directory, so every command finds the same database wherever it is run from."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None
    return parse_config(text, source=str(path), base_dir=path.absolute().parent)


def anchor_paths(config: ReceiptsConfig, base_dir: Path) -> ReceiptsConfig:
    """The config with its relative paths taken from `base_dir`: `database.url` (a relative SQLite file; when
    unset, the default `sqlite:///receipts.db`), `secret_file` and `audit.signing_key_file`.
    `RECEIPTS_DATABASE_URL` is not touched."""
    database = config.database.model_copy(update={"url": anchor_sqlite_url(config.database.url or DEFAULT_DATABASE_URL, base_dir)})
    secret_file = str(base_dir / Path(config.secret_file).expanduser())
    key_file = str(base_dir / Path(config.audit.signing_key_file).expanduser())
    audit = config.audit.model_copy(update={"signing_key_file": key_file})
    anchored = config.model_copy(update={"database": database, "secret_file": secret_file, "audit": audit})
    object.__setattr__(anchored, "_policies", {})  # not the original's cache
    return anchored


def parse_config(text: str, source: str = "config", base_dir: Path | None = None) -> ReceiptsConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{source}: {where}invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of keys (database, defaults, hosts, ...)")
    try:
        config = ReceiptsConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_validation_error(e)}") from None
    return config if base_dir is None else anchor_paths(config, base_dir)


def admin_settings(config: ReceiptsConfig, **overrides: Any) -> AdminSettings:
    """The config's admin section with command-line overrides (None: keep), validated again."""
    data = {**config.admin.model_dump(), **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return AdminSettings.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"admin: {describe_validation_error(e).removeprefix('config: ')}") from None


def describe_validation_error(e: ValidationError) -> str:
    err = e.errors(include_url=False)[0]
    loc = ".".join(
        str(p) if str(p).isprintable() else repr(p)  # a key with a line break must not break the one line
        for p in err["loc"]
        if not (isinstance(p, str) and p.startswith("function-"))
    )
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key"
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    msg = " ".join(err["msg"].splitlines())
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{loc or 'config'}: {msg}{more}"
