"""The receipts command on a real database: JSON shapes of the contract, exit codes, one-line errors."""

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from support.proxy import REPO
from support.store import intent, recorded, walk

from proxy_addon import __version__, resources
from proxy_addon.cli import main
from proxy_addon.config import load_config
from proxy_addon.db import make_engine
from proxy_addon.rules.records import utcnow
from proxy_addon.rules.states import State
from proxy_addon.store import ReceiptStore
from proxy_addon.store.receipts import receipts, transitions


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
    document = json.loads(out)
    assert code == 0 and document == {"deleted": 1, "receipts": 1, "duplicate_refusals": 0, "approvals": 0,
                                      "verifier_controls": 0, "batches": 1}
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


def test_init_writes_the_default_config_and_never_over_a_file(tmp_path, capsys):
    """`receipts init`: how an install, with no repository beside it, gets the repository's config.yaml."""
    target = tmp_path / "etc" / "receipts" / "config.yaml"
    assert main(["init", "--config", str(target)]) == 0
    out = capsys.readouterr().out
    assert target.read_text() == (REPO / "config.yaml").read_text()
    assert f"receipts db upgrade --config {target}" in out and f"mitmdump -s {resources.ADDON_SCRIPT}" in out
    assert load_config(target).database.url == f"sqlite:///{target.parent / 'receipts.db'}"
    target.write_text("database: {url: 'sqlite:///mine.db'}\n")
    assert main(["init", "--config", str(target)]) == 1
    assert "--force" in capsys.readouterr().err and "mine.db" in target.read_text()
    assert main(["init", "--config", str(target), "--force"]) == 0
    assert target.read_text() == (REPO / "config.yaml").read_text()


def test_a_checkout_reads_its_migrations_and_default_config_from_the_repository():
    """An install has them inside the package (tests/e2e/test_wheel_install.py); a checkout, at its top."""
    assert (resources.MIGRATIONS_DIR, resources.EXAMPLE_CONFIG) == (REPO / "migrations", REPO / "config.yaml")
    assert resources.ADDON_SCRIPT.is_file()


