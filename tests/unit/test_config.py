"""config.yaml: the contract's example config, one-line errors naming the key, and the
per-host policy and operation lookups."""

import pytest
from structlog.testing import capture_logs

from proxy_addon.config import BUILTIN_SECRET_HEADERS, load_config, parse_config
from proxy_addon.exceptions import ConfigError
from proxy_addon.rules.operations import compile_path_template

# The example config of CONTRACT.md, verbatim.
CONTRACT_EXAMPLE = """\
database:
  url: sqlite:///receipts.db            # or postgresql+psycopg://user@host/db
defaults:                               # every host inherits these
  upstream_timeout: 30s                 # idle: longest wait for the answer to begin and between its reads
  upstream_deadline: null               # optional bound on the whole exchange, e.g. 5m
  unknown_statuses: [500, 502, 503, 504]   # upstream answers that mean "outcome unknown"
  after_success: {policy: replay, window: 15m}
  redact_headers: [X-Custom-Token]      # added to the built-in secret headers
  redact_fields: [password, token, secret, api_key]   # body fields, at any depth (added to the built-in names)
  in_flight: {policy: refuse, max_wait: 30s}   # refuse | wait: a repeat while the original is still in flight
hosts:
  "api.example.com":                    # a host, or host:port (host:port wins over host)
    upstream_timeout: 10s
    inject_idempotency_key: false       # true: send the operation id as Idempotency-Key upstream
    approval: {required: false, expires: 1h}   # true: a person approves each intent before it is forwarded
    operations:
      - name: articles.create
        method: POST
        path: /api/articles             # templates like /api/articles/{id} match one segment per {name}
        fingerprint: {fields: [$.title, $.body_markdown]}   # allowlist; default: the whole redacted body
        external_id: $.id               # JSON path into the success response, or "header:Location"
        retry_safe: true
        reconcile:
          strategy: search              # lookup | search | resend_with_key
          url: "{scheme}://{netloc}/api/articles?per_page=30"  # {scheme} {host} (name only) {port}
                                        # {netloc} (host:port as requested) {path.NAME} {body.FIELD}
                                        # {external_id} {idempotency_key} {operation_id} {submitted_at}
          headers: {Authorization: "Bearer ${DEV_API_KEY}"}  # ${VAR} from the environment, never stored
          items: $.items                # search: where the list is (default: the response is the list)
          match: {$.title: $.title}     # candidate's field: the original request body's field
          id: $.id                      # candidate's id
          settle: 30s                   # no absence verdict before this long after submission
          attempts: 3                   # failed reads (error, timeout, non-2xx) before manual_review;
                                        # each failed read leaves the receipt outcome_unknown, retried with backoff
          absent_means: safe_to_retry   # only with retry_safe; for DELETE a rule may say succeeded
"""


def test_the_contract_example_config_parses():
    cfg = parse_config(CONTRACT_EXAMPLE)
    assert cfg.database.url == "sqlite:///receipts.db"
    assert (cfg.defaults.upstream_timeout, cfg.defaults.unknown_statuses) == (30.0, [500, 502, 503, 504])
    assert (cfg.defaults.after_success.policy, cfg.defaults.after_success.window) == ("replay", 900.0)
    assert cfg.defaults.upstream_deadline is None
    assert (cfg.defaults.in_flight.policy, cfg.defaults.in_flight.max_wait) == ("refuse", 30.0)
    host = cfg.hosts["api.example.com"]
    assert (host.upstream_timeout, host.inject_idempotency_key) == (10.0, False)
    (op,) = host.operations
    assert (op.name, op.method, op.path, op.external_id, op.retry_safe) == (
        "articles.create", "POST", "/api/articles", "$.id", True)
    assert [p.text for p in op.fingerprint.fields] == ["$.title", "$.body_markdown"]
    r = op.reconcile
    assert (r.strategy, r.url, r.items.text, r.match, r.id.text) == (
        "search", "{scheme}://{netloc}/api/articles?per_page=30", "$.items", {"$.title": "$.title"}, "$.id")
    assert (r.settle, r.attempts, r.absent_means) == (30.0, 3, "safe_to_retry")
    assert r.headers == {"Authorization": "Bearer ${DEV_API_KEY}"}  # expanded only when used, never stored


def test_empty_file_is_all_defaults():
    cfg = parse_config("")
    assert cfg.hosts == {} and cfg.defaults.after_success.policy == "replay" and not cfg.proxy.fail_open


