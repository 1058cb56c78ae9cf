"""The AWS SDK for Python's own retries through the proxy: botocore signs every attempt anew (SigV4:
a new `Authorization`, `X-Amz-Date`, `amz-sdk-request: attempt=N`), yet an SDK's retry of one call is one intent.

Real parts: boto3 against moto's server (in this process), a faulty front (support/faulty_front.py) between the
proxy and moto that loses moto's answer after moto has acted (held past the SDK's read timeout, a reset, or a
500 instead), and the real proxy on PostgreSQL. Effects are counted on moto, never through the proxy.
For each service and fault: without the proxy the SDK's retry acts twice (the fault really provokes a retry);
through the proxy moto acts once; with `in_flight: wait` the held call ends in success with moto's answer.
"""

import functools
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import boto3
import botocore.exceptions
import pytest
import requests
from botocore.config import Config
from moto.backends import get_backend
from moto.core import DEFAULT_ACCOUNT_ID
from moto.server import ThreadedMotoServer
from support.e2e import migrate, pg_database, stop_process, tag, wait_for
from support.faulty_front import DELAY, ERROR_500, KINDS, RESET, FaultyFront, fronts_before
from support.proxy import start_proxy_process, warmed_inprocess_proxy
from support.sdk_results import Outcome, cases, record
from support.server import free_port

pytestmark = pytest.mark.postgres

REGION = "us-east-1"
READ_TIMEOUT = 1.2  # the SDK's read timeout: shorter than the front's hold, long enough for moto on a busy machine
LONG_READ_TIMEOUT = 3.0  # when the retry is provoked by a reset or a 500, which come within a second
HOLD = 2.5  # how long the front holds a lost answer (DELAY)
MAX_ATTEMPTS = 4
KEYS = {"agent-a": ("AKIAAGENTAAAAAAAAAAA", "secret-a"), "agent-b": ("AKIAAGENTBBBBBBBBBBB", "secret-b")}


@pytest.fixture(scope="module")
def moto_server():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", port
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fronts(moto_server):
    with fronts_before({"refuse": moto_server[1], "wait": moto_server[1]}) as started:
        yield started


@pytest.fixture(scope="module")
def database(pg_server):
    with pg_database(pg_server) as url:
        migrate(url)
        yield url


@pytest.fixture(scope="module")
def config(fronts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sdk_aws")
    path = tmp / "config.yaml"
    path.write_text(
        f"secret_file: {tmp / 'secret'}\n"
        "defaults: {upstream_timeout: 5s}\n"
        "hosts:\n"
        f'  "127.0.0.1:{fronts["wait"].port}": {{in_flight: {{policy: wait, max_wait: 10s}}}}\n'
    )
    return path


@pytest.fixture(scope="module")
def proxy(config, database, moto_server, tmp_path_factory):
    with warmed_inprocess_proxy(config, database, tmp_path_factory.mktemp("confdir"), f"{moto_server[0]}/warm-up") as running:
        yield running


def client(
    service: str, endpoint: str, proxy_url: str | None, key: str = "agent-a", attempts: int = MAX_ATTEMPTS,
    read_timeout: float = READ_TIMEOUT,
):
    key_id, secret = KEYS[key]
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret, region_name=REGION)
    config = Config(
        proxies={"http": proxy_url} if proxy_url else None,
        read_timeout=read_timeout,
        connect_timeout=2,
        retries={"max_attempts": attempts, "mode": "standard"},
        s3={"addressing_style": "path"},
        signature_version="s3v4" if service == "s3" else None,  # presigned URLs with SigV4 (X-Amz-Signature)
    )
    return session.client(service, endpoint_url=endpoint, config=config)


@functools.cache
def direct(service: str, moto_url: str):
    """A client straight to moto, for setting up and counting: never through the proxy or the front."""
    return client(service, moto_url, None)


# The writes: set up what the write needs (on moto directly), make it through an SDK client, count its effects.


