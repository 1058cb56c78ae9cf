"""AWS's RPC protocols: the proxy's own answers in the error shape an AWS SDK reads.

- **query** (SES, SNS, STS, IAM, CloudFormation, SQS's older protocol...): a signed form POST with an `Action`
  and a `Version`; errors are `<ErrorResponse><Error><Code>` XML. Given the proxy's problem+json instead,
  botocore raises `ResponseParserError` ("invalid XML received. Further retries may succeed"), which tells
  neither the program nor a model reading the error what happened, and invites the retry the proxy refuses.
- **JSON** (DynamoDB, SQS, Kinesis, Lambda's control plane...): a signed POST with `X-Amz-Target`; errors are
  `{"__type": Code, "message": ...}`. Given problem+json, the SDK's error code is the bare status ("409").

A rule's `call` names an AWS call by its operation: the `X-Amz-Target`'s last part (`PutItem`), or the query's
`Action` (`SendEmail`); the receipt's operation name is then the rule's.

Either way `Code` is the problem's kind in the SDK's casing (`DuplicateOpen`, `OutcomeUnknown`...), the message
says which receipt and what the agent may do, and the status and the `X-Receipt-*` headers stay. Identity,
operation names and verdicts are REST's. REST-style services (S3, API Gateway) read the status as the error.
"""

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from proxy_addon.protocols.base import Call, problem_of, receipt_headers
from proxy_addon.rules import answers
from proxy_addon.rules.answers import Answer
from proxy_addon.rules.policy import HostPolicy

if TYPE_CHECKING:
    from proxy_addon.protocols.base import Route
    from proxy_addon.protocols.facts import RequestFacts

NAME = "aws"
OPERATION_PREFIX = "aws "  # not given: an AWS call keeps REST's operation name
FORM = "application/x-www-form-urlencoded"
MAX_FORM = 1024 * 1024  # a larger form is not read for its Action: answered in problem+json
JSON_TYPES = ("application/x-amz-json-1.0", "application/x-amz-json-1.1")


def error_code(kind: str) -> str:
    """A problem's kind as AWS names errors: `duplicate-open` -> `DuplicateOpen`."""
    return "".join(part.capitalize() for part in kind.split("-"))


@dataclass(frozen=True)
class AwsQueryCall(Call):
    """A write to an AWS query service: REST in all but the shape of the proxy's own answers."""

    protocol: str = NAME

    def answer(self, answer: Answer) -> Answer:
        problem = problem_of(answer)
        if problem is None:
            return answer
        side = "Sender" if problem.status < 500 else "Receiver"
        body = (
            "<ErrorResponse><Error>"
            f"<Type>{side}</Type><Code>{error_code(problem.kind)}</Code><Message>{escape(problem.sentence())}</Message>"
            f"</Error><RequestId>{escape(problem.operation_id or '')}</RequestId></ErrorResponse>"
        ).encode()
        headers = {"Content-Type": "text/xml", "Cache-Control": "no-store", **receipt_headers(answer)}
        return answers.answer(problem.status, body, headers)


@dataclass(frozen=True)
class AwsJsonCall(Call):
    """A write to an AWS JSON service: REST in all but the shape of the proxy's own answers."""

    protocol: str = NAME
    content_type: str = JSON_TYPES[0]  # the request's own version of the protocol

    def answer(self, answer: Answer) -> Answer:
        problem = problem_of(answer)
        if problem is None:
            return answer
        body = json.dumps({"__type": error_code(problem.kind), "message": problem.sentence()}).encode()
        headers = {"Content-Type": self.content_type, "Cache-Control": "no-store", **receipt_headers(answer)}
        return answers.answer(problem.status, body, headers)


def recognise(facts: "RequestFacts", route: "Route", policy: HostPolicy) -> Call | None:
    """A POST signed the AWS way (SigV4 in the header, or SigV2 in the form) that is an AWS JSON call (its
    `X-Amz-Target`) or a query call (a form with an `Action` and a `Version`), named by its operation. Anything
    else: None."""
    if facts.method != "POST":
        return None
    mime = (facts.content_type or "").split(";")[0].strip().lower()
    sigv4 = any(n.lower() == "authorization" and v.lstrip().upper().startswith("AWS4-") for n, v in facts.headers)
    target = next((v for n, v in facts.headers if n.lower() == "x-amz-target"), None)
    if mime in JSON_TYPES and sigv4 and target is not None:
        return AwsJsonCall(content_type=mime, name=target.rpartition(".")[2] or None)
    if mime != FORM or len(facts.body) > MAX_FORM:
        return None
    try:
        fields = dict(parse_qsl(facts.body.decode("utf-8"), keep_blank_values=True))
    except (UnicodeDecodeError, ValueError):
        return None
    signed = sigv4 or "AWSAccessKeyId" in fields
    return AwsQueryCall(name=fields["Action"] or None) if signed and {"Action", "Version"} <= fields.keys() else None


def read_headers(body: Any) -> dict[str, str] | None:
    return None
