"""Logging in with the admin token (a login cookie, admin/sessions.py) and logging out; without a token both
just send the browser on."""

from typing import Any

from flask import redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from proxy_addon.admin.routing import Routes, admin
from proxy_addon.admin.sessions import LOGIN_COOKIE, LoginSessions, safe_next

routes = Routes()


def logged_in(target: str, sessions: LoginSessions) -> Response:
    """Back to `target`, with a new login cookie."""
    response = redirect(target, code=303)
    response.set_cookie(
        LOGIN_COOKIE,
        sessions.issue(),
        max_age=int(sessions.lifetime),
        httponly=True,
        samesite="Strict",
        secure=request.is_secure,
    )
    return response


@routes.page("/login", "GET", "POST")
def login() -> Any:
    target = safe_next(request.values.get("next"))
    sessions = admin().login.sessions
    if sessions is None:
        return redirect(target)
    error = None
    if request.method == "POST":
        if admin().login.token_matches(request.form.get("token", "")):
            return logged_in(target, sessions)
        error = "That is not the admin token."
    return render_template("login.html", next=target, error=error), 401 if error else 200


@routes.page("/logout", "POST")
def logout() -> Any:
    sessions = admin().login.sessions
    if sessions is not None:
        sessions.revoke(request.cookies.get(LOGIN_COOKIE, ""))
    response = redirect(url_for("login"), code=303)
    response.delete_cookie(LOGIN_COOKIE)
    return response
