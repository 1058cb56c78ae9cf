"""REST: every request no other protocol claims. A write is identified by its method, target and body
(rules/fingerprint.py), named by its rule or `METHOD host path-template`, and answered in problem+json: the base
`Call` as it is."""

from proxy_addon.protocols.base import Call

NAME = "rest"
REST = Call()
