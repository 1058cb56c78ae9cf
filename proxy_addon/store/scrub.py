"""`receipts scrub`: rows written by an earlier version, redacted again with today's rules (rules/redaction.py).

Earlier versions kept what they did not know for a secret: vendor key headers (`x-goog-api-key`, ...), query
parameters and fields (`access_token`, `client_secret`, `cvc`, ...), tokens in stored answers, header values
quoted in error texts, and multipart parts as unsalted SHA-256 digests. This pass reads every receipt and
history row and rewrites the columns that still hold one:
- `request_headers`, `response_headers`: a secret header's value becomes the marker;
- `query`: a secret parameter's value becomes the marker;
- `request_body`: a JSON body is redacted again (and written in the same canonical form); a form body too; a
  JSON body cut at `max_stored_body` in which a secret field shows is replaced whole by the marker;
  multipart part digests that are not keyed are dropped (the part names stay);
- `response_body`: a JSON answer (decoded, if it was stored compressed) holding a secret field is stored
  redacted and decoded, marked `response_body_redacted` where the column exists (never replayed then);
- `error_message` and every text in `receipt_transitions.detail`: quoted data and secret values removed.
A value that is already the marker is left as it is, so a second run changes nothing. Fingerprints and
accounts are left as they are: they were hashed, never readable. Batches of BATCH rows, each in one
transaction (rows locked on PostgreSQL), so it may run beside live proxies.

An UPDATE leaves the old bytes in freed pages (SQLite, and its WAL) or dead tuples (PostgreSQL) until the
database rewrites them: `vacuum` does (SQLite VACUUM and a truncating WAL checkpoint; PostgreSQL VACUUM FULL of
the two tables, which locks them while it runs).
"""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl, urlencode

from mitmproxy.net import encoding as mitm_encoding
from sqlalchemy import Connection, select, update

from proxy_addon.rules import redaction
from proxy_addon.rules.fingerprint import canonical_json
from proxy_addon.rules.redaction import REDACTED, SecretFields, SecretHeaders
from proxy_addon.store.audit import rechain
from proxy_addon.store.database import Database
from proxy_addon.store.receipts import receipts, transitions

BATCH = 500
_JSON_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:\s*("\[REDACTED\]")?')

Rules = Callable[[str, int], tuple[SecretHeaders, SecretFields]]
"""(host, port) -> the configured secret headers and fields in force for that host."""


@dataclass(frozen=True)
class ScrubCounts:
    receipts_read: int
    receipts_changed: int
    transitions_read: int
    transitions_changed: int


class Scrubber:
    def __init__(self, db: Database):
        self.db = db

    def run(self, rules: Rules, dry_run: bool = False) -> ScrubCounts:
        read = changed = 0
        after = ""
        while True:
            with self.db.writing() as conn:
                query = select(receipts).where(receipts.c.operation_id > after).order_by(receipts.c.operation_id).limit(BATCH)
                rows = conn.execute(_locked(query, conn)).all()
                for row in rows:
                    updates = scrub_receipt(row._mapping, *rules(row.host, row.port))
                    if updates:
                        changed += 1
                        if not dry_run:
                            conn.execute(update(receipts).where(receipts.c.operation_id == row.operation_id).values(**updates))
            read += len(rows)
            if len(rows) < BATCH:
                break
            after = rows[-1].operation_id
        return ScrubCounts(read, changed, *self._scrub_history(dry_run))

    def _scrub_history(self, dry_run: bool) -> tuple[int, int]:
        """The history rows' details, BATCH rows a transaction; a receipt with a row rewritten has its audit
        chain computed again in the same transaction (store/audit.py, `rechain`), and says so."""
        read = changed = 0
        last = -1
        while True:
            with self.db.writing() as conn:
                query = select(transitions.c.id, transitions.c.operation_id, transitions.c.detail).where(transitions.c.id > last)
                rows = conn.execute(_locked(query.order_by(transitions.c.id).limit(BATCH), conn)).all()
                rewritten: dict[str, dict[int, Any]] = {}  # operation id -> row id -> its detail before
                for row in rows:
                    detail = scrub_detail(row.detail)
                    if detail != row.detail:
                        changed += 1
                        rewritten.setdefault(row.operation_id, {})[row.id] = row.detail
                        if not dry_run:
                            conn.execute(update(transitions).where(transitions.c.id == row.id).values(detail=detail))
                if rewritten and not dry_run:
                    rechain(conn, rewritten)  # a chain that did not hold is left as it is: `receipts verify` names it
            read += len(rows)
            if len(rows) < BATCH:
                return read, changed
            last = rows[-1].id

    def vacuum(self) -> None:
        """Rewrite the storage so that the bytes the scrub replaced are gone from the files too."""
        with self.db.storage_errors(), self.db.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            if self.db.dialect == "sqlite":
                raw.execute("VACUUM")
                raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                autocommit = raw.autocommit
                raw.autocommit = True  # VACUUM runs outside a transaction
                try:
                    raw.execute("VACUUM FULL receipts")
                    raw.execute("VACUUM FULL receipt_transitions")
                finally:
                    raw.autocommit = autocommit


def _locked(query: Any, conn: Connection) -> Any:
    return query.with_for_update() if conn.dialect.name == "postgresql" else query


# -- one row, pure ----------------------------------------------------------------------------------------------


