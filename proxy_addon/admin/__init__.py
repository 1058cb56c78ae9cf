"""The admin HTTP server: a JSON API for agents and tools, a review page for people, and /metrics.

Off by default (`admin.enabled`); the proxy starts it in its `running` hook, `receipts admin` serves it alone.
It listens on 127.0.0.1 unless told otherwise, and the config refuses another address without a token.

- With a token (from the environment variable `admin.token_env`): every request needs `Authorization: Bearer
  TOKEN`, or the login cookie that /login sets after the token is typed in.
- Without one (loopback only): requests must name a loopback Host, so that a web page cannot reach the server
  through a DNS name of its own that resolves to 127.0.0.1.
- A form POST needs the per-session CSRF token of the page it came from, and an Origin (or Referer), when
  the browser sends one, of this server; the JSON API's POST needs `Content-Type: application/json`, which a
  cross-site form cannot send.
Pages are Jinja2 templates with autoescape: everything shown is escaped.
"""
