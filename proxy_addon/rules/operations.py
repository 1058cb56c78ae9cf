"""Operation rules: the per-route settings of config.yaml (path templates, what identifies a write, where its
external id is, how the reconciler reads it), validated at load with one line naming what is wrong."""

import hashlib
import json
import re
from collections.abc import Iterable
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from proxy_addon.rules.approvals import ApprovalSetting
from proxy_addon.units import (
    AnswerFieldType,
    Duration,
    JsonPath,
    JsonPathField,
    PositiveDuration,
    StrictModel,
    compile_jsonpath,
)

MUTATING_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# -- any HTTP method token may be journaled (PURGE, MKCOL, ...), not only the four above: what the protocol seam reads --
_METHOD_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 5.6.2 token
MAX_METHOD_LENGTH = 16  # the receipts.method column
ProtocolName = Literal["auto", "rest", "graphql", "jsonrpc"]


def method_token(method: str) -> str:
    """An HTTP method as the proxy compares it (upper case), or ValueError naming what is wrong with it."""
    if not isinstance(method, str) or not _METHOD_TOKEN.match(method):
        raise ValueError(f"method {method!r} is not an HTTP method token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~)")
    if len(method) > MAX_METHOD_LENGTH:
        raise ValueError(f"method {method!r} is longer than {MAX_METHOD_LENGTH} characters, which a receipt cannot hold")
    if method.upper() == "CONNECT":
        raise ValueError("method 'CONNECT' opens a tunnel and cannot be journaled")
    return method.upper()


class FingerprintRule(StrictModel):
    fields: list[JsonPathField] | None = None
    exclude: list[JsonPathField] | None = None

    @model_validator(mode="after")
    def _one_of(self) -> "FingerprintRule":
        if self.fields is not None and self.exclude is not None:
            raise ValueError("give either fields (an allowlist) or exclude, not both")
        return self


PLACEHOLDER_RE = re.compile(r"\{([a-z_]+(?:\.[A-Za-z0-9_.\-]+)?)\}")  # as the reconciler fills them
_URL_PLACEHOLDERS = {"scheme", "host", "port", "netloc", "external_id", "idempotency_key", "operation_id", "submitted_at"}


class ControlSettings(StrictModel):
    """The verifier controls of a read rule (reconcile/controls.py): how fresh a proof a verdict needs."""

    max_age: PositiveDuration = 3600.0
    # placeholders the negative probe keeps as they are: they name the collection (a table, a bucket), not the record
    keep: list[str] = Field(default_factory=list)

    @field_validator("keep")
    @classmethod
    def _known(cls, keep: list[str]) -> list[str]:
        for name in keep:
            if not known_placeholder(name):
                raise ValueError(f"keep: {name!r} is not a placeholder (write it like body.TableName or path.bucket)")
        return keep


class AwsSigV4(StrictModel):
    """Sign each read with AWS Signature Version 4 (reconcile/aws_sigv4.py), with the reconciler's credentials from
    its environment; `region`: else the host's (`s3.eu-west-1.amazonaws.com`), else AWS_REGION, else us-east-1."""

    service: str = Field(min_length=1)
    region: str | None = None


class CursorPaging(StrictModel):
    """search: pages that hand a cursor rather than the next page's URL. The next page is the same read with the
    cursor taken from the page (`value`: Stripe's last item's id `$.data[-1].id`, DynamoDB's `$.LastEvaluatedKey`)
    put into its query (`into: query:starting_after`) or its JSON body (`into: body:ExclusiveStartKey`); `more`
    (when given) is the page's flag that more pages follow. A page with no cursor, or `more` false, ends the list."""

    value: JsonPathField
    into: str
    more: JsonPathField | None = None
    # the cursor is a page number (PocketBase's `$.page`) and this the last page's (`$.totalPages`): the next read
    # asks for the page after, until the last
    last: JsonPathField | None = None

    @field_validator("into")
    @classmethod
    def _into(cls, into: str) -> str:
        where, _, name = into.partition(":")
        if where not in ("query", "body") or not name:
            raise ValueError(f"into {into!r}: write query:NAME or body:NAME")
        return into


