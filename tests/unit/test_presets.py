"""Presets: every shipped preset is a valid host entry; a host's own keys win over its preset's (an operation rule
of its own replaces the preset's of the same name, and comes first); an unknown name is one line naming the key and
the known presets; `receipts rules show --preset` prints the file as shipped."""

import pytest

from proxy_addon import presets
from proxy_addon.cli import main
from proxy_addon.config import parse_config
from proxy_addon.exceptions import ConfigError


@pytest.mark.parametrize("name", presets.known_presets())
def test_every_preset_is_a_valid_host_entry_with_named_rules(name):
    policy = parse_config(f"hosts:\n  api.example.com: {{preset: {name}}}\n").policy_for("api.example.com", 443)
    names = [op.name for op in policy.operations]
    assert names and len(names) == len(set(names)) and all(n.startswith(name.split("-")[0]) for n in names)
    assert all(op.reconcile is not None or op.unreadable for op in policy.operations)  # a read rule, or why not


def test_known_presets():
    assert {"stripe", "s3", "dynamodb", "sqs", "ses", "azure-blob", "pocketbase"} <= set(presets.known_presets())


def test_a_hosts_own_keys_win():
    config = parse_config(
        "defaults: {upstream_timeout: 9s}\n"
        "hosts:\n"
        "  api.stripe.com:\n"
        "    preset: stripe\n"
        "    upstream_timeout: 5s\n"
        "    operations:\n"
        "      - {name: stripe.customers.create, method: POST, path: /v1/customers, retry_safe: false}\n"
        "      - {name: mine, method: POST, path: /v1/mine}\n"
    )
    policy = config.policy_for("api.stripe.com", 443)
    names = [op.name for op in policy.operations]
    assert names[:2] == ["stripe.customers.create", "mine"] and names.count("stripe.customers.create") == 1
    assert "stripe.products.create" in names
    mine = policy.operations[0]
    assert (mine.retry_safe, mine.reconcile) == (False, None)  # the host's rule, whole, not merged into the preset's
    assert policy.upstream_timeout == 5.0
    assert config.policy_for("api.other.com", 443).operations == ()


def test_an_unknown_preset_is_one_line_naming_the_key_and_the_known_ones():
    with pytest.raises(ConfigError) as raised:
        parse_config("hosts:\n  api.stripe.com: {preset: strpe}\n")
    message = str(raised.value)
    assert "\n" not in message and "hosts.api.stripe.com.preset: unknown preset 'strpe'" in message
    assert all(name in message for name in presets.known_presets())


def test_rules_show_prints_the_preset_as_shipped(capsys):
    assert main(["rules", "show", "--preset", "stripe"]) == 0
    out = capsys.readouterr().out
    assert out == presets.preset_text("stripe") and out.startswith("# preset: stripe")
    assert main(["rules", "show", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
