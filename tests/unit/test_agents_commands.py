"""`receipts agents add | ls | rm`: config.yaml's `agents:` edited in place, every other byte kept (config/agents_file.py,
cli/agents.py); the token printed once and kept nowhere; a bad name or an edit that would break the config refused
in one line, the file untouched."""

import difflib
import json
import re
import stat
from pathlib import Path

import pytest

from proxy_addon.agents.tokens import token_matches
from proxy_addon.cli import main
from proxy_addon.config import agents_file as config_file
from proxy_addon.config import load_config, parse_config
from proxy_addon.exceptions import ConfigError

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"
HASH = "sha256$" + "0" * 32 + "$" + "1" * 64
LAYOUTS = {
    "the example config": REPO_CONFIG.read_text(),
    "empty": "",
    "no final newline": "proxy:\n  methods: [POST]",
    "comments after an empty last key": "proxy:\n  methods: [POST]   # the methods\n\nhosts:\n  # \"api.example.com\": {}\n",
    "four spaces, flush sequences": "hosts:\n    api.example.com:\n        operations:\n        - name: a\n          method: POST\n          path: /a\n",
    "agents alone": "agents:   # who is who\n",
    "agents null": "agents: null   # none yet\nproxy: {}\n",
    "agents empty flow": "agents: {}\n",
    "agents listed, a section after": f"agents:\n  support: {{token_hash: '{HASH}'}}   # the support bot\n\n# the proxy\nproxy:\n  methods: [POST]\n",
    "agents in block style": f"agents:\n    support:\n        token_hash: {HASH}\n    # more to come\nlogging: {{level: info}}\n",
}


def changed_lines(before: str, after: str) -> list[str]:
    """The lines removed (-) and added (+), less the value an empty `agents:` had (`null`, `{}`), which goes."""
    changed = [d for d in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if not d.startswith(("---", "+++", "@@"))]
    emptied = {d[1:].replace("null", "").replace("{}", "").rstrip() for d in changed if d.startswith("-agents:")}
    return [d for d in changed if not (d[1:].rstrip() in emptied or d.startswith("-agents:"))]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_add_then_rm_changes_only_the_agents_lines(layout):
    before = LAYOUTS[layout]
    after = config_file.added(before, "billing", HASH)
    assert parse_config(after).agents["billing"].token_hash == HASH
    assert all(line.startswith("+") for line in changed_lines(before, after)), changed_lines(before, after)
    kept = parse_config(after).model_dump(exclude={"agents"}) == parse_config(before).model_dump(exclude={"agents"})
    assert kept and set(parse_config(after).agents) == set(parse_config(before).agents) | {"billing"}
    again = config_file.removed(after, "billing")
    assert "billing" not in parse_config(again).agents
    assert all(line.startswith("-") for line in changed_lines(after, again))
    assert set(parse_config(again).agents) == set(parse_config(before).agents)


def test_an_existing_or_missing_agent_and_a_flow_mapping_are_refused():
    text = config_file.added("", "billing", HASH)
    with pytest.raises(ConfigError, match="agent billing exists"):
        config_file.added(text, "billing", HASH)
    with pytest.raises(ConfigError, match="no agent nobody"):
        config_file.removed(text, "nobody")
    with pytest.raises(ConfigError, match="one agent per line"):
        config_file.added(f"agents: {{support: {{token_hash: '{HASH}'}}}}\n", "billing", HASH)


@pytest.fixture
def cli(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(REPO_CONFIG.read_text())
    config.chmod(0o640)

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main([*argv, "--config", str(config)])
        except SystemExit as e:  # argparse's own usage errors
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run, config


def test_add_prints_the_token_once_and_the_config_keeps_only_its_hash(cli):
    run, config = cli
    code, out, _ = run("agents", "add", "billing-agent", "--listen-port", "18080")
    assert code == 0
    token = re.search(r"shown this once: (\S+)", out).group(1)
    assert f"HTTPS_PROXY=http://billing-agent:{token}@127.0.0.1:18080" in out
    assert token not in config.read_text()
    assert token_matches(token, load_config(config).agents["billing-agent"].token_hash)
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    code, out, _ = run("agents", "ls", "--json")
    assert (code, json.loads(out)) == (0, ["billing-agent"])
    code, out, _ = run("agents", "ls")
    assert out.split() == ["billing-agent"] and "sha256" not in out


@pytest.mark.parametrize("name", ["bad name", "a:b", "anonymous", ""])
def test_a_bad_name_is_one_line_and_nothing_is_written(cli, name):
    run, config = cli
    before = config.read_text()
    code, out, err = run("agents", "add", name)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "agent name" in err
    assert config.read_text() == before


def test_an_edit_that_would_break_the_config_is_refused_and_the_file_kept(cli):
    """The last agent of a config that requires one: removing it would leave a config the proxy refuses."""
    run, config = cli
    assert run("agents", "add", "billing")[0] == 0
    config.write_text(config.read_text().replace("require_agent: false", "require_agent: true"))
    before = config.read_text()
    code, _, err = run("agents", "rm", "billing")
    assert code == 2 and "proxy.require_agent is true, but agents: names no agent" in err
    assert config.read_text() == before
    code, _, err = run("agents", "rm", "nobody")
    assert code == 2 and "no agent nobody" in err
