"""A GraphQL server executed by graphql-core (the reference implementation's port), served over HTTP as the
GraphQL-over-HTTP spec has it (POST /graphql, JSON), counting each field it resolves."""

import asyncio
import json
import threading
from collections import Counter
from typing import Any

from graphql import build_schema, graphql
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

SCHEMA = build_schema(
    """
    type Issue { id: ID! title: String! }
    type Query { issues: [Issue!]! }
    type Mutation {
      createIssue(title: String!, delay: Float): Issue!
      login(user: String!, password: String!): Boolean!
    }
    """
)


class IssueTracker:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.issues: list[dict[str, Any]] = []
        self.resolved: Counter[str] = Counter()  # field -> times resolved

    def ran(self, field: str) -> int:
        with self.lock:
            return self.resolved[field]

    def _count(self, field: str) -> None:
        with self.lock:
            self.resolved[field] += 1

    def issues_field(self, _info: Any) -> list[dict[str, Any]]:
        self._count("issues")
        with self.lock:
            return list(self.issues)

    async def create_issue(self, _info: Any, title: str, delay: float | None = None) -> dict[str, Any]:
        self._count("createIssue")
        with self.lock:
            issue = {"id": str(500 + len(self.issues)), "title": title}
            self.issues.append(issue)
        if delay:
            await asyncio.sleep(delay)
        return issue

    def login(self, _info: Any, user: str, password: str) -> bool:
        self._count("login")
        return password == "hunter2"

    def app(self) -> Starlette:
        root = {"issues": self.issues_field, "createIssue": self.create_issue, "login": self.login}

        async def endpoint(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            result = await graphql(
                SCHEMA,
                body["query"],
                root_value=root,
                variable_values=body.get("variables"),
                operation_name=body.get("operationName"),
            )
            return JSONResponse(result.formatted)

        return Starlette(routes=[Route("/graphql", endpoint, methods=["POST"])])
