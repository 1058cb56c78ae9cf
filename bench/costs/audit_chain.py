"""What the audit chain costs a journaled write: the hashes themselves, and the journal writer's CPU per write
with and without them.

    .venv/bin/python bench/costs/audit_chain.py [--writes 4000] [--batch 32] [--runs 3] [--postgres URL]

1. The hashes one write makes (the genesis and the `planned` and `submitted` rows of its record, the verdict's
   row), with details shaped like the proxy's: microseconds per write, in this process.
2. The writer's own batches (journal/writer.py, `JournalWriter.run`): --writes records, then as many verdicts
   with the head each record returned, in batches of --batch, on a fresh SQLite file (and on PostgreSQL with
   --postgres: a throw-away database is created there and dropped): CPU milliseconds per write of this
   process, with the chain, and with its two hash functions replaced by a constant (what the same writes
   cost without it). Each figure is the median of --runs runs.

The chain runs in the journal writer's process, not the proxy's: the proxy's part is carrying one 71-byte
head from the record's answer to the verdict's request. Compare with docs/performance.md's CPU per request.
"""

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: bench.* and its proxy_addon

from proxy_addon.audit import chain
from proxy_addon.journal import rows, writes
from proxy_addon.journal.messages import Advance, Done, Record
from proxy_addon.journal.writer import JournalWriter
from proxy_addon.rules.records import Intent, utcnow

CREATED = {"who": "proxy-1f3a9c", "fingerprint": "sha256:" + "ab" * 32}
VERDICT = {"who": "proxy-1f3a9c", "end": "complete", "status": 201, "error": None, "elapsed_ms": 41.7}


def hashes_of_one_write() -> None:
    now = utcnow()
    identity = chain.Identity("op_" + "0" * 32, "acct:" + "cd" * 32, CREATED["fingerprint"], "POST", "https", "api.example.com", 443, "/api/articles", now)
    head = chain.genesis(identity)
    head = chain.row_hash(head, identity.operation_id, None, "planned", now, CREATED)
    head = chain.row_hash(head, identity.operation_id, "planned", "submitted", now, {"who": CREATED["who"]})
    chain.row_hash(head, identity.operation_id, "submitted", "succeeded", now, VERDICT)


def micro(n: int) -> float:
    """Microseconds of CPU per write for its hashes."""
    start = time.process_time()
    for _ in range(n):
        hashes_of_one_write()
    return (time.process_time() - start) / n * 1e6


def _intent() -> Intent:
    return Intent("articles.create", "POST", "https", "api.example.com", 443, "/api/articles",
                  "sha256:" + uuid.uuid4().hex * 2, "acct:bench", request_body=b'{"title": "t"}', request_body_size=14,
                  proxy_instance="proxy-1f3a9c")


def writer_cpu(url: str, n: int, batch: int) -> float:
    """CPU milliseconds per write (record + verdict) of the writer's batches on `url`."""
    writer = JournalWriter(url, max_batch=batch)
    try:
        intents = [_intent() for _ in range(n)]
        start = time.process_time()
        heads: dict[str, str | None] = {}
        for i in range(0, n, batch):
            part = intents[i : i + batch]
            replies = dict(writer.run([(k, Record(it, None, "proxy-1f3a9c")) for k, it in enumerate(part)]))
            heads.update({it.operation_id: r.head for k, it in enumerate(part) if isinstance((r := replies[k]), Done)})
        for i in range(0, n, batch):
            part = intents[i : i + batch]
            writer.run([(k, Advance(it.operation_id, "submitted", "succeeded", VERDICT, {"status_code": 201}, head=heads[it.operation_id]))
                        for k, it in enumerate(part)])
        return (time.process_time() - start) / n * 1e3
    finally:
        writer.close()


@contextmanager
def without_chain() -> Iterator[None]:
    """The writes' two hash functions replaced by a constant, for the same writes' cost without the chain."""
    saved = writes.genesis, rows.genesis, rows.row_hash
    constant: Callable[..., str] = lambda *_a, **_k: "sha256:" + "0" * 64  # noqa: E731
    writes.genesis, rows.genesis, rows.row_hash = constant, constant, constant  # type: ignore[assignment]
    try:
        yield
    finally:
        writes.genesis, rows.genesis, rows.row_hash = saved


@contextmanager
def database(kind: str, postgres: str | None) -> Iterator[str]:
    from alembic import command

    from proxy_addon.db import alembic_config

    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            command.upgrade(alembic_config(url), "head")
            yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from support.pg import fresh_database

    assert postgres is not None
    with fresh_database(postgres, prefix="receipts_bench") as url:
        command.upgrade(alembic_config(url), "head")
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--postgres", help="a PostgreSQL server URL to measure on too")
    args = parser.parse_args()
    print(f"hashes of one write: {statistics.median(micro(20000) for _ in range(args.runs)):.1f} us of CPU")
    for kind in ["sqlite", *(["postgresql"] if args.postgres else [])]:
        figures: dict[str, list[float]] = {"with": [], "without": []}
        for _ in range(args.runs):
            for label in ("with", "without"):
                with database(kind, args.postgres) as url:
                    if label == "with":
                        figures[label].append(writer_cpu(url, args.writes, args.batch))
                    else:
                        with without_chain():
                            figures[label].append(writer_cpu(url, args.writes, args.batch))
        w, wo = (statistics.median(figures[k]) for k in ("with", "without"))
        print(f"{kind}: writer CPU per write (record + verdict) {w:.3f} ms with the chain, {wo:.3f} ms without: {w - wo:+.3f} ms")


if __name__ == "__main__":
    main()
