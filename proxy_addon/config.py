"""config.yaml: loading, validation (one clear line naming the key), and the per-host policy lookups.

Everything is parsed once at load: durations, JSON paths and path templates are compiled here, so that
the request path never re-reads or re-parses configuration.
"""

import ipaddress
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from jsonpath_ng import JSONPath
from jsonpath_ng import parse as parse_jsonpath
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy_addon.exceptions import ConfigError

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION_SECONDS = 36500 * 86400.0  # a hundred years: still a datetime when added to or taken from now
_SIZE_RE = re.compile(r"^\s*(\d+)\s*(b|kb|kib|mb|mib)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}

BUILTIN_SECRET_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-amz-security-token",
)
DEFAULT_REDACT_FIELDS = ("password", "token", "secret", "api_key")
MUTATING_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def parse_duration(value: Any) -> float:
    """`30s`, `15m`, `24h`, `2d`, `500ms`, or a number of seconds; returns seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r} (use e.g. 30s, 15m, 24h)")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = float("inf") if value > 0 else float("-inf")
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise ValueError(f"invalid duration {value!r} (use e.g. 30s, 15m, 24h)")
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must not be negative")
    if not seconds <= MAX_DURATION_SECONDS:  # also NaN: clock arithmetic with it would fail at run time
        raise ValueError(f"invalid duration {value!r}: must be at most 36500d")
    return seconds


def parse_positive_duration(value: Any) -> float:
    """A duration that must be more than zero: a timeout of 0s would end every exchange before it began."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"invalid duration {value!r}: must be more than 0s")
    return seconds


def parse_size(value: Any) -> int:
    """`65536`, `64KiB`, `1MiB`; returns bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"invalid size {value!r} (use e.g. 65536, 64KiB, 1MiB)")
    return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "b").lower()]


def _compile_jsonpath(value: Any) -> "JsonPath":
    if isinstance(value, JsonPath):
        return value
    if not isinstance(value, str) or not value.startswith("$"):
        raise ValueError(f"invalid JSON path {value!r} (write it like $.id or $.items[0].id)")
    try:
        return JsonPath(value, parse_jsonpath(value))
    except Exception as e:  # noqa: BLE001 - jsonpath-ng raises bare Exceptions on syntax errors
        raise ValueError(f"invalid JSON path {value!r}: {e}") from None


@dataclass(frozen=True)
class JsonPath:
    """A compiled JSON path, kept with its source text."""

    text: str
    compiled: JSONPath = field(compare=False, repr=False)

    def find(self, document: Any) -> list[Any]:
        return [m.value for m in self.compiled.find(document)]

    def first(self, document: Any) -> Any:
        found = self.find(document)
        return found[0] if found else None


compile_jsonpath = _compile_jsonpath

Duration = Annotated[float, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[float, BeforeValidator(parse_positive_duration)]
Size = Annotated[int, BeforeValidator(parse_size)]
JsonPathField = Annotated[JsonPath, BeforeValidator(_compile_jsonpath), PlainSerializer(lambda p: p.text)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class AfterSuccess(StrictModel):
    policy: Literal["replay", "refuse", "allow"] = "replay"
    window: Duration = 900.0


class InFlight(StrictModel):
    """A repeat of a write whose receipt is still in flight (planned or submitted): `refuse` it (409
    duplicate-open), or `wait` up to `max_wait` for the original's verdict and answer it as a repeat after it."""

    policy: Literal["refuse", "wait"] = "refuse"
    max_wait: PositiveDuration = 30.0


class FingerprintRule(StrictModel):
    fields: list[JsonPathField] | None = None
    exclude: list[JsonPathField] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "FingerprintRule":
        if self.fields is not None and self.exclude is not None:
            raise ValueError("give either fields (an allowlist) or exclude, not both")
        return self


_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+(?:\.[A-Za-z0-9_.\-]+)?)\}")  # as the reconciler fills them
_URL_PLACEHOLDERS = {"scheme", "host", "port", "netloc", "external_id", "idempotency_key", "operation_id", "submitted_at"}


