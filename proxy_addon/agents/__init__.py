"""Agents: who made a write. An agent names itself with proxy authentication (`HTTPS_PROXY=http://NAME:TOKEN@host:port`);
config `agents:` lists the names with a salted hash of each one's token.

- tokens.py    names and tokens: a new token, its stored hash, the check of a token against it (pure)
- settings.py  the `agents:` section of config.yaml, validated
- identity.py  `agent_of(flow)`: the asking agent, for every addon; why it is not part of an intent's identity
- auth.py      AgentAuth, the addon that establishes it (mitmproxy's ProxyAuth, checking the configured agents)
- config_file.py  config.yaml's `agents:` edited in place, every other byte kept (`receipts agents`: cli/agents.py)

The agent's own receipts (the agent API, answered by the proxy at `receipts.internal`: addons/agent_api.py):
- scope.py     whose receipts the asking agent sees: its own (anonymous agents share one scope)
- receipts.py  list, get, wait and check for the asking agent, as the REST API and the MCP tools serve them
- check.py     `POST /check`: what the proxy would do now with a request, by the code a real write runs
- documents.py what the agent is shown (the operator's views, redacted as they are) and the check's answer
- api.py       the REST app (Starlette) and its route table; openapi.py its generated OpenAPI document
- mcp.py       the MCP server (the official SDK): list_receipts, get_receipt, wait_for_receipt, check_write
- bridge.py    an ASGI app answering a mitmproxy flow from inside the proxy
- stdio.py     `receipts mcp --agent NAME`: the MCP server over stdio (cli/mcp.py)
"""
