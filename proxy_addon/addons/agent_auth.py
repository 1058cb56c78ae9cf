"""AgentAuth: proxy authentication against config `agents:` (the agent's name, and its token's salted hash).

mitmproxy's ProxyAuth addon, with a Validator for the configured agents and these differences:
- No agents configured: nothing is checked and nothing changes (the addon has no validator).
- Anonymous agents are let through unless `proxy.require_agent` is true. A request that presents proxy
  credentials that are wrong (an unknown name, a wrong token, a malformed header) is refused with 407 either
  way: an agent that believes it named itself must not be journaled as anonymous without being told.
- A refusal is `407 Proxy Authentication Required` with `Proxy-Authenticate: Basic realm="receipts"` and a
  problem+json body; like mitmproxy's, set from the `http_connect` or `requestheaders` hook, so nothing is
  journaled (the journal's hooks come later and skip a flow with an answer) or forwarded.
- The token is kept nowhere: `Proxy-Authorization` is removed from every request it checks, valid or not, before
  any other addon of ours sees it (the journal, the upstream, a log), and what stays on the connection and the
  flow is the name alone (`flow.metadata["proxyauth"] = (name, "")`; mitmproxy keeps the password there).
- Always `Proxy-Authorization`, whatever the proxy's mode: in reverse mode mitmproxy's addon would take
  `Authorization`, which is the upstream's credential.
Checked once per client connection for HTTPS (the CONNECT; its tunnel's requests inherit it, as in mitmproxy's
addon), per request for plain HTTP, where each request carries the header: one SHA-256 (agents/tokens.py).

`agents:` is read when the config is (at start, or when the proxy's options change it): a connection still
open under an agent no longer configured loses that identity.
"""

from collections.abc import Mapping

from mitmproxy import http
from mitmproxy.addons.proxyauth import ProxyAuth, Validator, parse_http_basic_auth
from mitmproxy.proxy.layers import modes

from proxy_addon import metrics
from proxy_addon.addons.state import ReceiptsState
from proxy_addon.agents.identity import PROXYAUTH_KEY
from proxy_addon.agents.settings import AgentEntry
from proxy_addon.agents.tokens import NO_AGENT_HASH, token_matches
from proxy_addon.config import ReceiptsConfig
from proxy_addon.log import get_logger
from proxy_addon.request import bodylimit
from proxy_addon.rules import answers

log = get_logger("receipts.proxy")

PROXY_AUTHORIZATION = "Proxy-Authorization"
REALM = "receipts"
METADATA_KEY = "receipts"  # flow.metadata: what the addons note of a refused flow (as admission.py does)


class AgentValidator(Validator):
    """mitmproxy's Validator: the user name is a configured agent's, and the password its token."""

    def __init__(self, agents: Mapping[str, AgentEntry]):
        self.hashes = {name: entry.token_hash for name, entry in agents.items()}

    def __call__(self, username: str, password: str) -> bool:
        stored = self.hashes.get(username)
        matched = token_matches(password, stored if stored is not None else NO_AGENT_HASH)  # the same work either way
        return matched and stored is not None


class AgentAuth(ProxyAuth):
    """Addon: establishes the asking agent (agents/identity.py, `agent_of`), or answers 407."""

    validator: AgentValidator | None = None

    def __init__(self, journal: ReceiptsState):
        super().__init__()
        self.journal = journal
        self.required = False
        self._config: ReceiptsConfig | None = None

    def load(self, loader: object) -> None:
        """No option of its own: config.yaml's `agents:` and `proxy.require_agent` (mitmproxy's `proxyauth` option
        stays mitmproxy's addon's)."""

    def configure(self, updated: set[str]) -> None:
        config = self.journal.config  # set up by the Receipts addon, before this one in the chain
        if config is self._config:
            return
        self._config = config
        agents = config.agents if config is not None else {}
        self.required = config is not None and config.proxy.require_agent
        self.validator = AgentValidator(agents) if agents or self.required else None
        metrics.name_agents(agents)
        for connection, (name, _) in list(self.authenticated.items()):
            if name not in agents:
                del self.authenticated[connection]

    def socks5_auth(self, data: modes.Socks5AuthData) -> None:
        """SOCKS5 mode: as mitmproxy's, keeping the name alone."""
        if self.validator is not None and self.validator(data.username, data.password):
            data.valid = True
            self.authenticated[data.client_conn] = (data.username, "")

    def requestheaders(self, f: http.HTTPFlow) -> None:
        if self.validator is None or f.response or f.error:
            return
        super().requestheaders(f)  # the tunnel's agent, or this request's own credentials

    def authenticate_http(self, f: http.HTTPFlow) -> bool:
        """Whether the request named a configured agent (then `flow.metadata["proxyauth"]` is its name). False
        without credentials: anonymous if that is allowed, else 407; and 407 for wrong ones."""
        presented = f.request.headers.get(PROXY_AUTHORIZATION)
        if presented is None and not self.required:
            return False
        f.request.headers.pop(PROXY_AUTHORIZATION, None)
        name = self._agent(presented)
        if name is not None:
            f.metadata[PROXYAUTH_KEY] = (name, "")
            return True
        reason = "agent_unknown" if presented is not None else "agent_required"
        log.info("request_refused", reason=reason, method=f.request.method, host=f.request.pretty_host)
        f.request.stream = False  # mitmproxy refuses an answer set on a request it streams
        f.response = _auth_required(f, presented is not None)
        f.metadata[METADATA_KEY] = {"refused": reason}
        if f.request.method != "CONNECT":
            bodylimit.bound(f, 0)  # whatever body follows is drained, not kept
        return False

    def _agent(self, presented: str | None) -> str | None:
        if presented is None or self.validator is None:
            return None
        try:
            _, username, token = parse_http_basic_auth(presented)
        except ValueError:
            return None
        return username if self.validator(username, token) else None


def _auth_required(f: http.HTTPFlow, presented: bool) -> http.Response:
    said = "The proxy credentials name no configured agent, or the token is wrong" if presented else (
        "This proxy requires each agent to name itself (proxy.require_agent)"
    )
    problem = answers.problem(
        407,
        "agent-required",
        "Proxy authentication required",
        f"{said}. Use a proxy URL with the agent's name and token: http://NAME:TOKEN@host:port "
        "(`receipts agents add NAME` makes one). Nothing was journaled or forwarded.",
    ).with_headers({"Proxy-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'})
    return http.Response.make(problem.status, problem.body, list(problem.headers))