class ReconcileRule(StrictModel):
    strategy: Literal["lookup", "search", "resend_with_key"]
    method: Literal["GET", "HEAD", "POST"] = "GET"  # POST: a read sent as a POST (a GraphQL query, an MCP read tool)
    url: str | None = None
    body: Any = None  # POST only: a JSON template; "{body.FIELD}" alone in a string is the field's JSON value
    headers: dict[str, str] = Field(default_factory=dict)
    aws_sigv4: AwsSigV4 | None = None  # sign the read the AWS way (S3, DynamoDB), with the reconciler's own keys
    # sign the read with Azure Storage's Shared Key (reconcile/azure_shared_key.py): the reconciler's own
    # AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY
    azure_shared_key: bool = False
    items: JsonPathField | None = None
    match: dict[str, str] = Field(default_factory=dict)
    # refuse: a request without one of the match fields goes to a person; skip: compare the ones it has (one at least)
    match_when_missing: Literal["refuse", "skip"] = "refuse"
    # equal: each match pair's values are equal; each_field: the request's value is an object, and each of its
    # fields equals the candidate's field of that name (one the candidate lacks: under skip, left out)
    match_compare: Literal["equal", "each_field"] = "equal"
    id: AnswerFieldType | None = None  # a JSON path, or header:NAME for a lookup
    settle: Duration = 0.0
    attempts: int = Field(default=3, ge=1, le=100)
    absent_means: Literal["safe_to_retry", "succeeded", "manual_review"] = "safe_to_retry"
    timeout: Duration = 10.0
    max_pages: int = Field(default=5, ge=1, le=100)
    next_page: JsonPathField | None = None  # search: where the next page's URL is in a page
    cursor: CursorPaging | None = None  # search: or where its cursor is, and where the next read puts it
    # search: a candidate's creation time, to bound the window; lookup: the resource's (a JSON path, or
    # header:Last-Modified), which must lie within the window of the submission to be this write's
    time_field: AnswerFieldType | None = None
    window: Duration = 3600.0  # candidates created this long before or after submission
    controls: ControlSettings = ControlSettings()  # lookup and search: a verdict needs the rule proven to see

    @field_validator("url")
    @classmethod
    def _known_placeholders(cls, url: str | None) -> str | None:
        if url is None:
            return url
        for name in PLACEHOLDER_RE.findall(url):
            if name not in _URL_PLACEHOLDERS and not name.startswith(("path.", "body.")):
                raise ValueError(f"unknown placeholder {{{name}}} in url")
        return url

    @field_validator("match")
    @classmethod
    def _match_paths(cls, match: dict[str, str]) -> dict[str, str]:
        for candidate, original in match.items():
            compile_jsonpath(candidate)
            compile_jsonpath(original)
        return match

    @model_validator(mode="after")
    def _strategy_needs(self) -> "ReconcileRule":
        if self.strategy in ("lookup", "search") and not self.url:
            raise ValueError(f"strategy {self.strategy} needs a url")
        if self.strategy == "search" and not self.match:
            raise ValueError("strategy search needs match (candidate field: request field)")
        reads_body = [f.text for f in (self.id, self.time_field) if f is not None and f.header is None]
        if self.method == "HEAD" and (self.strategy == "search" or self.match or reads_body):
            raise ValueError("method HEAD reads no body: it cannot search, match or find a JSON path (use GET, or header:NAME)")
        in_headers = [f.text for f in (self.id, self.time_field) if f is not None and f.header is not None]
        if self.strategy == "search" and in_headers:
            raise ValueError(f"search reads items: {in_headers[0]} must be a JSON path into an item")
        if self.cursor is not None and (self.strategy != "search" or self.next_page is not None):
            raise ValueError("cursor pages a search, instead of next_page")
        if self.body is not None and self.method != "POST":
            raise ValueError("body is sent only with method POST")
        if self.aws_sigv4 is not None and self.azure_shared_key:
            raise ValueError("a read is signed either aws_sigv4 or azure_shared_key, not both")
        return self

    @cached_property
    def digest(self) -> str:
        """The rule as written: the verifier controls' runs of a rule since edited prove nothing about it."""
        written = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(written.encode()).hexdigest()

    @cached_property
    def match_paths(self) -> list[tuple[JsonPath, JsonPath]]:
        return [(compile_jsonpath(c), compile_jsonpath(o)) for c, o in self.match.items()]


