"""The receipts command on a real database: JSON shapes of the contract, exit codes, one-line errors."""

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from support.store import intent, recorded, walk

from proxy_addon.cli import main
from proxy_addon.db import make_engine
from proxy_addon.records import utcnow
from proxy_addon.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts


@pytest.fixture
def cli(migrated_url, tmp_path, monkeypatch, capsys):
    """Runs `receipts ...` in-process against the migrated database; returns (exit code, stdout, stderr)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"secret_file: {tmp_path / 'secret'}\n")
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", migrated_url)

    def run(*args: str) -> tuple[int, str, str]:
        code = main([*args, "--config", str(config)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def cli_store(migrated_url):
    engine = make_engine(migrated_url)
    yield ReceiptStore(engine)
    engine.dispose()


def test_ls_show_json_shapes(cli, cli_store):
    done = recorded(cli_store, intent())
    walk(cli_store, done.operation_id, State.SUCCEEDED, status_code=201)
    unknown = recorded(cli_store, intent())
    walk(cli_store, unknown.operation_id, State.OUTCOME_UNKNOWN)

    code, out, _ = cli("ls", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["operation_id"] for r in rows] == [unknown.operation_id, done.operation_id]  # newest first
    assert {"operation_id", "state", "intent_fingerprint", "authentication_recorded", "created_at"} <= set(rows[0])

    code, out, _ = cli("ls", "--state", "outcome_unknown", "--json")
    assert [r["operation_id"] for r in json.loads(out)] == [unknown.operation_id]

    code, out, _ = cli("show", unknown.operation_id, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["state"] == "outcome_unknown"
    assert [(t["from_state"], t["to_state"]) for t in shown["transitions"]] == [
        (None, "planned"),
        ("planned", "submitted"),
        ("submitted", "outcome_unknown"),
    ]
    assert all({"recorded_at", "detail"} <= set(t) for t in shown["transitions"])


def test_ls_older_than_finds_old_unknowns(cli, cli_store):
    old = recorded(cli_store, intent())
    walk(cli_store, old.operation_id, State.OUTCOME_UNKNOWN)
    fresh = recorded(cli_store, intent())
    walk(cli_store, fresh.operation_id, State.OUTCOME_UNKNOWN)
    with cli_store.engine.begin() as conn:
        conn.execute(
            update(receipts)
            .where(receipts.c.operation_id == old.operation_id)
            .values(created_at=utcnow() - timedelta(minutes=30))
        )
    code, out, _ = cli("ls", "--state", "outcome_unknown", "--older-than", "10m", "--json")
    assert code == 0 and [r["operation_id"] for r in json.loads(out)] == [old.operation_id]


def test_ls_state_unknown_lists_every_unknown_state(cli, cli_store):
    ids = {}
    for target in (State.OUTCOME_UNKNOWN, State.MANUAL_REVIEW, State.SUCCEEDED):
        ids[target] = recorded(cli_store, intent()).operation_id
        walk(cli_store, ids[target], target)
    code, out, _ = cli("ls", "--state", "unknown", "--json")
    assert code == 0 and {r["operation_id"] for r in json.loads(out)} == {ids[State.OUTCOME_UNKNOWN], ids[State.MANUAL_REVIEW]}
    code, out, _ = cli("ls", "--state", "open", "--json")
    assert {r["state"] for r in json.loads(out)} == {"outcome_unknown", "manual_review"}
    with pytest.raises(SystemExit) as e:
        cli("ls", "--state", "unknowns")
    assert e.value.code == 2


def test_resolve_needs_a_note(cli, cli_store):
    r = recorded(cli_store, intent())
    walk(cli_store, r.operation_id, State.MANUAL_REVIEW)
    code, _, err = cli("resolve", r.operation_id, "--state", "succeeded", "--note", " ")
    assert code == 2 and "note" in err and err.count("\n") == 1
    assert cli_store.receipts.get(r.operation_id).state == "manual_review"


def test_resolve_keeps_the_note_in_history(cli, cli_store):
    r = recorded(cli_store, intent())
    walk(cli_store, r.operation_id, State.MANUAL_REVIEW)
    code, out, err = cli("resolve", r.operation_id, "--state", "succeeded", "--note", "seen in dashboard", "--external-id", "A-7")
    assert code == 0, err
    after = cli_store.receipts.get(r.operation_id)
    assert after.state == "succeeded" and after.external_id == "A-7"
    last = cli_store.receipts.history(r.operation_id)[-1]
    assert last.from_state == "manual_review" and last.detail["note"] == "seen in dashboard"


def test_resolve_refuses_a_terminal_receipt(cli, cli_store):
    r = recorded(cli_store, intent())
    walk(cli_store, r.operation_id, State.REJECTED)
    code, _, err = cli("resolve", r.operation_id, "--state", "safe_to_retry", "--note", "x")
    assert code == 1 and "rejected" in err and err.count("\n") == 1
    assert cli_store.receipts.get(r.operation_id).state == "rejected"


def test_unknown_id_fails_with_one_line(cli):
    code, _, err = cli("show", "op_nope")
    assert code == 1 and "op_nope" in err and err.count("\n") == 1


def test_stats_json(cli, cli_store):
    for target in (State.SUCCEEDED, State.OUTCOME_UNKNOWN, State.OUTCOME_UNKNOWN):
        r = recorded(cli_store, intent())
        walk(cli_store, r.operation_id, target)
    code, out, _ = cli("stats", "--json")
    stats = json.loads(out)
    assert code == 0
    assert stats["by_state"]["outcome_unknown"] == 2 and stats["by_state"]["succeeded"] == 1
    assert stats["by_host"]["api.example.com"]["outcome_unknown"] == 2
    assert stats["oldest_open_age_seconds"] is not None and stats["oldest_open_age_seconds"] >= 0


def test_prune_never_deletes_open_receipts(cli, cli_store):
    done = recorded(cli_store, intent())
    walk(cli_store, done.operation_id, State.SUCCEEDED)
    still_open = recorded(cli_store, intent())
    walk(cli_store, still_open.operation_id, State.OUTCOME_UNKNOWN)
    with cli_store.engine.begin() as conn:
        old = utcnow() - timedelta(days=40)
        conn.execute(update(receipts).values(created_at=old, completed_at=old))
    code, out, _ = cli("prune", "--older-than", "30d", "--json")
    assert code == 0 and json.loads(out) == {"deleted": 1}
    assert [r.operation_id for r in cli_store.receipts.list()] == [still_open.operation_id]
    assert cli_store.receipts.history(done.operation_id) == []


@pytest.mark.parametrize(
    "args",
    [
        ("ls", "--state", "bogus"),
        ("prune", "--older-than", "ten minutes"),
        ("resolve", "op_x", "--state", "rejected", "--note", "n"),
        ("reconcile",),
    ],
)
def test_bad_usage_exits_2(cli, args):
    with pytest.raises(SystemExit) as e:
        cli(*args)
    assert e.value.code == 2


def test_bad_config_is_one_line_naming_the_key(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("defaults:\n  upstream_timeout: 10x\n")
    code = main(["ls", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "defaults.upstream_timeout" in err and err.count("\n") == 1


def test_bad_database_url_is_one_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", "mysql://root@localhost/x")
    code = main(["ls", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "mysql" in err and err.count("\n") == 1


def test_unmigrated_database_is_refused(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    monkeypatch.setenv("RECEIPTS_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    code = main(["ls", "--config", str(config)])
    assert code == 1 and "receipts db upgrade" in capsys.readouterr().err


def test_db_upgrade_command_in_a_fresh_directory(tmp_path):
    """The console script as a newcomer runs it: relative SQLite path, config in the working directory."""
    (tmp_path / "config.yaml").write_text("database:\n  url: sqlite:///receipts.db\n")
    env_python = Path(sys.executable)
    done = subprocess.run(
        [str(env_python), "-m", "proxy_addon.cli", "db", "upgrade"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": str(env_python.parent), "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "receipts.db").exists()
    again = subprocess.run(
        [str(env_python), "-m", "proxy_addon.cli", "ls", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PATH": str(env_python.parent), "HOME": str(tmp_path)},
    )
    assert again.returncode == 0 and json.loads(again.stdout) == []


def test_tables_keep_each_operation_id_whole_on_one_line(cli, cli_store):
    """An operator copies or greps ids out of `ls` and `show`, piped or not: never folded across lines."""
    ops = []
    for target in (State.MANUAL_REVIEW, State.SUCCEEDED):
        ops.append(recorded(cli_store, intent(query="q=" + "long-value-" * 12)).operation_id)
        walk(cli_store, ops[-1], target)
    code, out, _ = cli("ls")
    assert code == 0
    for op in ops:
        assert len([line for line in out.splitlines() if op in line]) == 1, out
    code, out, _ = cli("show", ops[0])
    assert code == 0 and ops[0] in out and "manual_review" in out
