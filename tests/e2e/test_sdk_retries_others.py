"""Other SDKs agents use, their own retries through the proxy: the Azure Storage queue SDK against
Azurite (SharedKey: every attempt signed anew, with a new `x-ms-date` and `x-ms-client-request-id`),
stripe-python (its retries keep their `Idempotency-Key`), slack_sdk's WebClient and PyGithub against a small
upstream of their APIs' shapes (support/sdk_upstreams.py). A faulty front (support/faulty_front.py) loses the
server's answer after it acted: held past the SDK's read timeout, a reset, or a 500.
Only what each SDK really retries is expected to retry: slack_sdk's default handler retries connection errors
only, so its timeout and 500 rows show one effect everywhere. Effects are counted on the server itself.
"""

import math
import os
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import stripe
from azure.storage.queue import LinearRetry, QueueClient
from github import Auth, Github, GithubRetry
from slack_sdk import WebClient
from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler
from support.e2e import migrate, pg_database, stop_process, wait_for
from support.faulty_front import DELAY, ERROR_500, KINDS, RESET, fronts_before
from support.proxy import REPO, warmed_inprocess_proxy
from support.sdk_results import Outcome, cases, record
from support.sdk_upstreams import SdkUpstream
from support.server import free_port, listens

pytestmark = pytest.mark.postgres

READ_TIMEOUT = 0.8  # the SDKs' read timeout: shorter than the front's hold
LONG_READ_TIMEOUT = 3.0  # when the retry is provoked by a reset or a 500, which come within a second
HOLD = 2.0
RETRIES = 3  # each SDK's own retries after the first attempt
AZURITE = REPO / ".node" / "node_modules" / ".bin" / "azurite-queue"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # Azurite's published key


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    if not AZURITE.exists():
        pytest.fail(f"{AZURITE} is missing: run scripts/ensure-azurite (make test does)", pytrace=False)
    port, tmp = free_port(), tmp_path_factory.mktemp("azurite")
    log = open(tmp / "azurite.log", "wb")
    proc = subprocess.Popen(
        [str(AZURITE), "--queueHost", "127.0.0.1", "--queuePort", str(port), "--inMemoryPersistence",
         "--skipApiVersionCheck", "--loose"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
    )
    try:
        assert wait_for(lambda: proc.poll() is not None or listens(proc.pid, port), 30, 0.1) and proc.poll() is None, (
            (tmp / "azurite.log").read_text()[-2000:]
        )
        yield port
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def upstream():
    up = SdkUpstream().start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def fronts(azurite, upstream):
    ports = {("azure", mode): azurite for mode in ("refuse", "wait")} | {("api", mode): upstream.port for mode in ("refuse", "wait")}
    with fronts_before(ports) as started:
        yield started


@pytest.fixture(scope="module")
def proxy(fronts, pg_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk_others")
    config = tmp / "config.yaml"
    waiting = "".join(
        f'  "127.0.0.1:{f.port}": {{in_flight: {{policy: wait, max_wait: 10s}}}}\n' for (_, mode), f in fronts.items() if mode == "wait"
    )
    config.write_text(f"secret_file: {tmp / 'secret'}\ndefaults: {{upstream_timeout: 5s}}\nhosts:\n{waiting}")
    with pg_database(pg_server) as url:
        migrate(url)
        with warmed_inprocess_proxy(config, url, tmp / "confdir", f"{fronts[('api', 'refuse')].base}/warm-up") as running:
            yield running


# The SDKs: set up, one call through (or around) the proxy, its effects counted on the server.


@dataclass(frozen=True)
class Sdk:
    name: str
    service: str
    server: str  # "azure" (Azurite) or "api" (the small upstream)
    retried: tuple[str, ...]  # the faults this SDK's own retry policy retries
    call: Callable  # (servers, front, proxy_url, read_timeout, tag) -> the SDK's answer
    effects: Callable  # (servers, tag) -> how many times the server acted


def azure_queue(base: str, name: str, proxy_url: str | None, read_timeout: float) -> QueueClient:
    return QueueClient(
        account_url=f"{base}/{AZURITE_ACCOUNT}", queue_name=name,
        credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY},
        proxies={"http": proxy_url} if proxy_url else None, read_timeout=read_timeout, connection_timeout=2,
        retry_policy=LinearRetry(backoff=0.1, random_jitter_range=0, retry_total=RETRIES),
    )


def azure_send(servers, front, proxy_url, read_timeout, t):
    azure_queue(f"http://127.0.0.1:{servers['azure']}", f"q-{t}", None, 5).create_queue()
    return azure_queue(front.base, f"q-{t}", proxy_url, read_timeout).send_message(f"order {t}")


def azure_effects(servers, t):
    queue = azure_queue(f"http://127.0.0.1:{servers['azure']}", f"q-{t}", None, 5)
    return len(queue.peek_messages(max_messages=32))


def stripe_charge(servers, front, proxy_url, read_timeout, t):
    client = stripe.StripeClient(
        "sk_test_receipts", base_addresses={"api": front.base}, max_network_retries=RETRIES,
        http_client=stripe.RequestsClient(timeout=read_timeout, proxy=proxy_url),
    )
    return client.v1.charges.create(params={"amount": 100, "currency": "usd", "source": "tok_visa", "description": t})


def slack_post(servers, front, proxy_url, read_timeout, t):
    client = WebClient(
        token="xoxb-receipts", base_url=f"{front.base}/api/", proxy=proxy_url, timeout=read_timeout,
        retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=RETRIES)],
    )
    return client.chat_postMessage(channel="C1", text=t)