def test_upstream_connections_and_keepalive_per_host():
    cfg = parse_config("defaults: {upstream_keepalive: 3s}\nhosts:\n  a.test: {upstream_connections: fresh}\n"
                       "  b.test: {upstream_keepalive: 1s}\n")
    a, b, other = (cfg.policy_for(h, 443) for h in ("a.test", "b.test", "c.test"))
    assert (a.upstream_connections, a.upstream_keepalive) == ("fresh", 3.0)
    assert (b.upstream_connections, b.upstream_keepalive) == ("reuse", 1.0)
    assert (other.upstream_connections, parse_config("").policy_for("c.test", 443).upstream_keepalive) == ("reuse", 4.0)


HOST = "hosts:\n  api.example.com:\n"
OP = HOST + "    operations:\n      - name: a\n        method: POST\n        path: /a\n"


@pytest.mark.parametrize("text, key", [
    ("defaults:\n  upstrem_timeout: 10s\n", "defaults.upstrem_timeout"),
    ("databse:\n  url: x\n", "databse"),
    (HOST + "    operations: []\n    colour: blue\n", "hosts.api.example.com.colour"),
    (HOST + "    inject_idempotency_key: maybe\n", "hosts.api.example.com.inject_idempotency_key"),
    (HOST + "    unknown_statuses: [500, 700]\n", "hosts.api.example.com.unknown_statuses.1"),
    (HOST + "    upstream_timeout: 10 sec\n", "hosts.api.example.com.upstream_timeout"),
    (HOST + "    upstream_connections: pooled\n", "hosts.api.example.com.upstream_connections"),
    ("defaults:\n  upstream_keepalive: 0s\n", "defaults.upstream_keepalive"),
    ("defaults:\n  after_success: {policy: replay, window: forever}\n", "defaults.after_success.window"),
    ("defaults:\n  after_success: {policy: maybe}\n", "defaults.after_success.policy"),
    ("proxy:\n  max_stored_body: lots\n", "proxy.max_stored_body"),
    (OP + "        external_id: id\n", "hosts.api.example.com.operations.0.external_id"),
    (OP + "        fingerprint: {fields: [title]}\n", "hosts.api.example.com.operations.0.fingerprint.fields.0"),
    (OP + "        reconcile: {strategy: search, url: 'https://x/', match: {title: $.title}}\n",
     "hosts.api.example.com.operations.0.reconcile.match"),
    (OP.replace("path: /a", "path: '/a/{id'"), "hosts.api.example.com.operations.0.path"),
    (OP.replace("path: /a", "path: 'a/{id}'"), "hosts.api.example.com.operations.0.path"),
    (OP.replace("path: /a", "path: '/a/{id}/{id}'"), "hosts.api.example.com.operations.0.path"),
    (OP.replace("method: POST", "method: 'GE T'"), "hosts.api.example.com.operations.0.method"),  # not a token
    (HOST + "    approval: maybe\n", "hosts.api.example.com.approval"),
    (OP + "        approval: {required: true, expires: soon}\n", "hosts.api.example.com.operations.0.approval.expires"),
    (OP + "        reconcile: {strategy: lookup, url: 'https://x/{nope}'}\n",
     "hosts.api.example.com.operations.0.reconcile.url"),
    (OP + "        reconcile: {strategy: lookup}\n", "hosts.api.example.com.operations.0.reconcile"),
    (OP + "        retry_safe: true\n        reconcile: {strategy: lookup, url: 'https://x/{external_id}', "
     "absent_means: succeeded}\n", "hosts.api.example.com.operations.0"),
])
def test_invalid_config_is_one_line_naming_the_key(text, key):
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="config.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"config.yaml: {key}: "), message


def test_absent_means_succeeded_is_for_delete_only():
    rule = "        reconcile: {strategy: lookup, url: 'https://x/{external_id}', absent_means: succeeded}\n"
    with pytest.raises(ConfigError, match="absent_means: succeeded is only allowed for DELETE"):
        parse_config(OP + rule)
    deleting = parse_config(OP.replace("method: POST", "method: DELETE") + rule)
    assert deleting.hosts["api.example.com"].operations[0].reconcile.absent_means == "succeeded"
    # without retry_safe, the default "absence means safe to retry" is handed to a person instead
    lookup = parse_config(OP + "        reconcile: {strategy: lookup, url: 'https://x/{external_id}'}\n")
    assert lookup.hosts["api.example.com"].operations[0].reconcile.absent_means == "manual_review"


