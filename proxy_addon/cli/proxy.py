"""Setting up and running: `receipts init`, `db upgrade`, `proxy`, `env` and `admin`."""

import argparse
import asyncio
import logging
import signal
import sys
import threading
from pathlib import Path

from proxy_addon.agent_env import CA_CERT_NAME, exports
from proxy_addon.cli.common import EXIT_OK, EXIT_USAGE, Commands, load, open_store
from proxy_addon.config import admin_settings
from proxy_addon.db import alembic_config, make_engine, resolve_database_url
from proxy_addon.exceptions import ReceiptsError
from proxy_addon.resources import ADDON_SCRIPT, EXAMPLE_CONFIG


def cmd_init(args: argparse.Namespace) -> int:
    """Writes the default config where `--config` says: an install has no repository to copy config.yaml from.
    Never over a file that exists (its database and secret may be in use) unless `--force` says so."""
    target = Path(args.config)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w" if args.force else "x", encoding="utf-8") as out:
            out.write(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    except FileExistsError:
        raise ReceiptsError(f"{target} exists: not overwritten (--force replaces it)") from None
    except OSError as e:
        raise ReceiptsError(f"cannot write {target}: {e.strerror or e}") from e
    print(f"wrote {target}: the default config, each key explained in it")
    print(f"next: receipts db upgrade --config {target} && receipts proxy --config {target}")
    print(f"a plain mitmproxy loads the addon with: mitmdump -s {ADDON_SCRIPT} --set receipts_config={target.absolute()}")
    return EXIT_OK


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from alembic import command

    config = load(args)
    url = resolve_database_url(config.database.url)
    make_engine(url).dispose()  # validates the URL with a clear message
    try:
        command.upgrade(alembic_config(url), "head")
    except Exception as e:  # alembic/SQLAlchemy raise many kinds; the operator needs one line
        raise ReceiptsError(f"migration failed: {str(getattr(e, 'orig', None) or e).strip().splitlines()[0]}") from e
    print(f"database at migration head ({_safe_url(url)})")
    return EXIT_OK


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def cmd_proxy(args: argparse.Namespace) -> int:
    config = load(args)
    open_store(args, config).engine.dispose()  # refuse to start on an unmigrated or unreachable database
    return asyncio.run(_run_proxy(args))


async def _run_proxy(args: argparse.Namespace) -> int:
    from mitmproxy import exceptions, options
    from mitmproxy.tools.dump import DumpMaster

    from proxy_addon.addons.dispatch import use_quick_dispatch
    from proxy_addon.addons.receipts import make_addons

    logging.getLogger().setLevel(logging.INFO)  # mitmproxy's own lines ("HTTP(S) proxy listening at ...")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    opts = options.Options(listen_host=args.listen_host, listen_port=args.listen_port)
    if args.confdir:
        opts.update(confdir=args.confdir)
    master = DumpMaster(opts, with_termlog=True, with_dumper=False)
    use_quick_dispatch(master)
    master.addons.add(*make_addons())
    try:
        # lazy: with HTTPS, do not open an upstream connection before the request is known
        opts.update(connection_strategy="lazy", receipts_config=args.config, ssl_insecure=args.ssl_insecure)
        for spec in args.set or []:
            opts.set(spec)
    except exceptions.OptionsError as e:
        print(f"receipts proxy: {e}", file=sys.stderr)
        return EXIT_USAGE
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()
    return EXIT_OK


def cmd_env(args: argparse.Namespace) -> int:
    """The exports that point a shell, and the agent it starts, at the proxy: `eval "$(receipts env)"`."""
    from mitmproxy.options import CONF_DIR

    confdir = Path(args.confdir or CONF_DIR).expanduser().absolute()
    print("\n".join(exports(args.listen_host, args.listen_port, confdir)))
    if not (confdir / CA_CERT_NAME).exists():
        print(f"receipts env: {confdir / CA_CERT_NAME} does not exist yet: start the proxy once (make run) to create it",
              file=sys.stderr)
    return EXIT_OK


def cmd_admin(args: argparse.Namespace) -> int:
    from proxy_addon.admin.server import AdminServer

    config = load(args)
    store = open_store(args, config)
    settings = admin_settings(config, listen_host=args.listen_host, listen_port=args.listen_port, enabled=True)
    server = AdminServer(config, store, settings=settings)
    try:
        server.start()
    except OSError as e:
        store.engine.dispose()
        raise ReceiptsError(f"cannot listen on {settings.listen_host}:{settings.listen_port}: {e.strerror or e}") from e
    print(f"receipts admin on {server.url} (Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    store.engine.dispose()
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------------------------


def add_init(commands: Commands) -> None:
    p = commands.command("init", cmd_init, "write the default config to --config (every key explained in it), to edit")
    p.add_argument("--force", action="store_true", help="replace a file that is there")


def add_db(commands: Commands) -> None:
    db = commands.group("db", "database schema")
    commands.command("upgrade", cmd_db_upgrade, "apply the Alembic migrations (upgrade head)", db)


def add_proxy(commands: Commands) -> None:
    p = commands.command("proxy", cmd_proxy, "run the journaling proxy")
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--listen-port", type=int, default=8080)
    p.add_argument("--confdir", default=None, help="mitmproxy's directory for its CA (default ~/.mitmproxy)")
    p.add_argument("--ssl-insecure", action="store_true", help="do not verify upstream TLS certificates")
    p.add_argument("--set", action="append", metavar="OPTION=VALUE", help="any mitmproxy option")


def add_env(commands: Commands) -> None:
    p = commands.command("env", cmd_env, "print the shell exports that point an agent at the proxy (HTTP(S)_PROXY, the CA variables)")
    p.add_argument("--listen-host", default="127.0.0.1", help="the proxy's address, as given to receipts proxy")
    p.add_argument("--listen-port", type=int, default=8080)
    p.add_argument("--confdir", default=None, help="mitmproxy's directory for its CA, as given to receipts proxy (default ~/.mitmproxy)")


def add_admin(commands: Commands) -> None:
    p = commands.command("admin", cmd_admin, "serve the admin API, review page and /metrics (the config's admin section)")
    p.add_argument("--listen-host", default=None, help="default admin.listen_host (127.0.0.1)")
    p.add_argument("--listen-port", type=int, default=None, help="default admin.listen_port (8081)")


COMMANDS = {"init": add_init, "db": add_db, "proxy": add_proxy, "env": add_env, "admin": add_admin}
