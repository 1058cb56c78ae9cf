"""The suggestions as YAML to paste into config.yaml's `hosts:`, each rule marked with where in the document it
came from, and the writes without a read rule listed after it, each with why. Nothing is written to a file."""

import json
from collections import Counter
from collections.abc import Sequence

import yaml

from proxy_addon.suggest.openapi import Api
from proxy_addon.suggest.suggest import Suggestion
from proxy_addon.suggest.urls import Target

RULE_INDENT = " " * 6  # under hosts: HOST: operations:


def counts(suggestions: Sequence[Suggestion]) -> dict[str, int]:
    """Writes seen, and how many got each strategy (`none`: no read rule)."""
    by_strategy = Counter(s.strategy or "none" for s in suggestions)
    return {"writes": len(suggestions), **{k: by_strategy[k] for k in ("lookup", "search", "none")}}


def summary_line(suggestions: Sequence[Suggestion]) -> str:
    c = counts(suggestions)
    writes = f"{c['writes']} write" + ("" if c["writes"] == 1 else "s")
    return f"{writes}: {c['lookup']} lookup, {c['search']} search, {c['none']} without a read rule"


def render(suggestions: Sequence[Suggestion], target: Target, api: Api, source: str) -> str:
    with_rules = [s for s in suggestions if s.rule is not None]
    lines = [
        f"# receipts rules suggest --openapi {source}: {api.title} {api.version}".rstrip(),
        f"# {summary_line(suggestions)}",
        "# A start, not a proof: paste it under hosts:, let a write of each operation succeed through the proxy,",
        "# then `receipts rules check` runs each read rule's verifier controls on the live API.",
        "hosts:",
        f"  {json.dumps(target.host)}:",
        "    operations:" + ("" if with_rules else " []"),
    ]
    for s in with_rules:
        lines.extend(_rule_lines(s))
    without = [s for s in suggestions if s.rule is None]
    if without:
        lines.append("# no read rule:")
        lines.extend(f"#   {s.write.method} {s.write.path} ({s.write.name}): {s.note}" for s in without)
    return "\n".join(lines) + "\n"


def _rule_lines(s: Suggestion) -> list[str]:
    assert s.rule is not None
    read = f"; read: {s.strategy} {s.read.where}" if s.read is not None else ""
    lines = [f"{RULE_INDENT}# from: {s.write.where}{read}"]
    if s.note:
        lines.append(f"{RULE_INDENT}# note: {s.note}")
    dumped = yaml.safe_dump([s.rule], sort_keys=False, width=10_000, allow_unicode=True)
    lines.extend(RULE_INDENT + line for line in dumped.splitlines())
    return lines
