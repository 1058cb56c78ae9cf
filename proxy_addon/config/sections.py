"""config.yaml's sections other than the hosts and the agents: database, proxy, reconcile, admin, agent_api,
logging, audit, retention."""

import ipaddress
import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from proxy_addon.log import get_logger
from proxy_addon.rules.hosts import check_host_key
from proxy_addon.rules.operations import MUTATING_METHODS, method_token
from proxy_addon.units import Duration, PositiveDuration, Size, StrictModel

MIN_ADMIN_TOKEN_LENGTH = 16
RENAMED_PROXY_KEYS = {"journal_threads": "database_threads"}  # old name: new name


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
    require_agent: bool = False  # true: 407 for a request without a configured agent's identity (agents/identity.py)

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


AGENT_API_HOST = "receipts.internal"
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class AgentAPISettings(StrictModel):
    """The agent's own receipts, answered by the proxy itself at a reserved host name (proxy_addon/agent_api/): read
    only, never forwarded nor journaled. On unless `enabled: false`; a request to the host then goes upstream."""

    enabled: bool = True
    host: str = AGENT_API_HOST

    @field_validator("host")
    @classmethod
    def _host_name(cls, host: str) -> str:
        name = host.strip().lower().rstrip(".")
        if not _HOST_NAME.match(name):
            raise ValueError(f"{host!r} is not a host name (letters, digits, dots and dashes; no scheme or port)")
        return name

    def receipt_url(self, operation_id: str) -> str | None:
        """Where the agent asks for this receipt (every problem+json naming a receipt gives it); None when off."""
        return f"http://{self.host}/receipts/{operation_id}" if self.enabled else None


class LoggingSettings(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class AuditSettings(StrictModel):
    # the Ed25519 key `receipts checkpoint` signs with, made on first use, its public key beside it as `.pub`;
    # relative to the config file's directory (load_config), like secret_file
    signing_key_file: str = ".receipts-audit-key"


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
