"""config.yaml: loading, validation (one clear line naming the key), and the per-host policy lookups.

Everything is parsed once at load: durations, JSON paths and path templates are compiled here, so that
the request path never re-reads or re-parses configuration. A module per concern: hosts.py (`defaults:` and
`hosts:`), sections.py (every other section), receipts_config.py (the whole file, `policy_for`), loading.py
(reading, validating, anchoring its paths). What a host's settings come to is the rules' HostPolicy
(rules/policy.py). Every public name is importable from here.
"""

from proxy_addon.config.hosts import (
    BUILTIN_SECRET_HEADERS,
    DEFAULT_REDACT_FIELDS,
    Defaults,
    HostConfig,
    HostOverrides,
    SigningSettings,
    merge_signing,
)
from proxy_addon.config.loading import admin_settings, anchor_paths, describe_validation_error, load_config, parse_config
from proxy_addon.config.receipts_config import ReceiptsConfig
from proxy_addon.config.sections import (
    AGENT_API_HOST,
    MIN_ADMIN_TOKEN_LENGTH,
    RENAMED_PROXY_KEYS,
    AdminSettings,
    AgentAPISettings,
    AuditSettings,
    DatabaseSettings,
    LoggingSettings,
    ProxySettings,
    ReconcileSettings,
    RetentionSettings,
)
from proxy_addon.rules.policy import AfterSuccess, HostPolicy, InFlight, UpstreamConnections

__all__ = [
    "AGENT_API_HOST",
    "BUILTIN_SECRET_HEADERS",
    "DEFAULT_REDACT_FIELDS",
    "MIN_ADMIN_TOKEN_LENGTH",
    "RENAMED_PROXY_KEYS",
    "AdminSettings",
    "AfterSuccess",
    "AgentAPISettings",
    "AuditSettings",
    "DatabaseSettings",
    "Defaults",
    "HostConfig",
    "HostOverrides",
    "HostPolicy",
    "InFlight",
    "LoggingSettings",
    "ProxySettings",
    "ReceiptsConfig",
    "ReconcileSettings",
    "RetentionSettings",
    "SigningSettings",
    "UpstreamConnections",
    "admin_settings",
    "anchor_paths",
    "describe_validation_error",
    "load_config",
    "merge_signing",
    "parse_config",
]
