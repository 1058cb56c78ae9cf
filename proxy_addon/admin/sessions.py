"""Who is logged in to the admin server: the token, sent as `Authorization: Bearer`, or the login cookie that
/login sets once the token is typed in. See the package docstring.

The login cookie is a session of this server: `<issued>.<id>.<mac>`, signed with a key made when the server
starts and bound to the token (a restart, or another token, ends every session). It expires
SESSION_LIFETIME after login, and logout ends it for good: its id is kept as revoked until it would have
expired. Never the token, nor anything derived from the token alone. After login the browser goes back to
`next` only when that is a path on this server (`safe_next`).
"""

import hashlib
import hmac
import secrets
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from flask import Request

LOGIN_COOKIE = "receipts_admin"
SESSION_LIFETIME = 12 * 3600  # seconds a login lasts


class LoginSessions:
    """Login cookies: signed with a key of this server's own (bound to the token), with an issue time, and
    revocable. `now` is injectable for tests."""

    def __init__(self, token: str, lifetime: float = SESSION_LIFETIME, now: Any = time.time):
        self._key = hmac.new(secrets.token_bytes(32), token.encode(), hashlib.sha256).digest()
        self.lifetime, self._now = lifetime, now
        self._revoked: dict[str, float] = {}  # session id -> when it would have expired
        self._lock = threading.Lock()

    def _mac(self, issued: str, sid: str) -> str:
        return hmac.new(self._key, f"{issued}.{sid}".encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        issued, sid = str(int(self._now())), secrets.token_hex(16)
        return f"{issued}.{sid}.{self._mac(issued, sid)}"

    def _parts(self, cookie: str) -> tuple[float, str] | None:
        """(issued, id) of a cookie this server signed, else None."""
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        issued, sid, mac = parts
        if not hmac.compare_digest(mac, self._mac(issued, sid)):
            return None
        return float(issued), sid

    def valid(self, cookie: str) -> bool:
        parts = self._parts(cookie)
        if parts is None:
            return False
        issued, sid = parts
        now = self._now()
        with self._lock:
            revoked = sid in self._revoked
        return not revoked and issued <= now + 60 and now - issued < self.lifetime

    def revoke(self, cookie: str) -> None:
        parts = self._parts(cookie)
        if parts is None:
            return
        issued, sid = parts
        now = self._now()
        with self._lock:
            self._revoked = {k: until for k, until in self._revoked.items() if until > now}  # forget the expired
            self._revoked[sid] = issued + self.lifetime


def safe_next(target: str | None) -> str:
    """`next` when it is a path on this server, else `/`. Browsers drop tabs and line breaks from URLs and
    read `\\` as `/`, so `/%09/evil.example` or `/\\evil` would leave the site: anything but a plain path
    is refused."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    if any(c in target for c in "\\\t\r\n") or not target.isprintable() or any(c.isspace() for c in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or urlsplit("http://x" + target).netloc != "x":
        return "/"
    return target


class Login:
    """The token of the admin server (None: none is configured, everyone is logged in) and its login sessions."""

    def __init__(self, token: str | None):
        self.token = token
        self.sessions = LoginSessions(token) if token is not None else None

    def token_matches(self, sent: str) -> bool:
        return self.token is not None and hmac.compare_digest(sent.strip().encode(), self.token.encode())

    def allows(self, request: Request) -> bool:
        """No token is configured, or the request carries it (Bearer) or a valid login cookie."""
        if self.token is None:
            return True
        header = request.headers.get("Authorization", "")
        if header.startswith("Bearer ") and self.token_matches(header[7:]):
            return True
        cookie = request.cookies.get(LOGIN_COOKIE, "")
        return bool(cookie) and self.sessions is not None and self.sessions.valid(cookie)
