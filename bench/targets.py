"""The four targets the benchmark gives the same load, in report order."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    kind: str  # direct | mitmdump | receipts
    db: str | None = None


TARGETS = {
    "direct": Target("direct", "(a) direct", "direct"),
    "mitmdump": Target("mitmdump", "(b) mitmdump", "mitmdump"),
    "sqlite": Target("sqlite", "(c) receipts SQLite", "receipts", "sqlite"),
    "postgres": Target("postgres", "(d) receipts PostgreSQL", "receipts", "postgres"),
}
