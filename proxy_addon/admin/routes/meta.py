"""What the admin server says of itself: its metrics (Prometheus) and its API document (OpenAPI)."""

from flask import Response, current_app

from proxy_addon import metrics
from proxy_addon.admin.openapi import openapi_document
from proxy_addon.admin.routing import Operation, Reply, Routes, admin, json_reply
from proxy_addon.admin.views import json_response

routes = Routes()


@routes.api("GET", "/metrics", Operation(
    "metrics",
    "Prometheus metrics (text exposition format)",
    responses={200: Reply("the metrics", str, "text/plain")},
))
def metrics_endpoint() -> Response:
    body, content_type = metrics.exposition(admin().registry)
    return Response(body, content_type=content_type)


@routes.api("GET", "/openapi.json", Operation(
    "openapi",
    "This document",
    responses={200: json_reply({"type": "object"}, "the OpenAPI document")},
))
def openapi() -> Response:
    return json_response(openapi_document(current_app))