def test_version_is_the_package_s(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"receipts {__version__}\n"


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


# -- `--host host:port`, `show` with the request as journaled, `env`, paths relative to the config -------------


def test_ls_host_takes_host_and_port_and_shows_the_port(cli, cli_store):
    ids = {}
    for port in (18112, 18113):
        ids[port] = recorded(cli_store, intent(scheme="http", host="127.0.0.1", port=port)).operation_id
    default = recorded(cli_store, intent()).operation_id  # https on 443: shown without its port

    code, out, _ = cli("ls", "--host", "127.0.0.1:18112", "--json")
    assert code == 0 and [r["operation_id"] for r in json.loads(out)] == [ids[18112]]
    code, out, _ = cli("ls", "--host", "127.0.0.1", "--json")
    assert {r["operation_id"] for r in json.loads(out)} == set(ids.values())
    code, out, _ = cli("ls", "--host", "API.example.com:443", "--json")
    assert [r["operation_id"] for r in json.loads(out)] == [default]

    code, out, _ = cli("ls")
    assert code == 0 and "127.0.0.1:18112" in out and "127.0.0.1:18113" in out
    assert "api.example.com " in out and "api.example.com:443" not in out

    code, out, _ = cli("ls", "--host", "127.0.0.1:18119", "--state", "planned")  # a typo in the port
    assert code == 0 and out.strip() == "0 receipts matching --state planned --host 127.0.0.1:18119"
    code, out, _ = cli("ls", "--host", "127.0.0.1:18119", "--json")
    assert code == 0 and json.loads(out) == []  # --json stays one JSON document

    for bad in ("127.0.0.1:port", "127.0.0.1:", "127.0.0.1:70000", "[::1"):
        with pytest.raises(SystemExit) as e:
            cli("ls", "--host", bad)
        assert e.value.code == 2, bad


def _journaled(store, target: State, **fields) -> str:
    op = recorded(store, intent(**fields)).operation_id
    walk(store, op, target)
    return op


def test_show_prints_the_request_as_journaled(cli, cli_store):
    body = {"title": "Hello", "password": "[REDACTED]", "tags": ["a", "b"]}
    op = _journaled(
        cli_store, State.MANUAL_REVIEW, scheme="http", host="127.0.0.1", port=18112, query="draft=1&token=%5BREDACTED%5D",
        request_headers={"content-type": "application/json", "authorization": "[REDACTED]"},
        request_body=json.dumps(body, separators=(",", ":")).encode(), request_body_size=61,
    )
    code, out, _ = cli("show", op)
    assert code == 0
    assert "POST http://127.0.0.1:18112/api/articles?draft=1&token=%5BREDACTED%5D" in out
    assert "authorization: [REDACTED]" in out and "content-type: application/json" in out
    assert "JSON, 61 bytes" in out
    assert '"title": "Hello",' in out and '  "tags": [' in out  # pretty-printed, one field a line

    code, out, _ = cli("show", op, "--json")
    shown = json.loads(out)
    request = shown["request"]
    assert (request["method"], request["url"]) == ("POST", "http://127.0.0.1:18112/api/articles?draft=1&token=%5BREDACTED%5D")
    assert request["headers"] == {"content-type": "application/json", "authorization": "[REDACTED]"}
    assert request["body"]["kind"] == "json" and request["body"]["document"] == body
    assert (request["body"]["size"], request["body"]["truncated"]) == (61, False)
    assert shown["response"] is None


def test_show_formats_forms_binary_and_folds_long_bodies(cli, cli_store):
    form = _journaled(cli_store, State.OUTCOME_UNKNOWN, request_headers={"content-type": "application/x-www-form-urlencoded"},
                      request_body=b"name=Ana+Lima&password=%5BREDACTED%5D&empty=", request_body_size=40)
    code, out, _ = cli("show", form)
    assert "form, 40 bytes, 3 fields" in out and "name = Ana Lima" in out and "password = [REDACTED]" in out
    assert json.loads(cli("show", form, "--json")[1])["request"]["body"]["form"] == [
        ["name", "Ana Lima"], ["password", "[REDACTED]"], ["empty", ""]]

    png = _journaled(cli_store, State.SUCCEEDED, request_headers={"content-type": "image/png"},
                     request_body=b"\x89PNG\r\n\x1a\n" + bytes(range(256)), request_body_size=264)
    code, out, _ = cli("show", png)
    assert "264 bytes of binary" in out and "PNG" not in out
    assert json.loads(cli("show", png, "--json")[1])["request"]["body"]["text"] is None

    lines = {f"field_{i:03}": "x" * 20 for i in range(200)}
    long = _journaled(cli_store, State.MANUAL_REVIEW, request_headers={"content-type": "application/json"},
                      request_body=json.dumps(lines).encode()[:4096], request_body_size=6000, request_body_truncated=True)
    code, out, _ = cli("show", long)
    assert "only its first 4096 bytes were stored" in out
    # cut at 4096 bytes it is not JSON any more: shown as the text it is, its first 2000 characters
    assert '"field_000": "xxxxxxxxxxxxxxxxxxxx"' in out and '"field_099"' not in out
    assert f"2096 more characters folded: `receipts show {long} --json` has it all" in out
    assert json.loads(cli("show", long, "--json")[1])["request"]["body"]["kind"] == "text"


def test_show_folds_a_long_json_body(cli, cli_store):
    document = {f"field_{i:03}": i for i in range(100)}
    op = _journaled(cli_store, State.MANUAL_REVIEW, request_headers={"content-type": "application/json"},
                    request_body=json.dumps(document).encode(), request_body_size=1900)
    code, out, _ = cli("show", op)
    assert '"field_000": 0' in out and '"field_027": 27' in out and '"field_099"' not in out
    assert f"72 more lines folded: `receipts show {op} --json` has it all" in out
    assert json.loads(cli("show", op, "--json")[1])["request"]["body"]["document"] == document


def test_show_escapes_what_it_prints(cli, cli_store):
    """A body is the agent's (or an attacker's) text: no terminal escape sequence and no rich markup gets through."""
    op = _journaled(cli_store, State.MANUAL_REVIEW, path="/x/[bold]p[/bold]", operation="POST api.example.com /x/[bold]p[/bold]",
                    request_headers={"content-type": "text/plain", "x-note": "[/oops]"},
                    request_body=b"clear \x1b[2J screen [red]red[/red]", request_body_size=31)
    code, out, err = cli("show", op)
    assert code == 0, err
    assert "\x1b" not in out and "[red]red[/red]" not in out  # text with a control character is shown as binary
    assert "31 bytes of binary" in out and "/x/[bold]p[/bold]" in out and "x-note: [/oops]" in out
    text = _journaled(cli_store, State.MANUAL_REVIEW, request_headers={"content-type": "text/plain"},
                      request_body=b"[red]not markup[/red] <b>", request_body_size=25)
    code, out, _ = cli("show", text)
    assert "[red]not markup[/red] <b>" in out
    code, out, _ = cli("ls")
    assert "[bold]p[/bold]" in out


def test_show_prints_the_stored_answer_and_the_reconcilers_reads(cli, cli_store):
    op = recorded(cli_store, intent(request_headers={"content-type": "application/json"}, request_body=b'{"amount":5}',
                                    request_body_size=12)).operation_id
    walk(cli_store, op, State.OUTCOME_UNKNOWN)
    cli_store.receipts.transition(op, State.OUTCOME_UNKNOWN, State.RECONCILING, {"who": "worker-1"})
    read = {"method": "GET", "url": "https://api.example.com/charges?limit=30", "status": 200, "elapsed_ms": 12.5}
    cli_store.receipts.transition(
        op, State.RECONCILING, State.SUCCEEDED,
        {"who": "worker-1", "strategy": "search", "result": "present", "reads": [read], "matched_id": "ch_1"},
        status_code=201, external_id="ch_1", response_headers={"content-type": "application/json", "set-cookie": "[REDACTED]"},
        response_body=b'{"id":"ch_1","token":"[REDACTED]"}',
    )
    code, out, _ = cli("show", op)
    assert "status 201" in out and "set-cookie: [REDACTED]" in out and '"id": "ch_1"' in out
    assert "reconciler's reads" in out and "GET https://api.example.com/charges?limit=30" in out and "present" in out
    shown = json.loads(cli("show", op, "--json")[1])
    assert shown["response"]["status_code"] == 201
    assert shown["response"]["body"]["document"] == {"id": "ch_1", "token": "[REDACTED]"}
    assert shown["transitions"][-1]["detail"]["reads"] == [read]


def test_env_prints_exports_a_shell_can_eval(tmp_path):
    confdir = tmp_path / "conf dir"  # a space: the values are quoted for the shell
    confdir.mkdir()
    (confdir / "mitmproxy-ca-cert.pem").write_text("not really a CA\n")
    script = (
        f'eval "$({sys.executable} -m proxy_addon.cli env --listen-port 18080 --confdir \'{confdir}\')" && '
        'printf "%s\\n" "$HTTP_PROXY" "$HTTPS_PROXY" "$http_proxy" "$https_proxy" '
        '"$SSL_CERT_FILE" "$REQUESTS_CA_BUNDLE" "$CURL_CA_BUNDLE" "$NODE_EXTRA_CA_CERTS"'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    ca = str(confdir / "mitmproxy-ca-cert.pem")
    assert done.stdout.splitlines() == ["http://127.0.0.1:18080"] * 4 + [ca] * 4


def test_env_notes_node_the_check_and_a_missing_ca(cli, tmp_path):
    code, out, err = cli("env", "--confdir", str(tmp_path / "none"), "--listen-host", "0.0.0.0")
    assert code == 0
    exports = [line for line in out.splitlines() if not line.startswith("#")]
    assert exports[0] == "export HTTP_PROXY=http://127.0.0.1:8080"  # listening everywhere: reached on loopback
    assert len(exports) == 8 and all(line.startswith("export ") for line in exports)
    comments = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    assert "NODE_USE_ENV_PROXY=1" in comments and "EnvHttpProxyAgent" in comments and "undici@7" in comments
    assert "curl -sS -o /dev/null -D - -X POST https://receipts-check.invalid/ | grep -i '^x-receipt-id'" in comments
    assert "does not exist yet" in err and str(tmp_path / "none") in err
    code, out, _ = cli("env", "--listen-host", "::1", "--listen-port", "9000", "--confdir", str(tmp_path))
    assert "export HTTPS_PROXY=http://[::1]:9000" in out


def test_paths_in_a_config_are_relative_to_it_from_another_directory(tmp_path):
    """`receipts ... --config /abs/config.yaml` run from elsewhere finds the database next to the config; the
    environment's URL is taken as given (relative to the working directory)."""
    confdir, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    confdir.mkdir(), elsewhere.mkdir()
    config = confdir / "config.yaml"
    config.write_text("database:\n  url: sqlite:///relative.db\nsecret_file: keys/.secret\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(tmp_path)}

    def receipts(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy_addon.cli", *args], cwd=elsewhere, capture_output=True,
                              text=True, timeout=60, env={**env, **extra})

    done = receipts("db", "upgrade", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert (confdir / "relative.db").exists() and not (elsewhere / "relative.db").exists()
    listed = receipts("ls", "--json", "--config", str(config))
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    relative = receipts("ls", "--json", "--config", "../conf/config.yaml")
    assert relative.returncode == 0 and json.loads(relative.stdout) == [], relative.stderr

    done = receipts("db", "upgrade", "--config", str(config), RECEIPTS_DATABASE_URL="sqlite:///from-env.db")
    assert done.returncode == 0 and (elsewhere / "from-env.db").exists() and not (confdir / "from-env.db").exists()


def test_the_secret_file_and_the_default_database_sit_beside_the_config(tmp_path, monkeypatch):
    from proxy_addon.config import load_config
    from proxy_addon.keyfiles import load_or_create_key

    confdir = tmp_path / "conf"
    confdir.mkdir()
    (confdir / "config.yaml").write_text("secret_file: .receipts-secret\n")
    (confdir / "empty.yaml").write_text("{}\n")
    (confdir / "absolute.yaml").write_text(f"database: {{url: 'sqlite:///{tmp_path}/abs.db'}}\nsecret_file: {tmp_path}/k\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECEIPTS_SECRET", raising=False)
    config = load_config("conf/config.yaml")
    assert config.secret_file == str(confdir / ".receipts-secret")
    load_or_create_key(config.secret_file)
    assert (confdir / ".receipts-secret").exists() and not (tmp_path / ".receipts-secret").exists()
    empty = load_config(confdir / "empty.yaml")
    assert (empty.database.url, empty.secret_file) == (f"sqlite:///{confdir}/receipts.db", str(confdir / ".receipts-secret"))
    absolute = load_config(confdir / "absolute.yaml")
    assert (absolute.database.url, absolute.secret_file) == (f"sqlite:///{tmp_path}/abs.db", f"{tmp_path}/k")
    assert empty.audit.signing_key_file == str(confdir / ".receipts-audit-key")  # beside the config, like secret_file
    pg = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    (confdir / "pg.yaml").write_text(f"database: {{url: '{pg}'}}\n")
    assert load_config(confdir / "pg.yaml").database.url == pg


def test_checkpoint_then_verify_with_the_public_key_alone(cli, cli_store, tmp_path, migrated_url, monkeypatch):
    """`checkpoint` makes the key beside the config on first use (0600, its public key as .pub in PEM) and
    signs; `verify --public-key` holds, then names a receipt whose history was changed, and exits 1."""
    done = recorded(cli_store, intent())
    walk(cli_store, done.operation_id, State.SUCCEEDED)
    code, out, _ = cli("checkpoint", "--json")
    assert code == 0
    made = json.loads(out)
    key, public = tmp_path / ".receipts-audit-key", tmp_path / ".receipts-audit-key.pub"
    assert key.stat().st_mode & 0o777 == 0o600 and public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert made["receipts"] == 1 and made["public_key"] == public.read_text() and made["root"].startswith("sha256:")

    code, out, _ = cli("verify", "--public-key", str(public), "--json")
    assert code == 0 and json.loads(out)["ok"] is True and json.loads(out)["checkpoints"] == 1
    auditor = main(["verify", "--database", migrated_url, "--public-key", str(public), "--config", str(tmp_path / "none.yaml")])
    assert auditor == 0  # a copy of the database and the public key: no config
    with cli_store.engine.begin() as conn:
        conn.execute(update(transitions).where(transitions.c.operation_id == done.operation_id).values(detail={"who": "mallory"}))
    monkeypatch.delenv("RECEIPTS_DATABASE_URL")
    code, out, _ = cli("verify", "--public-key", str(public), "--database", migrated_url)
    assert code == 1
    assert f"{done.operation_id}: changed: row " in out and out.splitlines()[-1].endswith("problems")


def test_verify_with_a_bad_public_key_is_one_line(cli, tmp_path):
    (tmp_path / "not-a-key.pem").write_text("hello\n")
    code, out, err = cli("verify", "--public-key", str(tmp_path / "not-a-key.pem"))
    assert code == 2 and out == "" and err == f"receipts: --public-key {tmp_path / 'not-a-key.pem'}: not a PEM public key\n"
