"""The five targets the benchmark gives the same load, in report order."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    kind: str  # direct | mitmdump | receipts
    db: str | None = None
    proxies: int = 1  # receipts proxies on the one database; the load at each level is split across them

    @property
    def growth(self) -> bool:
        """Whether the --growth scenario repeats it: the single-proxy receipts targets."""
        return self.kind == "receipts" and self.proxies == 1


TARGETS = {
    "direct": Target("direct", "(a) direct", "direct"),
    "mitmdump": Target("mitmdump", "(b) mitmdump", "mitmdump"),
    "sqlite": Target("sqlite", "(c) receipts SQLite", "receipts", "sqlite"),
    "postgres": Target("postgres", "(d) receipts PostgreSQL", "receipts", "postgres"),
    "postgres-2": Target("postgres-2", "(e) 2 receipts on PostgreSQL", "receipts", "postgres", proxies=2),
}
RECEIPTS_TARGETS = tuple(key for key, target in TARGETS.items() if target.kind == "receipts")
