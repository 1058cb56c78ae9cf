"""Filling a reconcile rule's read from the receipt: URL placeholders, `${VAR}` headers, match fields."""

import json
import os
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from proxy_addon.exceptions import ReadNotPossibleError, UnreadableRuleError
from proxy_addon.rules.fingerprint import canonical_json
from proxy_addon.rules.operations import PLACEHOLDER_RE, ReconcileRule, known_placeholder
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.redaction import REDACTED

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def netloc_of(receipt: ReceiptRecord) -> str:
    host = f"[{receipt.host}]" if ":" in receipt.host else receipt.host
    default = {"http": 80, "https": 443}.get(receipt.scheme)
    return host if receipt.port == default else f"{host}:{receipt.port}"


_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def request_document(receipt: ReceiptRecord) -> Any:
    """The journaled request's body as a document: its JSON, or a form's fields (`a[b]=1` nested as {"a": {"b":
    "1"}}, as Stripe, Rails and PHP write them; `a[]` a list)."""
    if not receipt.request_body:
        return None
    try:
        return json.loads(receipt.request_body)
    except (ValueError, UnicodeDecodeError):
        pass
    if not _is_form(receipt) or receipt.request_body_truncated:
        return None
    try:
        pairs = parse_qsl(receipt.request_body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
    except (ValueError, UnicodeDecodeError):
        return None
    return form_document(pairs)


def _is_form(receipt: ReceiptRecord) -> bool:
    content_type = next((str(v) for k, v in (receipt.request_headers or {}).items() if k.lower() == "content-type"), "")
    return content_type.split(";")[0].strip().lower() == "application/x-www-form-urlencoded"


def form_document(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for key, value in pairs:
        head, _, rest = key.partition("[")
        names = [head, *_BRACKETS.findall("[" + rest)] if rest else [head]
        node: Any = document
        for i, name in enumerate(names):
            last = i == len(names) - 1
            if isinstance(node, list):  # `a[]` followed by more: a new element
                node.append({} if not last else value)
                node = node[-1]
                continue
            if not isinstance(node, dict):
                break  # `a=1&a[b]=2`: the field was text already; keep the first
            if last:
                node.setdefault(name, value)
            else:
                node = node.setdefault(name, [] if names[i + 1] == "" else {})
    return document


def _value(name: str, receipt: ReceiptRecord, path_params: dict[str, str], document: Any, what: str = "url") -> Any:
    """A placeholder's value for this receipt, as it is (a JSON body template may take a whole object)."""
    if name.startswith("path."):
        raw = path_params.get(name[5:])
        value: Any = None if raw is None else unquote(raw)  # as sent; quoted again where it is put
    elif name.startswith("body."):
        value = document
        for part in name[5:].split("."):
            value = value.get(part) if isinstance(value, dict) else None
    else:
        value = {
            "scheme": receipt.scheme,
            "host": receipt.host,
            "port": str(receipt.port),
            "netloc": netloc_of(receipt),
            "external_id": receipt.external_id,
            "idempotency_key": receipt.idempotency_key,
            "operation_id": receipt.operation_id,
            "submitted_at": (receipt.submitted_at or receipt.created_at).isoformat().replace("+00:00", "Z"),
        }.get(name)
    if value is None or value == REDACTED or _holds_redacted(value):
        raise UnreadableRuleError(f"the rule's {what} needs {{{name}}}, which this receipt does not have")
    return value


def _text(value: Any, name: str, what: str) -> str:
    if isinstance(value, dict | list):
        raise UnreadableRuleError(f"the rule's {what} needs {{{name}}}, which this receipt does not have")
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _holds_redacted(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_holds_redacted(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_redacted(v) for v in value)
    return value == REDACTED


def fill_template(template: str, receipt: ReceiptRecord, path_params: dict[str, str]) -> str:
    document = request_document(receipt)

    def value_of(name: str) -> str:
        text = _text(_value(name, receipt, path_params, document), name, "url")
        if name in ("scheme", "host", "port", "netloc"):
            return text
        return quote(text, safe="/" if name.startswith("path.") else "")  # a {key+} keeps its slashes

    return PLACEHOLDER_RE.sub(lambda m: value_of(m.group(1)), template)


def fill_body(template: Any, receipt: ReceiptRecord, path_params: dict[str, str]) -> Any:
    """A POST read's JSON body (a GraphQL query, an MCP call) from the rule's template: a string that is one
    placeholder becomes that value as it is (text, number, object); placeholders inside text become text."""
    document = request_document(receipt)

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {fill(k): fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        if not isinstance(node, str):
            return node
        whole = PLACEHOLDER_RE.fullmatch(node)
        if whole and known_placeholder(whole.group(1)):
            return _value(whole.group(1), receipt, path_params, document, "body")
        return PLACEHOLDER_RE.sub(lambda m: text_of(m.group(1)) if known_placeholder(m.group(1)) else m.group(0), node)

    def text_of(name: str) -> str:
        return _text(_value(name, receipt, path_params, document, "body"), name, "body")

    return fill(template)


def expand_env(headers: dict[str, str]) -> dict[str, str]:
    """`${VAR}` from the environment, at read time only: credentials are never stored."""

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            raise ReadNotPossibleError(f"environment variable {m.group(1)} is not set")
        return value

    return {k: _ENV_RE.sub(sub, v) for k, v in headers.items()}


def candidate_matches(candidate: Any, original: Any, rule: ReconcileRule) -> bool:
    compared = 0
    for cand_path, orig_path in rule.match_paths:
        want = orig_path.find(original)
        if want and want[0] == REDACTED:
            raise UnreadableRuleError(f"match needs {orig_path.text} of the original request, which was redacted")
        if not want:
            if rule.match_when_missing == "skip":
                continue
            raise UnreadableRuleError(f"match needs {orig_path.text} of the original request, which was not journaled")
        got = cand_path.find(candidate)
        if rule.match_compare == "each_field":
            equal_fields = _fields_compared(got[0] if got else None, want[0], orig_path.text, rule)
            if equal_fields is None:
                return False
            compared += equal_fields
            continue
        compared += 1
        if not got or not same_value(got[0], want[0]):
            return False
    if not compared:
        fields = ", ".join(o.text for _c, o in rule.match_paths)
        raise UnreadableRuleError(f"the request has none of the fields match compares ({fields})")
    return True


def _fields_compared(got: Any, want: Any, where: str, rule: ReconcileRule) -> int | None:
    """`match_compare: each_field`: how many of the request's fields the candidate has, each equal; None when one
    differs, or is missing from the candidate and `match_when_missing` is not skip."""
    if not isinstance(want, dict):
        raise UnreadableRuleError(f"match compares each field of {where}, which is not an object in the request")
    have = got if isinstance(got, dict) else {}
    compared = 0
    for name, value in want.items():
        if name not in have and rule.match_when_missing == "skip":
            continue  # a field the server never answers with (a password) or ignores
        if _holds_redacted(value):
            raise UnreadableRuleError(f"match needs field {name!r} of the original request, which was redacted")
        if name not in have or not same_value(have[name], value):
            return None
        compared += 1
    return compared


def same_value(got: Any, want: Any) -> bool:
    """Equal as JSON; a form's text equals the number or boolean the server answers with (`amount=2000`: 2000), and
    a time the same instant written another way (PocketBase keeps `2024-05-01` as `2024-05-01 00:00:00.000Z`)."""
    if isinstance(want, str) and isinstance(got, bool):
        return want == ("true" if got else "false")
    if isinstance(want, str) and isinstance(got, int | float):
        return want == canonical_json(got)
    if isinstance(want, str) and isinstance(got, str) and want != got:
        instants = _instant(want), _instant(got)
        return instants[0] is not None and instants[0] == instants[1]
    return canonical_json(got) == canonical_json(want)


def _instant(text: str) -> datetime | None:
    """An ISO 8601 date or time (`2024-05-01`, `2024-05-01T10:00:00+02:00`) as an instant (a naive one is UTC)."""
    if len(text) < 10 or text[4] != "-" or text[7] != "-":
        return None
    return parse_time(text)


def parse_time(value: Any) -> datetime | None:
    """A candidate's time field: epoch seconds or RFC 3339 (a naive one is UTC)."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None
