"""The growth scenario (run.py) and a prune under load on a seeded history (prune_load.py)."""
