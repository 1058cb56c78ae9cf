"""`receipts env`: the shell exports that point an agent at the proxy, its CA, and the one-line check."""

import shlex
from pathlib import Path

CA_CERT_NAME = "mitmproxy-ca-cert.pem"  # what mitmproxy writes into its confdir on its first start
CA_VARIABLES = (
    ("SSL_CERT_FILE", "OpenSSL: Python's ssl, httpx, aiohttp"),
    ("REQUESTS_CA_BUNDLE", "requests"),
    ("CURL_CA_BUNDLE", "curl (Debian's curl reads this, not SSL_CERT_FILE)"),
    ("NODE_EXTRA_CA_CERTS", "Node.js"),
)
CHECK_URL = "https://receipts-check.invalid/"  # never resolves (RFC 2606): the proxy answers 502 not_sent itself


def exports(listen_host: str, listen_port: int, confdir: Path) -> list[str]:
    """The lines `receipts env` prints: `eval "$(receipts env)"` in the agent's shell."""
    host = listen_host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # a proxy listening everywhere is reached on loopback from this machine
    proxy = f"http://{f'[{host}]' if ':' in host else host}:{listen_port}"
    ca = shlex.quote(str(confdir / CA_CERT_NAME))
    return [
        f"# receipts env: point this shell, and the agent it starts, at the receipts proxy {proxy}",
        '# use: eval "$(receipts env)", with the --listen-host, --listen-port and --confdir given to receipts proxy',
        *(f"export {name}={proxy}" for name in ("HTTP_PROXY", "HTTPS_PROXY")),
        f"export http_proxy={proxy}  # curl reads only the lowercase one for http:// URLs",
        f"export https_proxy={proxy}",
        f"# HTTPS: trust mitmproxy's CA ({confdir} holds it once the proxy has started)",
        *(f"export {name}={ca}  # {who}" for name, who in CA_VARIABLES),
        "# Node.js fetch ignores the proxy variables unless told: Node 24 and later (22.21 and later): NODE_USE_ENV_PROXY=1;",
        "#   Node 20: npm install undici@7 (in a shell without these exports: npm does not trust the proxy's CA),",
        "#   and in the agent before its first request:",
        "#   import { EnvHttpProxyAgent, setGlobalDispatcher } from 'undici'; setGlobalDispatcher(new EnvHttpProxyAgent());",
        "# Hosts listed in NO_PROXY or no_proxy bypass the proxy: their writes are not journaled.",
        "# Check that a client goes through the proxy (it prints x-receipt-id; nothing is sent anywhere, the proxy",
        "# answers 502 not_sent itself and keeps a rejected receipt of it):",
        f"#   curl -sS -o /dev/null -D - -X POST {CHECK_URL} | grep -i '^x-receipt-id'",
    ]
