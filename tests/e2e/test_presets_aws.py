"""`preset: s3`, `dynamodb`, `sqs` and `ses` against moto's server (AWS's APIs as moto implements them; nobody
here wrote it), the agent's writes made by boto3 through the proxy, with no rule written by hand. The reconciler's
reads are signed (SigV4) with its own credentials. For S3 and DynamoDB, `receipts rules check` proves each read
rule; a write moto committed whose answer was lost ends `succeeded` (S3: with the object's ETag); one moto never
received ends `safe_to_retry`; the agent's retry is forwarded exactly when the verdict allows it. SQS SendMessage
and SES SendEmail cannot be read back: the preset sends them to a person, saying why, and their retry is refused.
"""

import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer
from support.e2e import tag
from support.faulty_front import DELAY, LOST
from support.presets import PresetWorld, preset_worlds
from support.server import free_port

REGION = "us-east-1"
AGENT_KEYS = {"aws_access_key_id": "AKIAAGENTAAAAAAAAAAA", "aws_secret_access_key": "agent-secret"}
RECONCILER_KEYS = {"AWS_ACCESS_KEY_ID": "AKIARECONCILERAAAAAA", "AWS_SECRET_ACCESS_KEY": "reconciler-secret", "AWS_REGION": REGION}


@pytest.fixture(scope="module")
def moto() -> Iterator[int]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield port
    finally:
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def reconciler_credentials() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    for k, v in RECONCILER_KEYS.items():
        mp.setenv(k, v)
    yield
    mp.undo()


def direct(service: str, moto: int) -> Any:
    """A client straight to moto: to set up and to look, never through the proxy."""
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{moto}", region_name=REGION, **AGENT_KEYS,
                        config=Config(s3={"addressing_style": "path"}))


def agent(service: str, world: PresetWorld) -> Any:
    """The agent's client, through the proxy, with no retries of its own (the test makes the retry)."""
    config = Config(proxies={"http": world.proxy.url}, retries={"total_max_attempts": 1}, read_timeout=30,
                    s3={"addressing_style": "path"})
    return boto3.client(service, endpoint_url=world.front.base, region_name=REGION, **AGENT_KEYS, config=config)


def receipt_of(call: Callable[[], Any]) -> str:
    """The receipt id of a call the proxy answered with an error (botocore raises it)."""
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        call()
    headers = raised.value.response["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-receipt-state"] == "outcome_unknown", headers
    return headers["x-receipt-id"]


def state(world: PresetWorld, operation_id: str) -> str:
    receipt = world.store.receipts.get(operation_id)
    assert receipt is not None
    return receipt.state


@pytest.fixture(scope="module")
def world_of(moto, tmp_path_factory) -> Iterator[Callable[[str], PresetWorld]]:
    """One proxy; a host (a front before moto) per preset."""
    with preset_worlds(dict.fromkeys(("s3", "dynamodb", "sqs", "ses"), moto), tmp_path_factory.mktemp("aws")) as worlds:
        yield worlds.__getitem__


def proven(world: PresetWorld, operation: str, capsys, monkeypatch) -> None:
    health = world.rules_check(capsys, monkeypatch)[operation]
    assert (health["proven"], health["positive"]["result"], health["negative"]["result"]) == (True, "passed", "passed"), health


# -- S3 ------------------------------------------------------------------------------------------------------------


def test_s3_put_object(world_of, moto, capsys, monkeypatch):
    world, bucket, t = world_of("s3"), f"bucket-{tag()}", tag()
    direct("s3", moto).create_bucket(Bucket=bucket)
    s3 = agent("s3", world)
    known = s3.put_object(Bucket=bucket, Key=f"known-{t}.txt", Body=b"known")
    lost_key, unseen_key = f"dir/lost {t}.txt", f"unseen-{t}.txt"

    def put(key: str) -> Callable[[], Any]:
        return lambda: s3.put_object(Bucket=bucket, Key=key, Body=key.encode())

    def to(key: str) -> Callable[[str, str, bytes], bool]:
        return lambda m, target, _b: m == "PUT" and target.split("?")[0].endswith(key.replace(" ", "%20"))

    lost = world.unknown(DELAY, to(lost_key), lambda: receipt_of(put(lost_key)))
    unseen = world.unknown(LOST, to(unseen_key), lambda: receipt_of(put(unseen_key)))
    proven(world, "s3.put_object", capsys, monkeypatch)
    assert world.rules_check(capsys, monkeypatch)["s3.put_object"]["positive"]["evidence"]["matched_id"] == known["ETag"]

    world.reconcile()
    committed = direct("s3", moto).head_object(Bucket=bucket, Key=lost_key)
    assert (state(world, lost), world.store.receipts.get(lost).external_id) == ("succeeded", committed["ETag"])
    assert state(world, unseen) == "safe_to_retry", world.store.receipts.history(unseen)[-1].detail

    with pytest.raises(botocore.exceptions.ClientError):
        put(lost_key)()  # refused, or answered from its receipt: not sent again
    put(unseen_key)()
    assert world.forwarded(to(lost_key)) == 1 and world.forwarded(to(unseen_key)) == 1
    assert direct("s3", moto).get_object(Bucket=bucket, Key=unseen_key)["Body"].read() == unseen_key.encode()