def github_issue(servers, front, proxy_url, read_timeout, t):
    """PyGithub takes no proxy argument: requests reads it from the environment, as for an agent's shell."""
    gh = Github(auth=Auth.Token("ghp_receipts"), base_url=front.base, timeout=math.ceil(read_timeout),  # whole seconds only
                retry=GithubRetry(total=RETRIES, backoff_factor=0.05), lazy=True)
    saved = {k: os.environ.pop(k, None) for k in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY")}
    try:
        if proxy_url:
            os.environ["http_proxy"] = proxy_url
        return gh.get_repo("acme/shop").create_issue(title=f"refund {t}", body="the customer asked twice")
    finally:
        os.environ.pop("http_proxy", None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def counted(servers, t):
    return servers["upstream"].count(t)


SDKS = {
    "azure": Sdk("azure-storage-queue", "queue send_message", "azure", KINDS, azure_send, azure_effects),
    "stripe": Sdk("stripe-python", "charges.create", "api", KINDS, stripe_charge, counted),
    "slack": Sdk("slack_sdk", "chat.postMessage", "api", (RESET,), slack_post, counted),
    "github": Sdk("PyGithub", "create_issue", "api", KINDS, github_issue, counted),
}


def returned(call: Callable[[], object]) -> tuple[str, object]:
    try:
        answer = call()
    except Exception as e:  # whatever the SDK raised is the finding
        status = getattr(e, "status_code", None) or getattr(e, "http_status", None) or getattr(e, "status", None)
        return f"{type(e).__name__}{f' {status}' if status else ''}", None
    return "success", answer


def tagged(t: str):
    return lambda method, target, body: t in target or t.encode() in body


EVERY = [(n, f) for n in SDKS for f in KINDS]
WITHOUT = cases(EVERY, [("azure", ERROR_500), ("stripe", DELAY), ("github", RESET), ("slack", RESET)])
THROUGH = cases(EVERY, [("azure", DELAY), ("azure", ERROR_500), ("stripe", RESET), ("github", DELAY), ("slack", RESET)])
WAITING = cases(list(SDKS), ["azure", "github"])


@pytest.fixture(scope="module")
def servers(azurite, upstream):
    return {"azure": azurite, "upstream": upstream}


def run(sdk: Sdk, servers, fronts, fault: str, mode: str, proxy_url: str | None):
    front = fronts[(sdk.server, "wait" if mode == "wait" else "refuse")]
    t = uuid.uuid4().hex[:12]
    front.arm(fault, tagged(t), times=1, delay=HOLD, next_second=True)
    timeout = READ_TIMEOUT if fault == DELAY else LONG_READ_TIMEOUT
    outcome, answer = returned(lambda: sdk.call(servers, front, proxy_url, timeout, t))
    assert front.wait_for(tagged(t), 1, 10), "nothing reached the server"  # the first attempt, at least
    assert front.wait_idle(HOLD + 5), "the front still holds an answer"
    effects = sdk.effects(servers, t)
    record(Outcome(sdk.name, sdk.service, fault, mode, effects, outcome))
    return t, effects, outcome, answer


@pytest.mark.parametrize(("name", "fault"), WITHOUT)
def test_without_the_proxy(name, fault, servers, fronts):
    sdk = SDKS[name]
    _, effects, outcome, _ = run(sdk, servers, fronts, fault, "direct", None)
    if fault in sdk.retried:
        assert effects == 2, f"{sdk.name} {fault}: the SDK's own retry did not act again ({outcome})"
        assert outcome == "success"
    else:
        assert effects == 1, outcome  # this SDK does not retry this: nothing for the proxy to hold


@pytest.mark.parametrize(("name", "fault"), THROUGH)
def test_through_the_proxy_the_sdks_retry_is_one_intent(name, fault, servers, fronts, proxy):
    sdk = SDKS[name]
    _, effects, outcome, _ = run(sdk, servers, fronts, fault, "refuse", proxy.url)
    assert effects == 1, f"{sdk.name} {fault}: {effects} effects through the proxy ({outcome})"


@pytest.mark.parametrize("name", WAITING)
def test_with_in_flight_wait_the_retry_gets_the_answer(name, servers, fronts, proxy):
    sdk = SDKS[name]
    _, effects, outcome, _ = run(sdk, servers, fronts, DELAY, "wait", proxy.url)
    assert effects == 1, f"{sdk.name}: {effects} effects with in_flight wait ({outcome})"
    if DELAY in sdk.retried:
        assert outcome == "success", f"{sdk.name}: {outcome}"
