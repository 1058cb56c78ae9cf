"""The WAN mode: a relay puts a round trip between the proxies and an HTTPS upstream (run.py)."""
