"""receipts: an action-receipt proxy for AI agents.

Every mutating request an agent makes through the proxy gets a durable receipt before it goes upstream;
an unknown outcome (timeout, reset, gateway error) blocks a blind retry until it is reconciled.
"""

__version__ = "0.1.0"
