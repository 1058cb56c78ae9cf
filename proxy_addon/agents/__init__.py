"""Agents: who made a write. An agent names itself with proxy authentication (`HTTPS_PROXY=http://NAME:TOKEN@host:port`);
config `agents:` lists the names with a salted hash of each one's token.

- tokens.py    names and tokens: a new token, its stored hash, the check of a token against it (pure)
- settings.py  the `agents:` section of config.yaml, validated
- identity.py  `agent_of(flow)`: the asking agent, for every addon; why it is not part of an intent's identity
- auth.py      AgentAuth, the addon that establishes it (mitmproxy's ProxyAuth, checking the configured agents)
- config_file.py  config.yaml's `agents:` edited in place, every other byte kept (`receipts agents`: cli/agents.py)
"""