@dataclass(frozen=True)
class Write:
    service: str
    setup: Callable  # (moto_url, tag) -> context
    call: Callable  # (client, context) -> the SDK's answer
    effects: Callable  # (moto_url, context) -> how many times moto acted


def ses_setup(moto_url, t):
    source = f"{t}@example.com"
    direct("ses", moto_url).verify_email_identity(EmailAddress=source)
    return source


def ses_send(ses, source):
    return ses.send_email(
        Source=source,
        Destination={"ToAddresses": ["someone@example.com"]},
        Message={"Subject": {"Data": f"receipt {source}"}, "Body": {"Text": {"Data": "hello"}}},
    )


def ses_effects(moto_url, source):
    return sum(1 for m in get_backend("ses")[DEFAULT_ACCOUNT_ID][REGION].sent_messages if m.source == source)


def sqs_setup(moto_url, t):
    return direct("sqs", moto_url).create_queue(QueueName=f"q-{t}")["QueueUrl"]


def sqs_send(sqs, queue_url):
    return sqs.send_message(QueueUrl=queue_url, MessageBody=f"order for {queue_url}")


def queue_depth(moto_url, queue_url):
    attributes = direct("sqs", moto_url).get_queue_attributes(QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def sns_setup(moto_url, t):
    sns, sqs = direct("sns", moto_url), direct("sqs", moto_url)
    topic = sns.create_topic(Name=f"t-{t}")["TopicArn"]
    queue_url = sqs.create_queue(QueueName=f"sub-{t}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    return topic, queue_url


def sns_publish(sns, context):
    return sns.publish(TopicArn=context[0], Message=f"shipped {context[0]}")


def dynamodb_setup(moto_url, t):
    db = direct("dynamodb", moto_url)
    if "effects" not in db.list_tables()["TableNames"]:
        db.create_table(
            TableName="effects",
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
    return t


def dynamodb_add(db, t):
    return db.update_item(
        TableName="effects", Key={"id": {"S": t}}, UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": {"N": "1"}}
    )


def dynamodb_effects(moto_url, t):
    item = direct("dynamodb", moto_url).get_item(TableName="effects", Key={"id": {"S": t}}).get("Item")
    return int(item["n"]["N"]) if item else 0


BUCKET = "receipts-effects"


def s3_setup(moto_url, t):
    s3 = direct("s3", moto_url)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    return f"uploads/{t}.txt"


def presigned_put(s3, key):
    """An uploader that presigns each attempt anew (as a tool that hands out presigned URLs does) and retries,
    like the SDK, on a timeout, a reset or a 5xx. Each attempt's URL is another signature and `X-Amz-Date`."""
    proxies = s3.meta.config.proxies or {}
    last_date, answer = None, None
    for _attempt in range(MAX_ATTEMPTS):
        url = wait_for(lambda: _presign_after(s3, key, last_date), 3, 0.05)  # a bounded poll: the next second's URL
        assert url, "the presigned URL did not change"
        last_date = parse_qs(urlsplit(url).query)["X-Amz-Date"][0]
        try:
            answer = requests.put(url, data=f"contents of {key}".encode(), proxies=proxies, timeout=s3.meta.config.read_timeout)
        except (requests.ConnectionError, requests.Timeout) as e:
            answer = e
            continue
        if answer.status_code < 500:
            break
    if isinstance(answer, Exception):
        raise answer
    if answer.status_code >= 300:
        raise RuntimeError(f"HTTP {answer.status_code} {_problem(answer)}".strip())
    return {"ResponseMetadata": {"HTTPHeaders": {k.lower(): v for k, v in answer.headers.items()}}}


def _presign_after(s3, key, last_date):
    url = s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=600)
    return url if parse_qs(urlsplit(url).query)["X-Amz-Date"][0] != last_date else None


def _problem(answer) -> str:
    try:
        return answer.json().get("type", "").rsplit("/", 1)[-1]
    except ValueError:
        return ""


def s3_effects(moto_url, key):
    return len(direct("s3", moto_url).list_object_versions(Bucket=BUCKET, Prefix=key).get("Versions", []))


WRITES = {
    "ses": Write("ses SendEmail", ses_setup, ses_send, ses_effects),
    "sqs": Write("sqs SendMessage", sqs_setup, sqs_send, queue_depth),
    "sns": Write("sns Publish", sns_setup, sns_publish, lambda url, c: queue_depth(url, c[1])),
    "dynamodb": Write("dynamodb UpdateItem", dynamodb_setup, dynamodb_add, dynamodb_effects),
    "s3": Write("s3 presigned PUT", s3_setup, presigned_put, s3_effects),
}


def returned(call: Callable[[], dict]) -> tuple[str, dict | None]:
    """What the SDK call ended in: `success`, or the error it raised (class, status, code)."""
    try:
        answer = call()
    except botocore.exceptions.ClientError as e:
        meta = e.response.get("ResponseMetadata", {})
        return f"{type(e).__name__} {meta.get('HTTPStatusCode')} {e.response.get('Error', {}).get('Code')}", None
    except Exception as e:  # whatever the SDK raised is the finding
        return f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", None
    return "success", answer


def tagged(t: str):
    return lambda method, target, body: t in target or t.encode() in body


def run(write: Write, moto_url: str, front: FaultyFront, fault: str, proxy_url: str | None, key: str = "agent-a"):
    """One SDK call whose first attempt meets `fault`; returns once every answer the front held is delivered
    (so that what moto did is all there is to count)."""
    t = tag()
    context = write.setup(moto_url, t)
    front.arm(fault, tagged(t), times=1, delay=HOLD, next_second=True)
    timeout = READ_TIMEOUT if fault == DELAY else LONG_READ_TIMEOUT
    sdk = client(write.service.split()[0], front.base, proxy_url, key, read_timeout=timeout)
    outcome, answer = returned(lambda: write.call(sdk, context))
    assert front.wait_for(tagged(t), 1, 10), "nothing reached the server"  # the first attempt, at least
    assert front.wait_idle(HOLD + 5), "the front still holds an answer"
    return t, context, outcome, answer


# Without the proxy, one service per fault proves the fault provokes botocore's retry (the same code retries every
# service). Through the proxy, every service and every fault; SES and SNS after a reset or a 500 are left to the
# whole table, as botocore cannot read the proxy's 504 in their XML protocol and does not retry it anyway.
WITHOUT = cases([(n, f) for n in WRITES for f in KINDS], [("sqs", DELAY), ("dynamodb", RESET), ("ses", ERROR_500)])
THROUGH = cases(
    [(n, f) for n in WRITES for f in KINDS],
    [("ses", DELAY), ("sns", DELAY), ("sqs", RESET), ("dynamodb", ERROR_500), ("s3", RESET), ("s3", DELAY)],
)
WAITING = cases(list(WRITES), ["ses", "sqs"])


@pytest.mark.parametrize(("name", "fault"), WITHOUT)
def test_without_the_proxy_the_sdks_retry_acts_again(name, fault, moto_server, fronts):
    """The fault really provokes the SDK's own retry: without the proxy, moto acts twice."""
    write, (moto_url, _) = WRITES[name], moto_server
    t, context, outcome, _ = run(write, moto_url, fronts["refuse"], fault, None)
    effects = write.effects(moto_url, context)
    record(Outcome("boto3", write.service, fault, "direct", effects, outcome))
    assert outcome == "success"
    assert effects == 2, f"{write.service} {fault}: {effects} effects without the proxy"


@pytest.mark.parametrize(("name", "fault"), THROUGH)
def test_through_the_proxy_the_sdks_retry_is_the_same_intent(name, fault, moto_server, fronts, proxy, database):
    write, (moto_url, _), front = WRITES[name], moto_server, fronts["refuse"]
    t, context, outcome, _ = run(write, moto_url, front, fault, proxy.url)
    effects = write.effects(moto_url, context)
    record(Outcome("boto3", write.service, fault, "refuse", effects, outcome))
    assert front.count(tagged(t)) >= 1, "nothing reached moto"
    assert effects == 1, f"{write.service} {fault}: {effects} effects through the proxy ({outcome})"
    assert outcome != "success"  # the retry was refused (409 duplicate-open), or ended in the 504 of an unknown outcome
    assert outcome.startswith("ClientError 409 DuplicateOpen") or name == "s3", outcome  # read as an AWS error


@pytest.mark.parametrize("name", WAITING)
def test_with_in_flight_wait_the_sdks_retry_gets_the_answer(name, moto_server, fronts, proxy):
    """The first attempt's answer is held past the read timeout; the SDK's retry waits for it and is answered
    with it: the call succeeds with moto's own answer, and moto acted once."""
    write, (moto_url, _), front = WRITES[name], moto_server, fronts["wait"]
    t, context, outcome, answer = run(write, moto_url, front, DELAY, proxy.url)
    effects = write.effects(moto_url, context)
    record(Outcome("boto3", write.service, DELAY, "wait", effects, outcome))
    assert effects == 1, f"{write.service}: {effects} effects with in_flight wait ({outcome})"
    assert outcome == "success"
    headers = answer["ResponseMetadata"]["HTTPHeaders"]
    assert headers.get("x-receipt-replayed") == "true", headers  # the original's answer, replayed to the retry
    assert headers.get("x-receipt-state") == "succeeded"


def test_two_access_keys_with_the_same_body_are_two_accounts(moto_server, fronts, proxy):
    """Two signers sending the same SendMessage: two intents, two effects; each one's own retry stays one."""
    write, (moto_url, _), front = WRITES["sqs"], moto_server, fronts["refuse"]
    t = tag()
    queue_url = write.setup(moto_url, t)
    answers = {}
    for key in KEYS:
        front.arm(RESET, tagged(t), times=1, next_second=True)  # each signer's call meets its own reset, then retries
        sdk = client("sqs", front.base, proxy.url, key, read_timeout=LONG_READ_TIMEOUT)
        answers[key] = returned(lambda sdk=sdk: write.call(sdk, queue_url))[0]
    assert queue_depth(moto_url, queue_url) == 2, answers
    assert front.count(tagged(t)) == 2, answers  # one per signer: neither signer's retry was forwarded


def test_the_same_key_after_a_proxy_kill_and_restart_is_one_intent(moto_server, fronts, config, database, tmp_path):
    """The proxy process is SIGKILLed while the first write is in moto's hands (its answer held by the front);
    a new proxy on the same database; the SDK's call sent again (newly signed) is refused, not sent again."""
    write, (moto_url, _), front = WRITES["sqs"], moto_server, fronts["refuse"]
    t = tag()
    queue_url = write.setup(moto_url, t)
    front.arm(DELAY, tagged(t), times=1, delay=HOLD)
    proc, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "first.log")
    second = None
    try:
        first: dict = {}
        # a read timeout longer than the journal's: an agent that left before its receipt was written is not sent for
        via_first = client("sqs", front.base, f"http://127.0.0.1:{port}", attempts=1, read_timeout=30)
        sender = threading.Thread(target=lambda: first.update(r=returned(lambda: write.call(via_first, queue_url))[0]), daemon=True)
        sender.start()
        assert front.wait_for(tagged(t), 1, 10), "the first write did not reach moto"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        sender.join(10)
        second, port = start_proxy_process(config, database, tmp_path / "confdir", tmp_path / "second.log", port=port)
        repeat = client("sqs", front.base, f"http://127.0.0.1:{port}", read_timeout=LONG_READ_TIMEOUT)
        again = returned(lambda: write.call(repeat, queue_url))[0]
        effects = queue_depth(moto_url, queue_url)
        record(Outcome("boto3", write.service, "proxy SIGKILL + restart", "refuse", effects, f"{first.get('r')}; then {again}"))
        assert effects == 1, f"{effects} effects; the repeat after the restart returned {again}"
        assert "409" in again, again
    finally:
        stop_process(proc)
        if second is not None:
            stop_process(second)
