"""Whose receipts an agent sees: its own. A configured agent (proxy authentication, `agents:` in the config:
identity.py, `agent_of`) sees the receipts journaled with its name; every anonymous agent shares one scope, the
receipts journaled with none. Another agent's receipt is answered as if it did not exist (404), so that its
existence does not leak; a list reads the asker's receipts only (the store's agent filter, on its index)."""

from dataclasses import dataclass

from proxy_addon.rules.records import ReceiptRecord


@dataclass(frozen=True, slots=True)
class AgentScope:
    """The asking agent: its configured name, or None for an anonymous agent."""

    agent: str | None = None

    def sees(self, receipt: ReceiptRecord) -> bool:
        return receipt.agent == self.agent

    def __str__(self) -> str:
        return self.agent if self.agent is not None else "(anonymous)"


ANONYMOUS = AgentScope()
