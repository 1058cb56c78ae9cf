"""The agents: `receipts agents add NAME`, `receipts agents ls`, `receipts agents rm NAME` (config `agents:`).

`add` prints the new token once, and the proxy URL that names the agent; config.yaml keeps only the token's
salted hash (agents/tokens.py), edited in place (config/agents_file.py). `ls` shows names, never hashes.
"""

import argparse
from pathlib import Path

from proxy_addon.agents.tokens import check_name, new_token, token_hash
from proxy_addon.cli.common import EXIT_OK, Commands, argument, load
from proxy_addon.config import agents_file as config_file
from proxy_addon.exceptions import ConfigError
from proxy_addon.views.terminal import print_json


def cmd_add(args: argparse.Namespace) -> int:
    path = Path(args.config)
    token = new_token()
    try:
        text = config_file.added(config_file.read(path), args.name, token_hash(token))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    config_file.write(path, text)
    host = f"[{args.listen_host}]" if ":" in args.listen_host else args.listen_host
    proxy = f"http://{args.name}:{token}@{host}:{args.listen_port}"
    print(f"added agent {args.name} to {path}: it keeps the token's salted hash, the token itself is kept nowhere")
    print(f"the token, shown this once: {token}")
    print("point the agent at the proxy with this (a running proxy reads agents: when it starts: restart it):")
    print(f"export HTTPS_PROXY={proxy} HTTP_PROXY={proxy} https_proxy={proxy} http_proxy={proxy}")
    return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    names = sorted(load(args).agents)
    if args.json:
        print_json(names)
    elif names:
        print("\n".join(names))
    else:
        print(f"no agents in {args.config} (`receipts agents add NAME` adds one)")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    path = Path(args.config)
    try:
        text = config_file.removed(config_file.read(path), args.name)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    config_file.write(path, text)
    print(f"removed agent {args.name} from {path}: its token names nobody once the proxy restarts")
    return EXIT_OK


name_arg = argument(check_name)


def add_agents(commands: Commands) -> None:
    group = commands.group("agents", "the agents that name themselves to the proxy (config agents:)")
    p = commands.command("add", cmd_add, "add an agent with a new token: prints the token once, and its proxy URL", group)
    p.add_argument("name", type=name_arg)
    p.add_argument("--listen-host", default="127.0.0.1", help="the proxy's address, for the URL printed")
    p.add_argument("--listen-port", type=int, default=8080)
    p = commands.command("ls", cmd_ls, "the agents' names (never their tokens or hashes)", group)
    p.add_argument("--json", action="store_true")
    p = commands.command("rm", cmd_rm, "remove an agent: its token names nobody any more", group)
    p.add_argument("name")


COMMANDS = {"agents": add_agents}
