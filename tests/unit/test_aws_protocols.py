"""AWS's query and JSON protocols (protocols/aws.py): which requests are their calls, and the proxy's own answers
in their error shapes, read back by botocore's own parsers as the SDK reads them."""

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.parsers import JSONParser, QueryParser

from proxy_addon.config import parse_config
from proxy_addon.protocols import routing
from proxy_addon.protocols.aws import AwsJsonCall, AwsQueryCall
from proxy_addon.protocols.base import Call
from proxy_addon.protocols.facts import RequestFacts
from proxy_addon.rules import answers

CONFIG = parse_config("{}")
FORM = "application/x-www-form-urlencoded; charset=utf-8"
SEND = b"Action=SendEmail&Version=2010-12-01&Source=a%40example.com"


def facts(body: bytes = SEND, content_type: str = FORM, signed: bool = True, method: str = "POST", target: str = "") -> RequestFacts:
    url = "https://email.us-east-1.amazonaws.com/"
    req = AWSRequest(method, url, data=body, headers={"Content-Type": content_type, **({"X-Amz-Target": target} if target else {})})
    if signed:
        SigV4Auth(Credentials("AKIAEXAMPLEKEYA00001", "secret"), "ses", "us-east-1").add_auth(req)
    return RequestFacts(method, "https", "email.us-east-1.amazonaws.com", 443, "/", [], list(req.headers.items()), content_type, body)


@pytest.mark.parametrize(
    ("request_facts", "is_query"),
    [
        (facts(), True),
        (facts(b"Action=PutAttributes&Version=2009-04-15&AWSAccessKeyId=AKIA0&Signature=x", signed=False), True),  # SigV2
        (facts(signed=False), False),  # not signed the AWS way: someone else's form
        (facts(b"Action=SendEmail&Source=a"), False),  # no Version
        (facts(b'{"Action": "SendEmail", "Version": "1"}', "application/x-amz-json-1.0"), False),  # no X-Amz-Target
    ],
)
def test_a_signed_form_post_with_action_and_version_is_an_aws_query_call(request_facts, is_query):
    call = routing.recognise(request_facts, CONFIG)
    assert isinstance(call, AwsQueryCall) is is_query
    assert call.journal


@pytest.mark.parametrize(("content_type", "signed", "is_json"), [
    ("application/x-amz-json-1.0", True, True),
    ("application/x-amz-json-1.1", True, True),
    ("application/x-amz-json-1.0", False, False),
    ("application/json", True, False),
])
def test_a_signed_post_with_x_amz_target_is_an_aws_json_call(content_type, signed, is_json):
    call = routing.recognise(facts(b'{"TableName": "t"}', content_type, signed, target="DynamoDB_20120810.UpdateItem"), CONFIG)
    assert isinstance(call, AwsJsonCall) is is_json
    assert not is_json or call.content_type == content_type


@pytest.mark.parametrize(
    ("problem", "code"),
    [
        (answers.duplicate_open("op_1", "submitted"), "DuplicateOpen"),
        (answers.outcome_unknown("op_1", "timed out", None, "outcome_unknown"), "OutcomeUnknown"),
        (answers.duplicate_succeeded("op_1", 200, None), "DuplicateSucceeded"),
    ],
)
@pytest.mark.parametrize(("call", "parser"), [(AwsQueryCall(), QueryParser()), (AwsJsonCall(), JSONParser())])
def test_the_proxys_answers_are_errors_botocore_reads(problem, code, call, parser):
    problem = answers.with_receipt(problem, "op_1", "submitted")
    shaped = call.answer(problem)
    assert shaped.status == problem.status and shaped.header("x-receipt-id") == "op_1"
    parsed = parser.parse(
        {"status_code": shaped.status, "headers": {k.decode(): v.decode() for k, v in shaped.headers}, "body": shaped.body},
        None,
    )
    assert parsed["Error"]["Code"] == code
    assert "op_1" in parsed["Error"]["Message"]


def test_an_upstream_answer_is_left_as_it_is():
    upstream = answers.answer(200, b"<SendEmailResponse/>", {"Content-Type": "text/xml"})
    assert AwsQueryCall().answer(upstream) is upstream
    assert AwsJsonCall().answer(upstream) is upstream
    assert Call().answer(upstream) is upstream
