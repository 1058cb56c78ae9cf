"""Hosts (rules/hosts.py): the model APIs that pass through by default, the host keys config.yaml may write,
and which entry a request's host and port find. The same through a whole config: test_protocols.py."""

import pytest

from proxy_addon.rules.hosts import MODEL_APIS, check_host_key, find_host_entry, is_model_api


@pytest.mark.parametrize(
    ("host", "model"),
    [
        ("api.openai.com", True),
        ("API.OpenAI.com.", True),  # any case, a trailing dot
        ("bedrock-runtime.us-east-1.amazonaws.com", True),
        ("bedrock-runtime.amazonaws.com", False),  # the pattern's region is not optional
        ("bedrock.us-east-1.amazonaws.com", False),  # the control plane is not a model API
        ("us-central1-aiplatform.googleapis.com", True),
        ("aiplatform.googleapis.com", True),
        ("my-resource.openai.azure.com", True),
        ("openai.azure.com", False),  # *.suffix needs a label before it
        ("openai.com", False),
        ("api.openai.com.evil.test", False),
        ("evil-api.openai.com", False),
    ],
)
def test_which_hosts_are_model_apis(host, model):
    assert is_model_api(host) is model


def test_every_model_api_listed_is_recognised():
    for _, hosts in MODEL_APIS:
        for host in hosts:
            assert is_model_api(host.replace("*", "x")), host


@pytest.mark.parametrize("key", ["api.example.com", "API.Example.com", "api.example.com:8443", "*.example.com", "*.com"])
def test_host_keys_config_may_write_lower_cased(key):
    assert check_host_key(key) == key.lower()


@pytest.mark.parametrize("key", ["*", "*.", "*.example.com:443", "a.*.com", "**.example.com", "*example.com", "*.a/b"])
def test_a_wildcard_is_written_star_dot_suffix_and_nothing_else(key):
    with pytest.raises(ValueError, match=r"a wildcard is written \*\.suffix"):
        check_host_key(key)


HOSTS = {"pay.example.com:8443": "host:port", "pay.example.com": "host", "*.example.com": "*.example.com",
         "*.eu.example.com": "*.eu.example.com", "*.com": "*.com"}


@pytest.mark.parametrize(
    ("host", "port", "entry"),
    [
        ("pay.example.com", 8443, "host:port"),
        ("PAY.example.com", 8443, "host:port"),  # a request's host in any case
        ("pay.example.com", 443, "host"),
        ("a.example.com", 443, "*.example.com"),
        ("a.b.example.com", 443, "*.example.com"),  # any depth
        ("a.eu.example.com", 443, "*.eu.example.com"),  # the longest suffix
        ("eu.example.com", 443, "*.example.com"),  # *.eu.example.com does not match eu.example.com itself
        ("example.com", 443, "*.com"),
        ("com", 443, None),
        ("example.org", 443, None),
    ],
)
def test_host_port_beats_host_beats_the_longest_suffix(host, port, entry):
    assert find_host_entry(HOSTS, host, port) == entry
