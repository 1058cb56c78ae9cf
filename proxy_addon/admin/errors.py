"""The admin app's error answers: problem+json for the API, a message page for people."""

from typing import Any

from flask import Flask, render_template, request

from proxy_addon.admin.views import is_page, problem, status_of
from proxy_addon.exceptions import ReceiptsError


def not_found(_e: Any) -> Any:
    if is_page(request.path):
        return render_template("message.html", title="Not found", message=f"Nothing at {request.path}."), 404
    return problem(404, "not-found", "Not found", f"nothing at {request.path}")


def not_allowed(_e: Any) -> Any:
    return problem(405, "method-not-allowed", "Method not allowed", f"{request.method} is not allowed here")


def receipts_error(e: ReceiptsError) -> Any:
    status, kind = status_of(e)
    if is_page(request.path):
        return render_template("message.html", title="Error", message=str(e)), status
    return problem(status, kind, kind.replace("-", " ").capitalize(), str(e))


def install(app: Flask) -> None:
    app.register_error_handler(404, not_found)
    app.register_error_handler(405, not_allowed)
    app.register_error_handler(ReceiptsError, receipts_error)