class ReconcileRule(StrictModel):
    strategy: Literal["lookup", "search", "resend_with_key"]
    method: Literal["GET", "HEAD"] = "GET"
    url: str | None = None
    headers: dict[str, str] = {}
    items: JsonPathField | None = None
    match: dict[str, str] = {}
    id: JsonPathField | None = None
    settle: Duration = 0.0
    attempts: int = Field(default=3, ge=1, le=100)
    absent_means: Literal["safe_to_retry", "succeeded", "manual_review"] = "safe_to_retry"
    timeout: Duration = 10.0
    max_pages: int = Field(default=5, ge=1, le=100)
    next_page: JsonPathField | None = None  # search: where the next page's URL is in a page
    time_field: JsonPathField | None = None  # search: a candidate's creation time, to bound the window
    window: Duration = 3600.0  # search: candidates created this long before or after submission

    @field_validator("url")
    @classmethod
    def _known_placeholders(cls, url: str | None) -> str | None:
        if url is None:
            return url
        for name in _PLACEHOLDER_RE.findall(url):
            if name not in _URL_PLACEHOLDERS and not name.startswith(("path.", "body.")):
                raise ValueError(f"unknown placeholder {{{name}}} in url")
        return url

    @field_validator("match")
    @classmethod
    def _match_paths(cls, match: dict[str, str]) -> dict[str, str]:
        for candidate, original in match.items():
            _compile_jsonpath(candidate)
            _compile_jsonpath(original)
        return match

    @model_validator(mode="after")
    def _strategy_needs(self) -> "ReconcileRule":
        if self.strategy in ("lookup", "search") and not self.url:
            raise ValueError(f"strategy {self.strategy} needs a url")
        if self.strategy == "search" and not self.match:
            raise ValueError("strategy search needs match (candidate field: request field)")
        if self.method == "HEAD" and (self.strategy == "search" or self.match or self.id is not None):
            raise ValueError("method HEAD reads no body: it cannot search, match or find an id (use GET)")
        return self

    @cached_property
    def match_paths(self) -> list[tuple[JsonPath, JsonPath]]:
        return [(_compile_jsonpath(c), _compile_jsonpath(o)) for c, o in self.match.items()]


class OperationRule(StrictModel):
    name: str = Field(min_length=1)
    method: str
    path: str
    fingerprint: FingerprintRule | None = None
    external_id: str | None = None
    retry_safe: bool = False
    reconcile: ReconcileRule | None = None

    @field_validator("method")
    @classmethod
    def _upper(cls, method: str) -> str:
        method = method.upper()
        if method not in MUTATING_METHODS:
            raise ValueError(f"method {method!r} is not one the proxy journals ({', '.join(MUTATING_METHODS)})")
        return method

    @field_validator("path")
    @classmethod
    def _template(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"path template {path!r} must start with /")
        compile_path_template(path)
        return path

    @field_validator("external_id")
    @classmethod
    def _external_id(cls, value: str | None) -> str | None:
        if value is not None and not value.lower().startswith("header:"):
            _compile_jsonpath(value)
        return value

    @model_validator(mode="after")
    def _reconcile_consistent(self) -> "OperationRule":
        r = self.reconcile
        if r and r.absent_means == "safe_to_retry" and not self.retry_safe and r.strategy != "resend_with_key":
            # the default absent_means is only meaningful with retry_safe; without it absence goes to a person
            object.__setattr__(self, "reconcile", r.model_copy(update={"absent_means": "manual_review"}))
        if r and r.absent_means == "succeeded" and self.method != "DELETE":
            raise ValueError("absent_means: succeeded is only allowed for DELETE")
        if r and r.url:
            params = set(compile_path_template(self.path).groupindex)
            for name in _PLACEHOLDER_RE.findall(r.url):
                if name.startswith("path.") and name[5:] not in params:
                    raise ValueError(f"reconcile url uses {{{name}}}, but path {self.path} has no {{{name[5:]}}}")
        return self

    @cached_property
    def path_regex(self) -> re.Pattern[str]:
        return compile_path_template(self.path)


def compile_path_template(template: str) -> re.Pattern[str]:
    """`/api/articles/{id}` -> a regex where each `{name}` matches exactly one path segment."""
    parts = re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\})", template)
    pattern = ""
    seen: set[str] = set()
    for part in parts:
        if part.startswith("{") and part.endswith("}"):
            name = part[1:-1]
            if name in seen:
                raise ValueError(f"path template {template!r} repeats {{{name}}}")
            seen.add(name)
            pattern += f"(?P<{name}>[^/]+)"
        else:
            if "{" in part or "}" in part:
                raise ValueError(f"path template {template!r} has a malformed placeholder")
            pattern += re.escape(part)
    return re.compile(f"^{pattern}/?$")


class HostOverrides(StrictModel):
    """What a host may set; anything left out comes from `defaults` (`upstream_deadline: null` on a host
    turns a default deadline off)."""

    upstream_timeout: PositiveDuration | None = None
    upstream_deadline: PositiveDuration | None = None
    connect_timeout: PositiveDuration | None = None
    unknown_statuses: list[Annotated[int, Field(ge=100, le=599)]] | None = None
    after_success: AfterSuccess | None = None
    in_flight: InFlight | None = None
    redact_headers: list[str] | None = None
    redact_fields: list[str] | None = None
    inject_idempotency_key: bool | None = None
    idempotency_key_header: str | None = None


