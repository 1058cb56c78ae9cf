"""Reading config.yaml: parsed and validated once (any problem is one line naming the file and the key), its
relative paths anchored to its directory; the admin section with the command line's overrides."""

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from proxy_addon.config.receipts_config import ReceiptsConfig
from proxy_addon.config.sections import AdminSettings
from proxy_addon.db import DEFAULT_DATABASE_URL, anchor_sqlite_url
from proxy_addon.exceptions import ConfigError


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
        if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]"))
    )
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key"
    if err["type"] == "missing":
        return f"{loc}: required key is missing"
    msg = " ".join(err["msg"].splitlines())
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{loc}: {msg}{more}" if loc else f"{msg}{more}"  # a whole-config check names its keys itself
