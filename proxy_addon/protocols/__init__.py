"""Protocols: which requests are reads and which are writes, and how a write is identified and answered.

- base.py: the seam (`Call`): read or write, identity and operation name, answers and verdicts in the protocol's shape
- rest.py, graphql.py, jsonrpc.py (MCP included): one module per protocol
- routing.py: what passes through, from the head alone (method, host, rule), then by protocol from the body
- hosts.py: the model APIs that pass through by default; wildcard host keys
- passthrough.py: the mitmproxy addon that streams pass-through traffic both ways
- sse.py: server-sent events, as MCP servers answer with them

Adding a protocol (gRPC-web, X-Amz-Target RPC) is one module with `NAME`, `OPERATION_PREFIX` and `recognise`,
listed in routing.PROTOCOLS.
"""