def test_s3_delete_object(world_of, moto, capsys, monkeypatch):
    world, bucket, t = world_of("s3"), f"bucket-{tag()}", tag()
    direct("s3", moto).create_bucket(Bucket=bucket)
    for key in ("known", "gone", "kept"):
        direct("s3", moto).put_object(Bucket=bucket, Key=f"{key}-{t}", Body=b"x")
    s3 = agent("s3", world)
    s3.delete_object(Bucket=bucket, Key=f"known-{t}")

    def to(key: str) -> Callable[[str, str, bytes], bool]:
        return lambda m, target, _b: m == "DELETE" and target.endswith(key)

    gone = world.unknown(DELAY, to(f"gone-{t}"), lambda: receipt_of(lambda: s3.delete_object(Bucket=bucket, Key=f"gone-{t}")))
    kept = world.unknown(LOST, to(f"kept-{t}"), lambda: receipt_of(lambda: s3.delete_object(Bucket=bucket, Key=f"kept-{t}")))
    proven(world, "s3.delete_object", capsys, monkeypatch)

    world.reconcile()
    assert (state(world, gone), state(world, kept)) == ("succeeded", "safe_to_retry")
    s3.delete_object(Bucket=bucket, Key=f"kept-{t}")
    assert world.forwarded(to(f"kept-{t}")) == 1
    assert direct("s3", moto).list_objects_v2(Bucket=bucket).get("KeyCount") == 0


# -- DynamoDB ------------------------------------------------------------------------------------------------------


def test_dynamodb_put_item(world_of, moto, capsys, monkeypatch):
    world, table, t = world_of("dynamodb"), f"table-{tag()}", tag()
    direct("dynamodb", moto).create_table(
        TableName=table, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST",
    )
    db = agent("dynamodb", world)

    def item(name: str) -> dict[str, Any]:
        return {"pk": {"S": f"{name}-{t}"}, "amount": {"N": "12.5"}, "tags": {"SS": ["a", "b"]}}

    def put(name: str) -> Callable[[], Any]:
        return lambda: db.put_item(TableName=table, Item=item(name))

    def to(name: str) -> Callable[[str, str, bytes], bool]:
        return lambda m, _t, body: m == "POST" and json.loads(body or b"{}").get("Item") == item(name)

    db.put_item(TableName=table, Item=item("known"))
    lost = world.unknown(DELAY, to("lost"), lambda: receipt_of(put("lost")))
    unseen = world.unknown(LOST, to("unseen"), lambda: receipt_of(put("unseen")))
    proven(world, "dynamodb.put_item", capsys, monkeypatch)

    world.reconcile()
    assert state(world, lost) == "succeeded", world.store.receipts.history(lost)[-1].detail
    assert state(world, unseen) == "safe_to_retry", world.store.receipts.history(unseen)[-1].detail
    with pytest.raises(botocore.exceptions.ClientError):
        put("lost")()
    put("unseen")()
    assert world.forwarded(to("lost")) == 1 and world.forwarded(to("unseen")) == 1
    assert "Item" in direct("dynamodb", moto).get_item(TableName=table, Key={"pk": {"S": f"unseen-{t}"}})


# -- SQS and SES: to a person ------------------------------------------------------------------------------------


def test_an_unknown_sqs_send_message_goes_to_a_person(world_of, moto):
    world, t = world_of("sqs"), tag()
    queue = direct("sqs", moto).create_queue(QueueName=f"q-{t}")["QueueUrl"]
    sqs = agent("sqs", world)
    url = queue.replace(f"127.0.0.1:{moto}", f"127.0.0.1:{world.front.port}")

    def to(m: str, _t: str, body: bytes) -> bool:
        return m == "POST" and b"SendMessage" not in body.split(b"MessageBody")[0] and t.encode() in body

    op = world.unknown(DELAY, to, lambda: receipt_of(lambda: sqs.send_message(QueueUrl=url, MessageBody=f"hello {t}")))
    world.reconcile()
    receipt = world.store.receipts.get(op)
    assert (receipt.operation, receipt.state) == ("sqs.send_message", "manual_review")
    assert "SQS keeps no record" in world.store.receipts.history(op)[-1].detail["reason"]
    with pytest.raises(botocore.exceptions.ClientError):
        sqs.send_message(QueueUrl=url, MessageBody=f"hello {t}")
    assert world.forwarded(to) == 1


def test_an_unknown_ses_send_email_goes_to_a_person(world_of, moto):
    world, t = world_of("ses"), tag()
    direct("ses", moto).verify_email_identity(EmailAddress="agent@example.com")
    ses = agent("ses", world)

    def send() -> Any:
        return ses.send_email(Source="agent@example.com", Destination={"ToAddresses": ["a@example.com"]},
                              Message={"Subject": {"Data": t}, "Body": {"Text": {"Data": "hello"}}})

    def to(m: str, _t: str, body: bytes) -> bool:
        return m == "POST" and b"Action=SendEmail" in body and t.encode() in body

    op = world.unknown(DELAY, to, lambda: receipt_of(send))
    world.reconcile()
    receipt = world.store.receipts.get(op)
    assert (receipt.operation, receipt.state) == ("ses.send_email", "manual_review")
    assert "SES has no API" in world.store.receipts.history(op)[-1].detail["reason"]
    with pytest.raises(botocore.exceptions.ClientError):
        send()
    assert world.forwarded(to) == 1