def scrub_receipt(row: Any, headers: SecretHeaders, fields: SecretFields) -> dict[str, Any]:
    """The columns of this receipt row to rewrite (empty: nothing to do)."""
    out: dict[str, Any] = {}
    for column in ("request_headers", "response_headers"):
        value = row[column]
        scrubbed = scrub_headers(value, headers)
        if scrubbed != value:
            out[column] = scrubbed
    query = row["query"]
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        redacted = redaction.redact_pairs(pairs, fields)
        if redacted != pairs:
            out["query"] = urlencode(redacted)
    body, note = scrub_request_body(row["request_body"], row["body_note"], row["request_body_truncated"], row["request_headers"], fields)
    if body != row["request_body"]:
        out["request_body"] = body
    if note != row["body_note"]:
        out["body_note"] = note
    out.update(scrub_response(row, out.get("response_headers", row["response_headers"]), fields))
    error = redaction.error_text(row["error_message"])
    if error != row["error_message"]:
        out["error_message"] = error
    return out


def scrub_headers(value: Any, headers: SecretHeaders) -> Any:
    """Stored headers, a dict (`name: value`) or a list of `[name, value]` pairs, with secret values replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if redaction.is_secret_header(k, headers) else v for k, v in value.items()}
    if isinstance(value, list):
        return [
            [pair[0], REDACTED] if isinstance(pair, list) and len(pair) == 2 and redaction.is_secret_header(str(pair[0]), headers) else pair
            for pair in value
        ]
    return value


def _header(stored: Any, name: str) -> str | None:
    pairs = stored.items() if isinstance(stored, dict) else (stored or [])
    return next((str(p[1]) for p in pairs if isinstance(p, list | tuple) and len(p) == 2 and str(p[0]).lower() == name), None)


def scrub_request_body(
    body: bytes | None, note: str | None, truncated: bool, stored_headers: Any, fields: SecretFields
) -> tuple[bytes | None, str | None]:
    if not body or body == REDACTED.encode():
        return body, note
    if note and "part digests" in note:
        return _scrub_multipart(body, note, fields)
    document = _json(body)
    if document is not None:
        redacted = redaction.redact_document(document, fields)
        return (body, note) if redacted == document else (canonical_json(redacted).encode(), note)
    if truncated and body.lstrip()[:1] in (b"{", b"["):
        for key, marked in _JSON_KEY.findall(body):
            if not marked and redaction.is_secret_field(key.decode("utf-8", "replace"), fields):
                return REDACTED.encode(), _noted(note, "a secret field in the cut stored body: redacted whole by receipts scrub")
        return body, note
    content_type = (_header(stored_headers, "content-type") or "").split(";")[0].strip().lower()
    if content_type == "application/x-www-form-urlencoded":
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return body, note
        redacted = redaction.redact_pairs(pairs, fields)
        return (body, note) if redacted == pairs else (urlencode(redacted).encode(), note)
    return body, note


def _scrub_multipart(body: bytes, note: str | None, fields: SecretFields) -> tuple[bytes | None, str | None]:
    document = _json(body)
    if not isinstance(document, dict) or not isinstance(document.get("multipart"), list):
        return body, note
    parts = []
    for part in document["multipart"]:
        if not (isinstance(part, list) and len(part) == 2 and isinstance(part[0], str)):
            parts.append(part)
            continue
        name, digest = part
        keyed = isinstance(digest, str) and digest.startswith("hmac:")
        parts.append([name, REDACTED if redaction.is_secret_field(name, fields) or not keyed else digest])
    if parts == document["multipart"]:
        return body, note
    return canonical_json({"multipart": parts}).encode(), "multipart stored as part names (unkeyed digests removed by receipts scrub)"


def scrub_response(row: Any, stored_headers: Any, fields: SecretFields) -> dict[str, Any]:
    body = row["response_body"]
    if not body or row["response_body_truncated"]:
        return {}
    encoding = (_header(stored_headers, "content-encoding") or "").strip().lower()
    content = body
    if encoding and encoding != "identity":
        try:
            decoded = mitm_encoding.decode(body, encoding)
        except ValueError:
            return {}
        content = decoded if isinstance(decoded, bytes) else decoded.encode()
    document = _json(content, exact=False)
    if document is None or not redaction.contains_secret_field(document, fields):
        return {}
    out: dict[str, Any] = {}
    redacted = redaction.redact_document(document, fields)
    if redacted != document or content is not body:
        out["response_body"] = json.dumps(redacted, separators=(",", ":")).encode()
    if content is not body:
        out["response_headers"] = _without(stored_headers, "content-encoding")
    flag = receipts.c.get("response_body_redacted")
    if flag is not None and not _get(row, flag.name):
        out[flag.name] = True  # an answer that held a secret is not what was delivered: never replayed
    return out


def _get(row: Any, name: str) -> Any:
    try:
        return row[name]
    except KeyError:
        return None


def _without(stored: Any, name: str) -> Any:
    if isinstance(stored, dict):
        return {k: v for k, v in stored.items() if k.lower() != name}
    return [p for p in stored or [] if not (isinstance(p, list) and str(p[0]).lower() == name)]


def scrub_detail(detail: Any) -> Any:
    """A transition's detail: secret members redacted, every text scrubbed (errors, URLs, notes)."""
    if isinstance(detail, dict):
        return {
            k: REDACTED if isinstance(k, str) and redaction.is_secret_field(k) and v != REDACTED else scrub_detail(v)
            for k, v in detail.items()
        }
    if isinstance(detail, list):
        return [scrub_detail(v) for v in detail]
    if isinstance(detail, str):
        return redaction.error_text(detail)
    return detail


def _json(data: bytes, exact: bool = True) -> Any:
    try:
        return json.loads(data, parse_float=Decimal) if exact else json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _noted(note: str | None, more: str) -> str:
    return f"{note}; {more}" if note else more
