"""The loopback benchmark: direct, mitmdump and the receipts proxy side by side on 127.0.0.1 (run.py)."""
