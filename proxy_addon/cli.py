"""The `receipts` command: set up the database, run the proxy, and look at or settle receipts.

Exit codes: 0 success, 1 a failed operation, 2 bad usage (including a bad config or URL).
"""

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from proxy_addon import __version__
from proxy_addon.agent_env import CA_CERT_NAME, exports
from proxy_addon.config import ReceiptsConfig, admin_settings, load_config
from proxy_addon.db import alembic_config, check_schema, make_engine, resolve_database_url
from proxy_addon.exceptions import ConfigError, InvalidResolutionError, ReceiptsError
from proxy_addon.resources import ADDON_SCRIPT, EXAMPLE_CONFIG
from proxy_addon.rules.records import ReceiptRecord
from proxy_addon.rules.redaction import SecretFields, SecretHeaders
from proxy_addon.rules.states import RESOLUTION_STATES, ApprovalState
from proxy_addon.store import ReceiptStore
from proxy_addon.units import parse_duration
from proxy_addon.views import terminal
from proxy_addon.views.approvals import LIST_COLUMNS as APPROVAL_COLUMNS
from proxy_addon.views.approvals import approval_document, approval_view
from proxy_addon.views.documents import (
    LIST_COLUMNS,
    PUBLIC_COLUMNS,
    HostFilter,
    expand_states,
    host_query,
    parse_host_filter,
    receipt_document,
    show_document,
)
from proxy_addon.views.journaled import netloc, reconcile_reads, request_view, response_view
from proxy_addon.views.review import resolve
from proxy_addon.views.terminal import age, exchange_table, print_json, table

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# -- plumbing -----------------------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> ReceiptsConfig:
    return load_config(args.config)


def _store(args: argparse.Namespace, config: ReceiptsConfig | None = None) -> ReceiptStore:
    config = config or _config(args)
    return _store_at(resolve_database_url(config.database.url))


def _store_at(url: str) -> ReceiptStore:
    """The store on this database, once its schema is checked to be migrated."""
    engine = make_engine(url)
    check_schema(engine)
    return ReceiptStore(engine)


