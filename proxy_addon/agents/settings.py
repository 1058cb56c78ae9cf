"""config.yaml's `agents:` section: `NAME: {token_hash: ...}`, as `receipts agents add NAME` writes it."""

from typing import Annotated

from pydantic import AfterValidator

from proxy_addon.agents.tokens import check_hash, check_name
from proxy_addon.units import StrictModel


class AgentEntry(StrictModel):
    """One agent: the salted hash of its token (agents/tokens.py), never the token."""

    token_hash: Annotated[str, AfterValidator(check_hash)]


AgentName = Annotated[str, AfterValidator(check_name)]
Agents = dict[AgentName, AgentEntry]


def check_required(require_agent: bool, agents: Agents) -> None:
    """`proxy.require_agent: true` with no agent configured would refuse every request: a mistake, said at load."""
    if require_agent and not agents:
        raise ValueError("proxy.require_agent is true, but agents: names no agent (add one: receipts agents add NAME)")
