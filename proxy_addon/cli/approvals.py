"""A person's side of writes that need approval: `receipts approvals`, `approve` and `deny`."""

import argparse

from proxy_addon.cli.common import EXIT_OK, Adder, Commands, open_store
from proxy_addon.rules.states import ApprovalState
from proxy_addon.views.approvals import LIST_COLUMNS, approval_document, approval_view
from proxy_addon.views.terminal import exchange_table, print_json, table


def cmd_approvals(args: argparse.Namespace) -> int:
    rows = open_store(args).approvals.list(state=args.state, limit=args.limit)
    if args.json:
        print_json([approval_document(a) for a in rows])
        return EXIT_OK
    if not rows:
        print("0 approvals" + (f" matching --state {args.state}" if args.state else ""))
        return EXIT_OK
    shown = [approval_view(a) for a in rows]
    table(f"approvals ({len(rows)})", list(LIST_COLUMNS), [[getattr(v, c) for c in LIST_COLUMNS] for v in shown])
    for v in shown:
        if v.state == ApprovalState.PENDING:
            exchange_table(f"{v.approval_id}: the request, as journaled (secrets redacted)", f"{v.method} {v.url}",
                           v.request.headers, v.request.body, v.approval_id, "receipts approvals --json")
    return EXIT_OK


def cmd_decide(args: argparse.Namespace) -> int:
    """`receipts approve` and `receipts deny`."""
    decided = open_store(args).approvals.decide(args.id, args.decision, args.note, args.who)
    if args.json:
        print_json(approval_document(decided))
    else:
        print(f"{decided.approval_id}: pending -> {decided.state} ({decided.operation}; until {decided.expires_at:%Y-%m-%dT%H:%M:%SZ})")
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------------------------


def add_approvals(commands: Commands) -> None:
    p = commands.command("approvals", cmd_approvals, "approvals, newest first; each pending one with its request as journaled")
    p.add_argument("--state", choices=[s.value for s in ApprovalState])
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--json", action="store_true")


def _add_decision(name: str, help: str) -> Adder:
    def add(commands: Commands) -> None:
        p = commands.command(name, cmd_decide, help)
        p.add_argument("id")
        p.add_argument("--note", required=True, help="why; kept with the approval and shown to the agent")
        p.add_argument("--who", default="operator", help="who decides (kept with the approval)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(decision=name)

    return add


COMMANDS = {
    "approvals": add_approvals,
    "approve": _add_decision("approve", "approve a pending request: the same request, sent again, is forwarded once"),
    "deny": _add_decision("deny", "deny a pending request: the agent is answered 403 approval-denied with the note"),
}