# -- commands -----------------------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    """Writes the default config where `--config` says: an install has no repository to copy config.yaml from.
    Never over a file that exists (its database and secret may be in use) unless `--force` says so."""
    target = Path(args.config)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w" if args.force else "x", encoding="utf-8") as out:
            out.write(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    except FileExistsError:
        raise ReceiptsError(f"{target} exists: not overwritten (--force replaces it)") from None
    except OSError as e:
        raise ReceiptsError(f"cannot write {target}: {e.strerror or e}") from e
    print(f"wrote {target}: the default config, each key explained in it")
    print(f"next: receipts db upgrade --config {target} && receipts proxy --config {target}")
    print(f"a plain mitmproxy loads the addon with: mitmdump -s {ADDON_SCRIPT} --set receipts_config={target.absolute()}")
    return EXIT_OK


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from alembic import command

    config = _config(args)
    url = resolve_database_url(config.database.url)
    make_engine(url).dispose()  # validates the URL with a clear message
    try:
        command.upgrade(alembic_config(url), "head")
    except Exception as e:  # alembic/SQLAlchemy raise many kinds; the operator needs one line
        raise ReceiptsError(f"migration failed: {str(getattr(e, 'orig', None) or e).strip().splitlines()[0]}") from e
    print(f"database at migration head ({_safe_url(url)})")
    return EXIT_OK


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def cmd_proxy(args: argparse.Namespace) -> int:
    config = _config(args)
    _store(args, config).engine.dispose()  # refuse to start on an unmigrated or unreachable database
    return asyncio.run(_run_proxy(args))


async def _run_proxy(args: argparse.Namespace) -> int:
    from mitmproxy import exceptions, options
    from mitmproxy.tools.dump import DumpMaster

    from proxy_addon.addons.dispatch import use_quick_dispatch
    from proxy_addon.addons.receipts import make_addons

    logging.getLogger().setLevel(logging.INFO)  # mitmproxy's own lines ("HTTP(S) proxy listening at ...")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    opts = options.Options(listen_host=args.listen_host, listen_port=args.listen_port)
    if args.confdir:
        opts.update(confdir=args.confdir)
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    use_quick_dispatch(master)
    master.addons.add(*make_addons())
    try:
        # lazy: with HTTPS, do not open an upstream connection before the request is known
        opts.update(connection_strategy="lazy", receipts_config=args.config, ssl_insecure=args.ssl_insecure)
        for spec in args.set or []:
            opts.set(spec)
    except exceptions.OptionsError as e:
        print(f"receipts proxy: {e}", file=sys.stderr)
        return EXIT_USAGE
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()
    return EXIT_OK


# `receipts ls`: how a field is shown in the table (the rest as it is)
_LIST_SHOWN: dict[str, Callable[[ReceiptRecord], Any]] = {
    "created_at": lambda r: age(r.created_at),
    "host": lambda r: netloc(r.scheme, r.host, r.port),  # with its port when not the scheme's default
}


def cmd_ls(args: argparse.Namespace) -> int:
    store = _store(args)
    states = expand_states([args.state]) if args.state else None
    older = timedelta(seconds=parse_duration(args.older_than)) if args.older_than else None
    rows = store.receipts.list(states=states, older_than=older, limit=args.limit, after=args.after, **host_query(args.host))
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
            (("--state", args.state), ("--host", args.host), ("--older-than", args.older_than)) if value]
    return f" matching {' '.join(said)}" if said else ""


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
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


def cmd_env(args: argparse.Namespace) -> int:
    """The exports that point a shell, and the agent it starts, at the proxy: `eval "$(receipts env)"`."""
    from mitmproxy.options import CONF_DIR

    confdir = Path(args.confdir or CONF_DIR).expanduser().absolute()
    print("\n".join(exports(args.listen_host, args.listen_port, confdir)))
    if not (confdir / CA_CERT_NAME).exists():
        print(f"receipts env: {confdir / CA_CERT_NAME} does not exist yet: start the proxy once (make run) to create it",
              file=sys.stderr)
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    before, updated = resolve(_store(args), args.id, args.state, args.note, args.external_id, args.who)
    if args.json:
        print_json(receipt_document(updated))
    else:
        print(f"{updated.operation_id}: {before.state} -> {updated.state}")
    return EXIT_OK


def cmd_approvals(args: argparse.Namespace) -> int:
    rows = _store(args).approvals.list(state=args.state, limit=args.limit)
    if args.json:
        print_json([approval_document(a) for a in rows])
        return EXIT_OK
    if not rows:
        print("0 approvals" + (f" matching --state {args.state}" if args.state else ""))
        return EXIT_OK
    shown = [approval_view(a) for a in rows]
    table(f"approvals ({len(rows)})", list(APPROVAL_COLUMNS), [[getattr(v, c) for c in APPROVAL_COLUMNS] for v in shown])
    for v in shown:
        if v.state == ApprovalState.PENDING:
            exchange_table(f"{v.approval_id}: the request, as journaled (secrets redacted)", f"{v.method} {v.url}",
                           v.request.headers, v.request.body, v.approval_id, "receipts approvals --json")
    return EXIT_OK


def cmd_decide(args: argparse.Namespace) -> int:
    """`receipts approve` and `receipts deny`."""
    decided = _store(args).approvals.decide(args.id, args.decision, args.note, args.who)
    if args.json:
        print_json(approval_document(decided))
    else:
        print(f"{decided.approval_id}: pending -> {decided.state} ({decided.operation}; until {decided.expires_at:%Y-%m-%dT%H:%M:%SZ})")
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    store = _store(args)
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
    store = _store(args)
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


def cmd_scrub(args: argparse.Namespace) -> int:
    config = _config(args)
    store = _store(args, config)

    def rules(host: str, port: int) -> tuple[SecretHeaders, SecretFields]:
        policy = config.policy_for(host, port)
        return policy.redact_headers, policy.redact_fields

    counts = store.scrub.run(rules, dry_run=args.dry_run)
    if args.vacuum and not args.dry_run:
        store.scrub.vacuum()
    if args.json:
        print_json({**dataclasses.asdict(counts), "dry_run": args.dry_run})
    else:
        verb = "would change" if args.dry_run else "changed"
        print(
            f"{verb} {counts.receipts_changed} of {counts.receipts_read} receipts and "
            f"{counts.transitions_changed} of {counts.transitions_read} history rows"
        )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from proxy_addon.audit.checkpoint import load_public_key
    from proxy_addon.audit.verify import verify

    public_key = None if args.public_key is None else load_public_key(args.public_key)
    audit = _audited_store(args).audit
    report = verify(audit.checkpoints(), audit.chains(), audit.events, public_key)
    if args.json:
        print_json({"ok": report.ok, **dataclasses.asdict(report)})
        return EXIT_OK if report.ok else EXIT_FAILED
    for finding in report.findings:
        print(f"{finding.operation_id}: {finding.how.value}: {finding.detail}")
    for note in report.notes:
        print(f"note: {note}")
    checked = f"{report.receipts} receipts, {report.rows} history rows, {report.checkpoints} checkpoints"
    print(f"verified {checked}: " + ("every chain holds" if report.ok else f"{len(report.findings)} problems"))
    return EXIT_OK if report.ok else EXIT_FAILED


def _audited_store(args: argparse.Namespace) -> ReceiptStore:
    """The database `verify` reads: `--database` (an auditor's copy: no config needed), else the config's."""
    return _store(args) if args.database is None else _store_at(args.database)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from proxy_addon.audit.checkpoint import load_or_create_signing_key, make_checkpoint
    from proxy_addon.rules.records import utcnow

    config = _config(args)
    key_file = config.audit.signing_key_file
    key = load_or_create_signing_key(key_file)
    made = _store(args, config).audit.add_checkpoint(
        lambda heads, previous, note: make_checkpoint(key, heads, utcnow(), previous, note)
    )
    document = {name: getattr(made, name) for name in ("id", "created_at", "root", "signed", "signature", "public_key", "note")}
    if args.json:
        print_json({**document, "receipts": len(made.heads)})
    else:
        print(f"checkpoint {made.id}: {len(made.heads)} receipts, root {made.root}, signed with {key_file}")
        print(f"an auditor checks it with: receipts verify --public-key {key_file}.pub")
    return EXIT_OK


def cmd_admin(args: argparse.Namespace) -> int:
    from proxy_addon.admin.server import AdminServer

    config = _config(args)
    store = _store(args, config)
    settings = admin_settings(config, listen_host=args.listen_host, listen_port=args.listen_port, enabled=True)
    server = AdminServer(config, store, settings=settings)
    try:
        server.start()
    except OSError as e:
        store.engine.dispose()
        raise ReceiptsError(f"cannot listen on {settings.listen_host}:{settings.listen_port}: {e.strerror or e}") from e
    print(f"receipts admin on {server.url} (Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    store.engine.dispose()
    return EXIT_OK


def cmd_rules_check(args: argparse.Namespace) -> int:
    from proxy_addon.reconcile.check import check_rules
    from proxy_addon.views.rule_health import rows

    config = _config(args)
    health = asyncio.run(check_rules(config, _store(args, config)))
    if args.json:
        print_json([h.document() for h in health])
    else:
        table("read rules", ["host", "operation", "proven", "positive", "negative"], rows(health))
    return EXIT_OK


def cmd_reconcile(args: argparse.Namespace) -> int:
    from proxy_addon.admin.server import serve_at
    from proxy_addon.reconcile.worker import run_reconcile

    config = _config(args)
    store = _store(args, config)
    server = serve_at(config, store, args.admin_listen) if args.admin_listen else None  # its verdicts' metrics
    try:
        return run_reconcile(config, store, once=args.once)
    finally:
        if server is not None:
            server.stop()


# -- parser -------------------------------------------------------------------------------------------------


def _duration_arg(text: str) -> str:
    try:
        parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _host_arg(text: str) -> HostFilter:
    try:
        return parse_host_filter(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _listen_arg(text: str) -> tuple[str, int]:
    from proxy_addon.admin.server import parse_listen

    try:
        return parse_listen(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _state_arg(text: str) -> str:
    try:
        expand_states([text])
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="receipts", description="Durable receipts for the writes AI agents make over HTTP.")
    parser.add_argument("--version", action="version", version=f"receipts {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, handler: Callable[[argparse.Namespace], int], help: str, parent: Any = sub) -> Any:
        p = parent.add_parser(name, help=help, description=help)
        p.add_argument("--config", default="config.yaml", help="config file (default ./config.yaml)")
        p.set_defaults(handler=handler)
        return p

    p = command("init", cmd_init, "write the default config to --config (every key explained in it), to edit")
    p.add_argument("--force", action="store_true", help="replace a file that is there")

    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    command("upgrade", cmd_db_upgrade, "apply the Alembic migrations (upgrade head)", db_sub)

    rules = sub.add_parser("rules", help="the reconcile read rules")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True, parser_class=_Parser)
    p = command("check", cmd_rules_check, "run every read rule's verifier controls on the live upstream; say which are proven", rules_sub)
    p.add_argument("--json", action="store_true")

    p = command("proxy", cmd_proxy, "run the journaling proxy")
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--listen-port", type=int, default=8080)
    p.add_argument("--confdir", default=None, help="mitmproxy's directory for its CA (default ~/.mitmproxy)")
    p.add_argument("--ssl-insecure", action="store_true", help="do not verify upstream TLS certificates")
    p.add_argument("--set", action="append", metavar="OPTION=VALUE", help="any mitmproxy option")

    p = command("env", cmd_env, "print the shell exports that point an agent at the proxy (HTTP(S)_PROXY, the CA variables)")
    p.add_argument("--listen-host", default="127.0.0.1", help="the proxy's address, as given to receipts proxy")
    p.add_argument("--listen-port", type=int, default=8080)
    p.add_argument("--confdir", default=None, help="mitmproxy's directory for its CA, as given to receipts proxy (default ~/.mitmproxy)")

    _add_receipt_commands(command)
    return parser


def _add_receipt_commands(command: Callable[..., Any]) -> None:
    """The commands over the receipts: reconcile, ls, show, resolve, admin, scrub, stats, prune, verify, checkpoint."""
    p = command("reconcile", cmd_reconcile, "resolve outcome_unknown receipts by reading the upstream")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one pass over the queue, then exit")
    mode.add_argument("--loop", action="store_true", help="keep reconciling every reconcile.interval")
    p.add_argument("--admin-listen", type=_listen_arg, metavar="HOST:PORT",
                   help="also serve the admin server (its /metrics: this worker's verdicts) there")

    p = command("ls", cmd_ls, "list receipts, newest first")
    p.add_argument("--state", type=_state_arg, help="a state, or open, or unknown (outcome_unknown, reconciling, manual_review)")
    p.add_argument("--host", type=_host_arg, help="a host, or host:port ([::1]:8080 for IPv6)")
    p.add_argument("--older-than", type=_duration_arg, help="only receipts created longer ago than this (e.g. 10m)")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--after", metavar="ID", help="the next page: the receipts journaled before receipt ID")
    p.add_argument("--json", action="store_true")

    p = command("show", cmd_show, "one receipt: the request as journaled, the stored answer, the reconciler's reads, its history")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")

    p = command("resolve", cmd_resolve, "a person's verdict on a manual_review or outcome_unknown receipt")
    p.add_argument("id")
    p.add_argument("--state", required=True, choices=sorted(s.value for s in RESOLUTION_STATES))
    p.add_argument("--note", required=True)
    p.add_argument("--external-id")
    p.add_argument("--who", default="operator", help="who decides (kept in the history)")
    p.add_argument("--json", action="store_true")

    p = command("admin", cmd_admin, "serve the admin API, review page and /metrics (the config's admin section)")
    p.add_argument("--listen-host", default=None, help="default admin.listen_host (127.0.0.1)")
    p.add_argument("--listen-port", type=int, default=None, help="default admin.listen_port (8081)")

    p = command("scrub", cmd_scrub, "redact secrets that earlier versions stored, with today's rules")
    p.add_argument("--dry-run", action="store_true", help="count what would change, change nothing")
    p.add_argument("--vacuum", action="store_true", help="then rewrite the database files (VACUUM), so no old byte stays on disk")
    p.add_argument("--json", action="store_true")

    _add_approval_commands(command)

    p = command("stats", cmd_stats, "counts per state and host, oldest open receipt's age")
    p.add_argument("--json", action="store_true")

    p = command("prune", cmd_prune, "delete terminal receipts older than DURATION (never an open one)")
    p.add_argument("--older-than", required=True, type=_duration_arg)
    p.add_argument("--json", action="store_true")

    p = command("verify", cmd_verify, "check every receipt's history against its hash chain (exit 1 naming each one changed)")
    p.add_argument("--public-key", help="also check every checkpoint with this PEM public key, and what was deleted since")
    p.add_argument("--database", metavar="URL", help="the database to verify, e.g. an auditor's copy (default: the config's)")
    p.add_argument("--json", action="store_true")

    p = command("checkpoint", cmd_checkpoint, "sign every receipt's history head now (audit.signing_key_file), kept in the database")
    p.add_argument("--json", action="store_true", help="print the signed checkpoint, to keep elsewhere")


def _add_approval_commands(command: Callable[..., Any]) -> None:
    """approvals, approve, deny: a person's side of writes that need approval."""
    p = command("approvals", cmd_approvals, "approvals, newest first; each pending one with its request as journaled")
    p.add_argument("--state", choices=[s.value for s in ApprovalState])
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--json", action="store_true")
    for name, help in (("approve", "approve a pending request: the same request, sent again, is forwarded once"),
                       ("deny", "deny a pending request: the agent is answered 403 approval-denied with the note")):
        p = command(name, cmd_decide, help)
        p.add_argument("id")
        p.add_argument("--note", required=True, help="why; kept with the approval and shown to the agent")
        p.add_argument("--who", default="operator", help="who decides (kept with the approval)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(decision=name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ConfigError, InvalidResolutionError) as e:
        print(f"receipts: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ReceiptsError as e:
        print(f"receipts: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
