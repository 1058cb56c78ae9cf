"""Prometheus metrics (metrics.py): every series present from the start, the counters counting where they are
called, and the store's gauges read at scrape time (`receipts_store_up` 0, and nothing else, when the store does
not answer). Through a real proxy: e2e/test_metrics.py."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy_addon import metrics
from proxy_addon.exceptions import JournalUnavailableError
from proxy_addon.rules.records import JournalStats
from proxy_addon.rules.states import RefusalReason, State


def samples(registry) -> dict[tuple[str, tuple], float]:
    body, content_type = metrics.exposition(registry)
    assert content_type.startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def stats(**by_state: int) -> JournalStats:
    return JournalStats({s.value: by_state.get(s.value, 0) for s in State}, {}, None)


def test_every_counter_series_exists_before_anything_happened():
    got = samples(metrics.registry_for(None))
    for s in State:
        assert ("receipts_transitions_total", (("to_state", s.value),)) in got
    for r in RefusalReason:
        assert ("receipts_duplicates_total", (("reason", r.value),)) in got
    for s in ("succeeded", "safe_to_retry", "manual_review", "outcome_unknown"):
        assert ("receipts_reconcile_verdicts_total", (("state", s),)) in got
    for cause in ("died", "unresponsive"):
        assert ("receipts_journal_writer_restarts_total", (("cause", cause),)) in got
    assert not any(name.startswith(("receipts_store_up", "receipts_by_state")) for name, _ in got)  # no store given


def test_the_counters_count_where_they_are_called():
    registry = metrics.registry_for(None)
    before = samples(registry)
    metrics.transitioned(State.OUTCOME_UNKNOWN)
    metrics.transitioned("succeeded")
    metrics.duplicate_refused(RefusalReason.DUPLICATE_OPEN)
    metrics.reconcile_verdict(State.SAFE_TO_RETRY)
    metrics.journaled(0.003)
    after = samples(registry)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("receipts_transitions_total", to_state="outcome_unknown") == 1
    assert grew("receipts_transitions_total", to_state="succeeded") == 1
    assert grew("receipts_transitions_total", to_state="rejected") == 0
    assert grew("receipts_duplicates_total", reason="duplicate_open") == 1
    assert grew("receipts_reconcile_verdicts_total", state="safe_to_retry") == 1
    assert grew("receipts_journal_seconds_count") == 1
    assert grew("receipts_journal_seconds_bucket", le="0.0025") == 0 and grew("receipts_journal_seconds_bucket", le="0.005") == 1


def test_the_stores_gauges_are_read_at_scrape_time():
    held = {"stats": stats(submitted=2, outcome_unknown=1)}
    registry = metrics.registry_for(lambda: held["stats"])
    got = samples(registry)
    assert got[("receipts_store_up", ())] == 1
    assert got[("receipts_by_state", (("state", "submitted"),))] == 2
    assert got[("receipts_by_state", (("state", "succeeded"),))] == 0  # every state, 0 included
    assert got[("receipts_oldest_open_age_seconds", ())] == 0  # none known: 0, not absent
    held["stats"] = JournalStats(stats(outcome_unknown=4).by_state, {}, 12.5)
    got = samples(registry)
    assert got[("receipts_by_state", (("state", "outcome_unknown"),))] == 4 and got[("receipts_by_state", (("state", "submitted"),))] == 0
    assert got[("receipts_oldest_open_age_seconds", ())] == 12.5


def test_a_store_that_does_not_answer_is_up_0_and_nothing_else():
    def down() -> JournalStats:
        raise JournalUnavailableError("database is locked")

    got = samples(metrics.registry_for(down))
    assert got[("receipts_store_up", ())] == 0
    assert not any(name.startswith(("receipts_by_state", "receipts_oldest_open")) for name, _ in got)


def test_registering_the_store_collector_does_not_query_the_store():
    def never() -> JournalStats:
        raise AssertionError("queried at registration")

    metrics.registry_for(never)  # auto_describe: describe() must not call collect()


def test_an_error_that_is_not_the_stores_is_not_swallowed():
    def broken() -> JournalStats:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        samples(metrics.registry_for(broken))


def test_the_write_counter_s_host_label_is_bounded():
    """An agent writing to ever new hosts cannot grow the series without bound: after HOST_LABELS hosts, `other`."""
    labels = metrics._HostLabels(3)
    assert [labels(h) for h in ("a", "b", "a", "c", "d", "e", "b")] == ["a", "b", "a", "c", "other", "other", "b"]


def test_the_store_s_other_gauges_are_read_at_scrape_time():
    held = {"ratio": 0.25}
    reads = metrics.StoreReads(
        stats=lambda: JournalStats(stats(outcome_unknown=1).by_state, {}, 90.0, {"outcome_unknown": 90.0, "submitted": 2.0}),
        approval_wait_ratio=lambda: held["ratio"],
        instances=lambda: {"live": 2, "lost": 1},
    )
    registry = metrics.registry_for(reads)
    got = samples(registry)
    assert got[("receipts_oldest_age_seconds", (("state", "outcome_unknown"),))] == 90.0
    assert got[("receipts_oldest_age_seconds", (("state", "manual_review"),))] == 0  # every open state, 0 included
    assert not any(dict(labels).get("state") == "succeeded" for name, labels in got if name == "receipts_oldest_age_seconds")
    assert got[("receipts_approval_wait_ratio", ())] == 0.25
    assert got[("receipts_proxy_instances", (("status", "live"),))] == 2 and got[("receipts_proxy_instances", (("status", "lost"),))] == 1
    held["ratio"] = 1.5
    assert samples(registry)[("receipts_approval_wait_ratio", ())] == 1.5
    for table in ("receipts", "duplicate_refusals", "approvals", "verifier_controls"):  # served, from the start
        assert ("receipts_pruned_total", (("table", table),)) in got
    for action in ("refused", "forwarded"):
        assert ("receipts_journal_unavailable_total", (("action", action),)) in got
