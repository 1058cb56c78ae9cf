"""Test bodies that are the same on every run: a test that fails, fails again."""

import random


def binary(size: int, seed: int = 0) -> bytes:
    """`size` bytes that look random but are the same on every run, and that nothing takes for JSON: they start with
    0x89 (as a PNG does), never with `{`, `[` or whitespace (os.urandom starts a body with `{` or `[` in 1 run of 128)."""
    assert size >= 1
    return b"\x89" + random.Random(seed).randbytes(size - 1)
