"""The agent's own receipts: the agent API, answered by the proxy itself at its reserved host (`agent_api.host`,
`receipts.internal`; addons/agent_api.py), and `receipts mcp` over stdio. Read only, scoped to the asking agent
(agents/identity.py names it), never forwarded nor journaled.

- scope.py      whose receipts the asker sees: its own (the anonymous share one scope)
- receipts.py   list, get, wait and check for the asker, as the REST API and the MCP tools serve them
- check.py      `POST /check`: what the proxy would do now with a request, by the code a real write runs
- documents.py  what the agent is shown (the operator's views, redacted as they are) and the check's answer
- api.py        the REST app (Starlette) and its route table; openapi.py its generated OpenAPI document
- mcp.py        the MCP server (the official SDK): list_receipts, get_receipt, wait_for_receipt, check_write
- bridge.py     an ASGI app answering a mitmproxy flow from inside the proxy
- stdio.py      `receipts mcp --agent NAME`: the MCP server over stdio (cli/mcp.py)
"""
