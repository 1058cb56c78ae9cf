"""Hostile inputs: what the worst bodies cost (run.py)."""
