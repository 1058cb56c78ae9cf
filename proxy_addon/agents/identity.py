"""Who is asking: the agent a request came from, as proxy authentication established it (addons/agent_auth.py).

An agent names itself the standard way, in its proxy URL (`HTTPS_PROXY=http://billing-agent:TOKEN@host:8080`),
which every HTTP client and SDK turns into `Proxy-Authorization: Basic ...` (on the CONNECT of an HTTPS
request, on each plain HTTP one). The name it established is where mitmproxy's own `proxyauth` addon keeps
it, `flow.metadata["proxyauth"]` (user, password): AgentAuth writes the name there with an empty password, so
that the token is kept nowhere; mitmproxy's `proxyauth` option (htpasswd, LDAP) fills it the same way, and its
user names are then the agents' names.

Why an agent's identity is not part of an intent's identity (account + fingerprint): the duplicate a proxy
must refuse is the second *effect* on the upstream, and the upstream acts for the credentials it was given
(the account), whoever holds them. Two agents sharing an API key act as one account there: when the billing
agent's charge timed out and a second worker (or the same agent, restarted under another name) sends it again,
that is the very retry that would charge twice. Counting the agent would also let renaming an agent, or
rotating its token, reopen the door to a duplicate. So the agent is recorded on the receipt, to answer "who
did it", and decides nothing about what is forwarded.
"""

from mitmproxy import http

from proxy_addon.agents.tokens import AGENT_NAME_MAX

PROXYAUTH_KEY = "proxyauth"  # flow.metadata: (user name, password), as mitmproxy's proxyauth addon sets it


def agent_of(flow: http.HTTPFlow) -> str | None:
    """The agent this request came from (a name), or None for an anonymous one (no proxy authentication)."""
    established = flow.metadata.get(PROXYAUTH_KEY)
    if not established or not established[0]:
        return None
    return str(established[0])[:AGENT_NAME_MAX]  # a name from mitmproxy's own proxyauth may be longer