class Defaults(StrictModel):
    upstream_timeout: PositiveDuration = 30.0  # idle: the longest wait for the answer to begin, and between its reads
    upstream_deadline: PositiveDuration | None = None  # the whole exchange, when set
    connect_timeout: PositiveDuration = 10.0
    unknown_statuses: list[Annotated[int, Field(ge=100, le=599)]] = [500, 502, 503, 504]
    after_success: AfterSuccess = AfterSuccess()
    in_flight: InFlight = InFlight()
    redact_headers: list[str] = []
    redact_fields: list[str] = list(DEFAULT_REDACT_FIELDS)
    inject_idempotency_key: bool = False
    idempotency_key_header: str = "Idempotency-Key"


class HostConfig(HostOverrides):
    operations: list[OperationRule] = []


class DatabaseSettings(StrictModel):
    url: str | None = None


class ProxySettings(StrictModel):
    methods: list[str] = list(MUTATING_METHODS)
    fail_open: bool = False
    max_stored_body: Size = 65536
    max_stored_response: Size = 65536
    heartbeat_interval: Duration = 5.0
    instance_dead_after: Duration = 15.0
    journal_threads: int = Field(default=8, ge=1, le=64)

    @field_validator("methods")
    @classmethod
    def _methods(cls, methods: list[str]) -> list[str]:
        methods = [m.upper() for m in methods]
        for m in methods:
            if m not in MUTATING_METHODS:
                raise ValueError(f"method {m!r} cannot be journaled (only {', '.join(MUTATING_METHODS)})")
        return methods


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
        """Read from the environment variable `token_env`; never kept in the config file."""
        return os.environ.get(self.token_env) or None

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
        return self


class LoggingSettings(StrictModel):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


@dataclass(frozen=True)
class HostPolicy:
    """The settings in force for one host (defaults merged with the host's own), with its operation rules."""

    upstream_timeout: float
    upstream_deadline: float | None
    connect_timeout: float
    unknown_statuses: frozenset[int]
    after_success: AfterSuccess
    in_flight: InFlight
    redact_headers: frozenset[str]
    redact_fields: frozenset[str]
    inject_idempotency_key: bool
    idempotency_key_header: str
    operations: tuple[OperationRule, ...]

    def match_operation(self, method: str, path: str) -> tuple[OperationRule, dict[str, str]] | None:
        for rule in self.operations:
            if rule.method != method:
                continue
            m = rule.path_regex.match(path)
            if m:
                return rule, m.groupdict()
        return None


class ReceiptsConfig(StrictModel):
    database: DatabaseSettings = DatabaseSettings()
    defaults: Defaults = Defaults()
    hosts: dict[str, HostConfig] = {}
    proxy: ProxySettings = ProxySettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    admin: AdminSettings = AdminSettings()
    logging: LoggingSettings = LoggingSettings()
    secret_file: str = ".receipts-secret"

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
        return {k.lower(): v for k, v in hosts.items()}

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
        entry = self.hosts.get(f"{host}:{port}") or self.hosts.get(host) or HostConfig()
        d = self.defaults

        def pick(name: str) -> Any:
            value = getattr(entry, name)
            return getattr(d, name) if value is None else value

        return HostPolicy(
            upstream_timeout=pick("upstream_timeout"),
            # None is "inherit" for every other key; a host that writes `upstream_deadline: null` means "none"
            upstream_deadline=entry.upstream_deadline if "upstream_deadline" in entry.model_fields_set else d.upstream_deadline,
            connect_timeout=pick("connect_timeout"),
            unknown_statuses=frozenset(pick("unknown_statuses")),
            after_success=pick("after_success"),
            in_flight=pick("in_flight"),
            redact_headers=frozenset(h.lower() for h in [*BUILTIN_SECRET_HEADERS, *d.redact_headers, *(entry.redact_headers or [])]),
            redact_fields=frozenset(f.lower() for f in [*d.redact_fields, *(entry.redact_fields or [])]),
            inject_idempotency_key=pick("inject_idempotency_key"),
            idempotency_key_header=pick("idempotency_key_header"),
            operations=tuple(entry.operations),
        )


def load_config(path: str | Path) -> ReceiptsConfig:
    """Read and validate a config file; any problem is one ConfigError line naming the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None
    return parse_config(text, source=str(path))


def parse_config(text: str, source: str = "config") -> ReceiptsConfig:
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
        return ReceiptsConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {describe_validation_error(e)}") from None


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
