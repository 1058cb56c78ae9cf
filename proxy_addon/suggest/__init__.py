"""`receipts rules suggest`: read rules suggested from an API's OpenAPI document (openapi.py reads it, suggest.py
chooses each write's read, render.py prints the YAML to paste). It never writes the config: `receipts rules
check` proves or refuses each rule on the live API once it is pasted and used."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from proxy_addon.exceptions import OpenApiError
from proxy_addon.rules.hosts import check_host_key
from proxy_addon.suggest.openapi import WRITE_METHODS, Api, load_document, read_api
from proxy_addon.suggest.render import render
from proxy_addon.suggest.suggest import Suggestion, suggest
from proxy_addon.suggest.urls import Target


@dataclass(frozen=True)
class Suggested:
    api: Api
    target: Target
    suggestions: list[Suggestion]
    text: str  # the YAML to paste


def suggest_from_file(
    path: Path, host: str | None = None, operation_ids: Sequence[str] = (), headers: Sequence[tuple[str, str]] = ()
) -> Suggested:
    """The suggestions for the document at `path`, for `host` (else its first server's), or OpenApiError."""
    api = read_api(load_document(path), path.absolute().as_uri())
    host = host or api.host
    if not host:
        raise OpenApiError(f"{path}: its servers name no host: give --host")
    try:
        host = check_host_key(host)
    except ValueError as e:
        raise OpenApiError(f"--host: {e}") from None
    writes = {op.operation_id for op in api.operations if op.method in WRITE_METHODS}
    unknown = [op for op in operation_ids if op not in writes]
    if unknown:
        raise OpenApiError(f"{path}: no write has the operationId {', '.join(unknown)}")
    target = Target(host, api.base_path, tuple(headers))
    suggestions = suggest(api, target, operation_ids)
    return Suggested(api, target, suggestions, render(suggestions, target, api, path.name))
