"""ReceiptsConfig: config.yaml as a whole, section by section, and the settings in force for a host (`policy_for`)."""

from typing import Any

from pydantic import Field, field_validator, model_validator

from proxy_addon.agents.settings import Agents, check_required
from proxy_addon.config.hosts import Defaults, HostConfig, merge_signing
from proxy_addon.config.sections import (
    AdminSettings,
    AgentAPISettings,
    AuditSettings,
    DatabaseSettings,
    LoggingSettings,
    ProxySettings,
    ReconcileSettings,
    RetentionSettings,
)
from proxy_addon.rules.hosts import check_host_key, find_host_entry, is_model_api
from proxy_addon.rules.policy import HostPolicy
from proxy_addon.rules.redaction import SecretFields, SecretHeaders
from proxy_addon.units import StrictModel


class ReceiptsConfig(StrictModel):
    database: DatabaseSettings = DatabaseSettings()
    defaults: Defaults = Defaults()
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    proxy: ProxySettings = ProxySettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    admin: AdminSettings = AdminSettings()
    agent_api: AgentAPISettings = AgentAPISettings()
    logging: LoggingSettings = LoggingSettings()
    audit: AuditSettings = AuditSettings()
    retention: RetentionSettings | None = None
    agents: Agents = Field(default_factory=dict)  # NAME: {token_hash: ...} (agents/settings.py)
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

    @model_validator(mode="after")
    def _agents_to_require(self) -> "ReceiptsConfig":
        check_required(self.proxy.require_agent, self.agents)
        return self

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
