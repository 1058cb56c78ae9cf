"""`receipts mcp`: the agent's own receipts as an MCP server over stdio (agent_api/stdio.py), for an agent host on the
proxy's machine that starts its MCP servers from a config file."""

import argparse

from proxy_addon.cli.common import EXIT_OK, Commands, load


def cmd_mcp(args: argparse.Namespace) -> int:
    from proxy_addon.addons.admission import OwnAddresses
    from proxy_addon.agent_api.stdio import serve_stdio  # the MCP SDK takes a second or two to import: here only

    config = load(args)
    own = OwnAddresses()  # what check_write names as the proxy's own: its listen port, its admin server
    own.add("127.0.0.1", args.proxy_port, "the proxy")
    own.add(config.admin.listen_host, config.admin.listen_port, "the receipts admin server")
    serve_stdio(config, args.agent, own.forbidden)
    return EXIT_OK


def add_mcp(commands: Commands) -> None:
    p = commands.command(
        "mcp", cmd_mcp,
        "the agent's own receipts as an MCP server over stdio (tools list_receipts, get_receipt, wait_for_receipt, check_write)",
    )
    p.add_argument("--agent", metavar="NAME", help="the agent whose receipts it serves (default: the anonymous agents')")
    p.add_argument("--proxy-port", type=int, default=8080, help="the proxy's listen port, which check_write names as the proxy's own")


COMMANDS = {"mcp": add_mcp}
