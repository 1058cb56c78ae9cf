"""`receipts env`'s lines (agent_env.py), as data: which address an agent reaches the proxy on, and CA paths a
shell reads back whole whatever they hold. The command itself, evaluated by a real shell: test_cli.py."""

import shlex
from pathlib import Path

import pytest

from proxy_addon.agent_env import CA_CERT_NAME, CA_VARIABLES, exports


def exported(lines: list[str]) -> dict[str, str]:
    """The exports as a shell would set them (comments after a value dropped, as the shell does)."""
    got = {}
    for line in lines:
        if line.startswith("export "):
            name, _, value = shlex.split(line, comments=True)[1].partition("=")
            got[name] = value
    return got


@pytest.mark.parametrize(
    ("listen_host", "proxy"),
    [
        ("0.0.0.0", "http://127.0.0.1:8080"),  # listening everywhere: reached on loopback from this machine
        ("::", "http://127.0.0.1:8080"),
        ("", "http://127.0.0.1:8080"),
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("10.1.2.3", "http://10.1.2.3:8080"),
        ("proxy.internal", "http://proxy.internal:8080"),
        ("::1", "http://[::1]:8080"),  # an IPv6 address in a URL is bracketed
        ("fd00::7", "http://[fd00::7]:8080"),
    ],
)
def test_the_proxy_address_the_agent_is_given(listen_host, proxy):
    got = exported(exports(listen_host, 8080, Path("/conf")))
    assert got["HTTP_PROXY"] == got["HTTPS_PROXY"] == got["http_proxy"] == got["https_proxy"] == proxy


@pytest.mark.parametrize("confdir", ["/plain", "/with space", "/it's", "/$HOME/`x`", "/semi;colon"])
def test_every_ca_variable_reads_back_as_the_ca_path_whatever_the_confdir_holds(confdir):
    got = exported(exports("127.0.0.1", 9000, Path(confdir)))
    wanted = str(Path(confdir) / CA_CERT_NAME)
    assert {name: got[name] for name, _ in CA_VARIABLES} == {name: wanted for name, _ in CA_VARIABLES}
    assert set(got) == {"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", *(n for n, _ in CA_VARIABLES)}


def test_the_port_is_the_one_given():
    assert exported(exports("127.0.0.1", 18443, Path("/c")))["HTTPS_PROXY"] == "http://127.0.0.1:18443"
