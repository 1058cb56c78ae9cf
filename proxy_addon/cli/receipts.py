"""The receipts: `receipts reconcile`, `ls`, `show`, `resolve`, `stats` and `prune`."""

import argparse
import dataclasses
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from proxy_addon.agents.tokens import ANONYMOUS_AGENT
from proxy_addon.cli.common import EXIT_OK, Commands, argument, load, open_store
from proxy_addon.rules.records import ANY_AGENT, AgentFilter, ReceiptRecord
from proxy_addon.rules.states import RESOLUTION_STATES
from proxy_addon.units import parse_duration
from proxy_addon.views import terminal
from proxy_addon.views.documents import (
    LIST_COLUMNS,
    PUBLIC_COLUMNS,
    expand_states,
    host_query,
    parse_agent_filter,
    parse_host_filter,
    receipt_document,
    show_document,
)
from proxy_addon.views.journaled import netloc, reconcile_reads, request_view, response_view
from proxy_addon.views.review import resolve
from proxy_addon.views.terminal import age, exchange_table, print_json, table

# `receipts ls`: how a field is shown in the table (the rest as it is)
_LIST_SHOWN: dict[str, Callable[[ReceiptRecord], Any]] = {
    "created_at": lambda r: age(r.created_at),
    "host": lambda r: netloc(r.scheme, r.host, r.port),  # with its port when not the scheme's default
    "agent": lambda r: r.agent or ANONYMOUS_AGENT,
}


def cmd_ls(args: argparse.Namespace) -> int:
    store = open_store(args)
    states = expand_states([args.state]) if args.state else None
    older = timedelta(seconds=parse_duration(args.older_than)) if args.older_than else None
    rows = store.receipts.list(
        states=states, older_than=older, limit=args.limit, after=args.after, agent=args.agent, **host_query(args.host)
    )
    if args.json:
        print_json([receipt_document(r) for r in rows])
        return EXIT_OK
    if not rows:
        # a filter with a typo in it must not look like an empty journal
        print(f"0 receipts{_filters_said(args)}")
        return EXIT_OK
    table(
        f"receipts ({len(rows)}){_filters_said(args)}",
        list(LIST_COLUMNS),
        [[_LIST_SHOWN.get(field, lambda r, f=field: getattr(r, f))(r) for field in LIST_COLUMNS.values()] for r in rows],
    )
    if len(rows) == args.limit:
        print(f"older: --after {rows[-1].operation_id}")
    return EXIT_OK


def _filters_said(args: argparse.Namespace) -> str:
    said = [f"{flag} {value}" for flag, value in
            (("--state", args.state), ("--host", args.host), ("--agent", _agent_said(args.agent)),
             ("--older-than", args.older_than)) if value]
    return f" matching {' '.join(said)}" if said else ""


def _agent_said(agent: AgentFilter) -> str | None:
    return None if agent is ANY_AGENT else agent or ANONYMOUS_AGENT


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store(args)
    receipt = store.receipts.get(args.id)
    history = store.receipts.history(args.id)
    if args.json:
        print_json(show_document(receipt, history))
        return EXIT_OK
    table(
        f"receipt {receipt.operation_id}",
        ["field", "value"],
        [(c, getattr(receipt, c)) for c in PUBLIC_COLUMNS if getattr(receipt, c) is not None],
    )
    request = request_view(receipt)
    exchange_table(
        "request, as journaled (secrets redacted when it was recorded)",
        f"{request.method} {request.url}",
        request.headers,
        request.body,
        receipt.operation_id,
    )
    response = response_view(receipt)
    if response is not None:
        exchange_table("the upstream's answer, as stored", f"status {response.status_code}", response.headers,
                        response.body, receipt.operation_id)
    reads = reconcile_reads(history)
    if reads:
        table(
            "reconciler's reads",
            ["recorded_at", "read", "status", "result", "to"],
            [(r.recorded_at.isoformat(), f"{r.method} {r.url}", r.status if r.error is None else r.error,
              r.result or "-", r.to_state) for r in reads],
        )
    table(
        "history",
        ["recorded_at", "from", "to", "detail"],
        [(t.recorded_at.isoformat(), t.from_state or "-", t.to_state, json.dumps(t.detail)) for t in history],
    )
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    before, updated = resolve(open_store(args), args.id, args.state, args.note, args.external_id, args.who)
    if args.json:
        print_json(receipt_document(updated))
    else:
        print(f"{updated.operation_id}: {before.state} -> {updated.state}")
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    store = open_store(args)
    stats = store.retention.stats()
    if args.json:
        print_json(dataclasses.asdict(stats))
        return EXIT_OK
    table("by state", ["state", "count"], sorted(stats.by_state.items()))
    table(
        "by host",
        ["host", "state", "count"],
        [(h, s, n) for h, per in sorted(stats.by_host.items()) for s, n in sorted(per.items())],
    )
    age = stats.oldest_open_age_seconds
    print(f"oldest open receipt: {'none' if age is None else f'{age:.0f}s'}")
    return EXIT_OK