@pytest.mark.parametrize("text, line", [
    ("database:\n  url: sqlite:///x.db\ndefaults:\n  upstream_timeout: [30s\n  unknown: 1\n", 5),
    ("a: b\n c: d\n", 2),
    ("hosts:\n\t- x\n", 2),
])
def test_invalid_yaml_names_the_line(text, line):
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="c.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith(f"c.yaml: line {line}: invalid YAML")


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(text):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config(text)


def test_load_config_reads_a_file_and_names_a_missing_one(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(CONTRACT_EXAMPLE)
    assert load_config(path).hosts["api.example.com"].upstream_timeout == 10.0
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nope.yaml")
    assert "\n" not in str(err.value) and "nope.yaml" in str(err.value)


POLICY = """\
defaults:
  upstream_timeout: 30s
  unknown_statuses: [502]
  redact_headers: [X-Default-Token]
  redact_fields: [password]
hosts:
  API.example.com:
    upstream_timeout: 10s
    redact_headers: [X-Host-Token]
    redact_fields: [ssn]
    after_success: {policy: refuse, window: 1h}
  "api.example.com:8443":
    unknown_statuses: [500, 503]
  "other.example.com:8080": {}
"""


@pytest.mark.parametrize("host, port, timeout, statuses, policy", [
    ("api.example.com", 443, 10.0, {502}, "refuse"),
    ("API.EXAMPLE.COM", 443, 10.0, {502}, "refuse"),
    ("api.example.com", 8443, 30.0, {500, 503}, "replay"),  # host:port wins; the rest from defaults
    ("other.example.com", 8080, 30.0, {502}, "replay"),
    ("unknown.example.com", 443, 30.0, {502}, "replay"),
])
def test_policy_for_merges_defaults_and_host(host, port, timeout, statuses, policy):
    p = parse_config(POLICY).policy_for(host, port)
    assert (p.upstream_timeout, p.unknown_statuses, p.after_success.policy) == (timeout, statuses, policy)
    assert p.connect_timeout == 10.0 and p.idempotency_key_header == "Idempotency-Key"


def test_policy_redaction_adds_to_builtins_and_is_cached():
    cfg = parse_config(POLICY)
    p = cfg.policy_for("api.example.com", 443)
    assert p.redact_headers == {"x-default-token", "x-host-token"}  # the configured ones ...
    assert all(h in p.redact_headers for h in [*BUILTIN_SECRET_HEADERS, "X-Default-Token", "X-Host-Token", "x-goog-api-key"])
    assert "content-type" not in p.redact_headers  # ... and `in` applies the built-in rules besides
    assert p.redact_fields == {"password", "ssn"}
    assert "SSN" in p.redact_fields and "client_secret" in p.redact_fields and "title" not in p.redact_fields
    assert cfg.policy_for("unknown.example.com", 1).redact_fields == {"password"}
    assert "ssn" not in cfg.policy_for("unknown.example.com", 1).redact_fields
    assert cfg.policy_for("API.example.com", 443) is p


ROUTES = parse_config("""\
hosts:
  h:
    operations:
      - {name: list.create, method: POST, path: /api/articles}
      - {name: article.update, method: PUT, path: "/api/articles/{id}"}
      - {name: comment.create, method: POST, path: "/api/articles/{id}/comments"}
      - {name: comment.delete, method: DELETE, path: "/api/articles/{article_id}/comments/{comment_id}"}
      - {name: file.put, method: PUT, path: "/files/{name}.json"}
      - {name: versioned, method: POST, path: /api/v1.0/items}
""").policy_for("h", 443)


@pytest.mark.parametrize("method, path, name, params", [
    ("POST", "/api/articles", "list.create", {}),
    ("POST", "/api/articles/", "list.create", {}),
    ("PUT", "/api/articles/42", "article.update", {"id": "42"}),
    ("PUT", "/api/articles/a%2Fb", "article.update", {"id": "a%2Fb"}),
    ("POST", "/api/articles/42/comments", "comment.create", {"id": "42"}),
    ("DELETE", "/api/articles/7/comments/9", "comment.delete", {"article_id": "7", "comment_id": "9"}),
    ("PUT", "/files/report.json", "file.put", {"name": "report"}),
    ("POST", "/api/v1.0/items", "versioned", {}),
    ("PUT", "/api/articles/42/extra", None, None),
    ("PUT", "/api/articles/", None, None),
    ("PUT", "/api/articles/a/b", None, None),
    ("DELETE", "/api/articles/7/comments", None, None),
    ("GET", "/api/articles", None, None),
    ("PATCH", "/api/articles/42", None, None),
    ("POST", "/api/v1x0/items", None, None),
    ("POST", "/prefix/api/articles", None, None),
])
def test_match_operation_one_segment_per_placeholder(method, path, name, params):
    found = ROUTES.match_operation(method, path)
    assert (found and (found[0].name, found[1])) == ((name, params) if name else None)


@pytest.mark.parametrize("template", ["/a/{id", "/a/id}", "/a/{id}/{id}", "/a/{1x}"])
def test_malformed_path_templates_are_refused(template):
    with pytest.raises(ValueError):
        compile_path_template(template)


@pytest.mark.parametrize("text, key", [
    ("defaults: {upstream_timeout: 0s}", "defaults.upstream_timeout"),
    ("defaults: {upstream_timeout: 0}", "defaults.upstream_timeout"),
    ("defaults: {upstream_deadline: 0ms}", "defaults.upstream_deadline"),
    ("defaults: {connect_timeout: 0s}", "defaults.connect_timeout"),
    ("defaults: {in_flight: {policy: wait, max_wait: 0s}}", "defaults.in_flight.max_wait"),
    (HOST + "    upstream_timeout: 0s\n", "hosts.api.example.com.upstream_timeout"),
    (HOST + "    upstream_deadline: 0s\n", "hosts.api.example.com.upstream_deadline"),
    (HOST + "    in_flight: {policy: later}\n", "hosts.api.example.com.in_flight.policy"),
    ("proxy: {journal_timeout: 0s}", "proxy.journal_timeout"),
])
def test_a_timeout_of_zero_is_refused_naming_the_key(text, key):
    """A 0s timeout would end every exchange before it began: every write "unknown". Refused at load."""
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="config.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"config.yaml: {key}: "), message
    if "policy" not in key:
        assert "must be more than 0s" in message


def test_upstream_deadline_and_in_flight_per_host():
    cfg = parse_config(
        "defaults: {upstream_deadline: 5m, in_flight: {policy: wait, max_wait: 10s}}\n"
        "hosts:\n"
        "  inherits.example.com: {upstream_timeout: 5s}\n"
        "  own.example.com: {upstream_deadline: 10s, in_flight: {policy: refuse}}\n"
        "  none.example.com: {upstream_deadline: null}\n"
    )
    inherits, own, none = (cfg.policy_for(f"{h}.example.com", 443) for h in ("inherits", "own", "none"))
    assert (inherits.upstream_timeout, inherits.upstream_deadline, inherits.in_flight.policy) == (5.0, 300.0, "wait")
    assert (own.upstream_deadline, own.in_flight.policy, own.in_flight.max_wait) == (10.0, "refuse", 30.0)
    assert none.upstream_deadline is None  # a host may turn the default deadline off
    assert parse_config("").policy_for("x", 443).upstream_deadline is None


def test_journal_timeout_is_a_duration_of_15s_by_default():
    assert parse_config("").proxy.journal_timeout == 15.0
    assert parse_config("proxy: {journal_timeout: 1500ms}").proxy.journal_timeout == 1.5


def test_a_renamed_key_keeps_working_with_a_deprecation_line_and_both_names_are_refused():
    with capture_logs() as logged:
        assert parse_config("proxy: {journal_threads: 3}").proxy.database_threads == 3
    assert [(e["event"], e["key"], e["use"]) for e in logged] == [("config_key_deprecated", "proxy.journal_threads", "proxy.database_threads")]
    assert parse_config("proxy: {database_threads: 5}").proxy.database_threads == 5
    with pytest.raises(ConfigError, match=r"proxy.journal_threads is the old name of proxy.database_threads"):
        parse_config("proxy: {journal_threads: 3, database_threads: 4}")


@pytest.mark.parametrize("host, rule, expected", [
    ("approval: required", "", (True, 3600.0)),
    ("approval: {required: true, expires: 15m}", "", (True, 900.0)),
    ("approval: required", "approval: {required: false}", None),  # the rule's own setting wins
    ("", "approval: {required: true, expires: 2s}", (True, 2.0)),
    ("", "", None),
])
def test_approval_comes_from_the_rule_else_the_host(host, rule, expected):
    from proxy_addon.rules.approvals import approval_for

    cfg = parse_config(f"hosts:\n  a.example:\n    {host or 'journal: true'}\n    operations:\n"
                       f"      - {{name: x, method: POST, path: /x{', ' + rule if rule else ''}}}\n")
    policy = cfg.policy_for("a.example", 443)
    ask = approval_for(policy.approval, policy.operations[0].approval)
    assert (None if ask is None else (True, ask.expires)) == expected
