"""`receipts mcp`: the agent's own receipts as an MCP server over stdio (agents/stdio.py), for an agent host on the
proxy's machine that starts its MCP servers from a config file."""

import argparse

from proxy_addon.cli.common import EXIT_OK, Commands


def cmd_mcp(args: argparse.Namespace) -> int:
    from proxy_addon.agents.stdio import serve_stdio  # the MCP SDK takes a second or two to import: here only

    serve_stdio(args.config, args.agent, args.proxy_port)
    return EXIT_OK


def add_mcp(commands: Commands) -> None:
    p = commands.command(
        "mcp", cmd_mcp,
        "the agent's own receipts as an MCP server over stdio (tools list_receipts, get_receipt, wait_for_receipt, check_write)",
    )
    p.add_argument("--agent", metavar="NAME", help="the agent whose receipts it serves (default: the anonymous agents')")
    p.add_argument("--proxy-port", type=int, default=8080, help="the proxy's listen port, which check_write names as the proxy's own")


COMMANDS = {"mcp": add_mcp}
