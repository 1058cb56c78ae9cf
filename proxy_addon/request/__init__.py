"""The request path, without mitmproxy: journal a write, send it upstream once, answer."""
