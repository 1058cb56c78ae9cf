"""The audit trail and what is kept: `receipts verify`, `checkpoint` and `scrub`."""

import argparse
import dataclasses

from proxy_addon.cli.common import EXIT_FAILED, EXIT_OK, Commands, load, open_store, store_at
from proxy_addon.rules.redaction import SecretFields, SecretHeaders
from proxy_addon.store import ReceiptStore
from proxy_addon.views.terminal import print_json


def cmd_scrub(args: argparse.Namespace) -> int:
    config = load(args)
    store = open_store(args, config)

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
    return open_store(args) if args.database is None else store_at(args.database)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from proxy_addon.audit.checkpoint import load_or_create_signing_key, make_checkpoint
    from proxy_addon.rules.records import utcnow

    config = load(args)
    key_file = config.audit.signing_key_file
    key = load_or_create_signing_key(key_file)
    made = open_store(args, config).audit.add_checkpoint(
        lambda heads, previous, note: make_checkpoint(key, heads, utcnow(), previous, note)
    )
    document = {name: getattr(made, name) for name in ("id", "created_at", "root", "signed", "signature", "public_key", "note")}
    if args.json:
        print_json({**document, "receipts": len(made.heads)})
    else:
        print(f"checkpoint {made.id}: {len(made.heads)} receipts, root {made.root}, signed with {key_file}")
        print(f"an auditor checks it with: receipts verify --public-key {key_file}.pub")
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------------------------


def add_scrub(commands: Commands) -> None:
    p = commands.command("scrub", cmd_scrub, "redact secrets that earlier versions stored, with today's rules")
    p.add_argument("--dry-run", action="store_true", help="count what would change, change nothing")
    p.add_argument("--vacuum", action="store_true", help="then rewrite the database files (VACUUM), so no old byte stays on disk")
    p.add_argument("--json", action="store_true")


def add_verify(commands: Commands) -> None:
    p = commands.command("verify", cmd_verify, "check every receipt's history against its hash chain (exit 1 naming each one changed)")
    p.add_argument("--public-key", help="also check every checkpoint with this PEM public key, and what was deleted since")
    p.add_argument("--database", metavar="URL", help="the database to verify, e.g. an auditor's copy (default: the config's)")
    p.add_argument("--json", action="store_true")


def add_checkpoint(commands: Commands) -> None:
    p = commands.command("checkpoint", cmd_checkpoint, "sign every receipt's history head now (audit.signing_key_file), kept in the database")
    p.add_argument("--json", action="store_true", help="print the signed checkpoint, to keep elsewhere")


COMMANDS = {"scrub": add_scrub, "verify": add_verify, "checkpoint": add_checkpoint}
