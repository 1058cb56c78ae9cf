"""Where a suggested rule points: its path template, its read's URL filled from the write's path parameters, the
read's credential headers, all under the target host and the API's base path."""

import re
from dataclasses import dataclass
from typing import Any

from proxy_addon.suggest.openapi import Operation, path_placeholders


@dataclass(frozen=True)
class Target:
    """Where the suggested rules go: the host key, the base path the API's paths sit under, and the headers every
    read carries (given: instead of those the document's security schemes name)."""

    host: str
    base_path: str = ""
    headers: tuple[tuple[str, str], ...] = ()


def path_shape(path: str) -> str:
    return re.sub(r"\{[^{}]*\}", "{}", path.rstrip("/") or "/")


def placeholder_name(name: str) -> str:
    """A path parameter as a path template names it (`{customer-id}` -> `customer_id`)."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return clean if re.match(r"[A-Za-z_]", clean) else f"p_{clean}"


def rule_path(path: str) -> str:
    return re.sub(r"\{([^{}]+)\}", lambda m: "{" + placeholder_name(m.group(1)) + "}", path)


def read_url(target: Target, write_path: str, read_path: str, last: str | None = None) -> str:
    """The read's URL template: the read path's parameters filled from the write's, by position (the paths
    share their shape), and the one more a read of an item has from `last`."""
    names = [f"{{path.{placeholder_name(n)}}}" for n in path_placeholders(write_path)]
    if last is not None:
        names.append(last)
    values = iter(names)
    path = re.sub(r"\{[^{}]+\}", lambda _m: next(values), read_path)
    return "{scheme}://{netloc}" + target.base_path + path


def last_placeholder(path: str) -> str | None:
    names = path_placeholders(path)
    return names[-1] if names and path.rstrip("/").endswith("}") else None


def read_headers(read: Operation, target: Target) -> dict[str, Any]:
    """The read's credentials, from the environment at read time (never in config.yaml)."""
    if target.headers:
        return {"headers": dict(target.headers)}
    if not read.auth:
        return {}
    label = token_label(target.host)
    headers = {}
    for auth in read.auth:
        suffix = "TOKEN" if auth.header.lower() == "authorization" else re.sub(r"[^A-Z0-9]", "_", auth.header.upper())
        headers[auth.header] = f"{auth.prefix}${{{label}_{suffix}}}"
    return {"headers": headers}


def token_label(host: str) -> str:
    """The environment variable prefix for a host's credentials: api.github.com -> GITHUB."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    labels = [part for part in name.split(".") if part]
    if not labels or name.replace(".", "").isdigit() or name == "localhost" or ":" in name:
        return "API"
    label = labels[-2] if len(labels) >= 2 else labels[0]
    return re.sub(r"[^A-Z0-9]", "_", label.upper())