def cmd_prune(args: argparse.Namespace) -> int:
    store = open_store(args)
    older_than = timedelta(seconds=parse_duration(args.older_than))
    with terminal.progress_bar("pruning receipts", enabled=not args.json) as progress:
        pruned = store.retention.prune(older_than, progress)
    if args.json:
        print_json({"deleted": pruned.receipts, **pruned.as_dict()})
    else:
        print(
            f"deleted {pruned.receipts} terminal receipts completed more than {args.older_than} ago, in {pruned.batches} "
            f"batches; {pruned.refusals} duplicate refusals, {pruned.approvals} decided approvals and "
            f"{pruned.control_runs} verifier control runs older than that"
        )
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    from proxy_addon.admin.server import serve_at
    from proxy_addon.reconcile.worker import run_reconcile

    config = load(args)
    store = open_store(args, config)
    server = serve_at(config, store, args.admin_listen) if args.admin_listen else None  # its verdicts' metrics
    try:
        return run_reconcile(config, store, once=args.once)
    finally:
        if server is not None:
            server.stop()


# -- the parser ---------------------------------------------------------------------------------------------


def _parse_listen(text: str) -> tuple[str, int]:
    from proxy_addon.admin.server import parse_listen  # the admin server's imports only where it is asked for

    return parse_listen(text)


duration_arg = argument(parse_duration, keep_text=True)
host_arg = argument(parse_host_filter)
listen_arg = argument(_parse_listen)
agent_arg = argument(parse_agent_filter)
state_arg = argument(lambda text: expand_states([text]), keep_text=True)


def add_reconcile(commands: Commands) -> None:
    p = commands.command("reconcile", cmd_reconcile, "resolve outcome_unknown receipts by reading the upstream")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one pass over the queue, then exit")
    mode.add_argument("--loop", action="store_true", help="keep reconciling every reconcile.interval")
    p.add_argument("--admin-listen", type=listen_arg, metavar="HOST:PORT",
                   help="also serve the admin server (its /metrics: this worker's verdicts) there")


def add_ls(commands: Commands) -> None:
    p = commands.command("ls", cmd_ls, "list receipts, newest first")
    p.add_argument("--state", type=state_arg, help="a state, or open, or unknown (outcome_unknown, reconciling, manual_review)")
    p.add_argument("--host", type=host_arg, help="a host, or host:port ([::1]:8080 for IPv6)")
    p.add_argument("--agent", type=agent_arg, default=ANY_AGENT, help="one agent's receipts (its name), or anonymous")
    p.add_argument("--older-than", type=duration_arg, help="only receipts created longer ago than this (e.g. 10m)")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--after", metavar="ID", help="the next page: the receipts journaled before receipt ID")
    p.add_argument("--json", action="store_true")


def add_show(commands: Commands) -> None:
    p = commands.command("show", cmd_show, "one receipt: the request as journaled, the stored answer, the reconciler's reads, its history")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")


def add_resolve(commands: Commands) -> None:
    p = commands.command("resolve", cmd_resolve, "a person's verdict on a manual_review or outcome_unknown receipt")
    p.add_argument("id")
    p.add_argument("--state", required=True, choices=sorted(s.value for s in RESOLUTION_STATES))
    p.add_argument("--note", required=True)
    p.add_argument("--external-id")
    p.add_argument("--who", default="operator", help="who decides (kept in the history)")
    p.add_argument("--json", action="store_true")


def add_stats(commands: Commands) -> None:
    p = commands.command("stats", cmd_stats, "counts per state and host, oldest open receipt's age")
    p.add_argument("--json", action="store_true")


def add_prune(commands: Commands) -> None:
    p = commands.command("prune", cmd_prune, "delete terminal receipts older than DURATION (never an open one)")
    p.add_argument("--older-than", required=True, type=duration_arg)
    p.add_argument("--json", action="store_true")


COMMANDS = {
    "reconcile": add_reconcile,
    "ls": add_ls,
    "show": add_show,
    "resolve": add_resolve,
    "stats": add_stats,
    "prune": add_prune,
}