class OperationRule(StrictModel):
    name: str = Field(min_length=1)
    method: str
    path: str
    fingerprint: FingerprintRule | None = None
    external_id: str | None = None
    retry_safe: bool = False
    reconcile: ReconcileRule | None = None
    # what passes through, and how a protocol's calls are told apart
    journal: bool = True  # false: a read sent with a journaled method; passes through, streamed, unjournaled
    protocol: ProtocolName | None = None  # None: the host's (auto by default)
    read_methods: list[str] = Field(default_factory=list)  # JSON-RPC methods (globs) that are reads
    call: str | None = None  # only these calls (glob): an MCP tool name, a GraphQL operation, a JSON-RPC method
    approval: ApprovalSetting | None = None  # None: the host's; `required`: a person approves each intent first
    # why this write cannot be read back (SQS SendMessage): its unknowns go to a person, with this reason
    unreadable: str | None = None
    # only requests whose query has each of these parameters with this value (null: without it), as Azure Storage
    # tells a Put Block List (`comp: blocklist`) from a Put Blob on the same path
    query: dict[str, str | None] = Field(default_factory=dict)

    @field_validator("method")
    @classmethod
    def _upper(cls, method: str) -> str:
        return method_token(method)

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
            compile_jsonpath(value)
        return value

    @model_validator(mode="after")
    def _reconcile_consistent(self) -> "OperationRule":
        r = self.reconcile
        if r is not None and self.unreadable is not None:
            raise ValueError("a rule is either unreadable (for a person) or has a reconcile rule, not both")
        if r and r.absent_means == "safe_to_retry" and not self.retry_safe and r.strategy != "resend_with_key":
            # the default absent_means is only meaningful with retry_safe; without it absence goes to a person
            object.__setattr__(self, "reconcile", r.model_copy(update={"absent_means": "manual_review"}))
        if r and r.absent_means == "succeeded" and self.method != "DELETE":
            raise ValueError("absent_means: succeeded is only allowed for DELETE")
        if r and (r.url or r.body is not None):
            params = set(compile_path_template(self.path).groupindex)
            for name in [*PLACEHOLDER_RE.findall(r.url or ""), *template_placeholders(r.body)]:
                if name.startswith("path.") and name[5:] not in params:
                    raise ValueError(f"reconcile url uses {{{name}}}, but path {self.path} has no {{{name[5:]}}}")
        return self

    @cached_property
    def path_regex(self) -> re.Pattern[str]:
        return compile_path_template(self.path)

    def matches_query(self, query: Iterable[tuple[str, str]]) -> bool:
        """The request's query has what the rule's `query` asks: each parameter with its value, or absent."""
        if not self.query:
            return True
        given: dict[str, set[str]] = {}
        for name, value in query:
            given.setdefault(name, set()).add(value)
        return all(name not in given if value is None else value in given.get(name, ()) for name, value in self.query.items())


def known_placeholder(name: str) -> bool:
    return name in _URL_PLACEHOLDERS or name.startswith(("path.", "body."))


def template_placeholders(template: Any) -> list[str]:
    """The placeholders of a JSON body template, at any depth (other braces, as GraphQL writes them, are text)."""
    if isinstance(template, str):
        return [n for n in PLACEHOLDER_RE.findall(template) if known_placeholder(n)]
    if isinstance(template, dict):
        return [n for k, v in template.items() for n in (*template_placeholders(k), *template_placeholders(v))]
    if isinstance(template, list):
        return [n for v in template for n in template_placeholders(v)]
    return []


def compile_path_template(template: str) -> re.Pattern[str]:
    """`/api/articles/{id}` -> a regex where each `{name}` matches exactly one path segment, and `{name+}` (last
    only) the rest of the path, slashes included (an S3 object's key)."""
    parts = re.split(r"(\{[A-Za-z_][A-Za-z0-9_]*\+?\})", template)
    pattern = ""
    seen: set[str] = set()
    for part in parts:
        if part.startswith("{") and part.endswith("}"):
            name, greedy = part[1:-1].rstrip("+"), part.endswith("+}")
            if name in seen:
                raise ValueError(f"path template {template!r} repeats {{{name}}}")
            if greedy and not template.endswith(part):
                raise ValueError(f"path template {template!r}: {{{name}+}} must come last")
            seen.add(name)
            pattern += f"(?P<{name}>.+)" if greedy else f"(?P<{name}>[^/]+)"
        else:
            if "{" in part or "}" in part:
                raise ValueError(f"path template {template!r} has a malformed placeholder")
            pattern += re.escape(part)
    return re.compile(f"^{pattern}/?$")
