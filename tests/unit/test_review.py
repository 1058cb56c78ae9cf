"""What a person does with a receipt and what the system can prove about it (views/review.py), on a real SQLite
journal: `resolve`'s checks and what it writes, the one sentence `what_happened` says for each way a receipt ends,
and `proof`'s evidence and refusals. The API and the page around them: test_admin.py."""

from collections.abc import Iterator

import pytest
from support.e2e import migrate
from support.store import S, intent, recorded, walk

from proxy_addon.config import parse_config
from proxy_addon.db import make_engine
from proxy_addon.exceptions import InvalidResolutionError, NotResolvableError, ReceiptNotFoundError
from proxy_addon.rules.states import RefusalReason
from proxy_addon.store import ReceiptStore
from proxy_addon.views import review

CONFIG = parse_config("hosts: {}")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[ReceiptStore]:
    """One migrated SQLite file for the module: every test makes receipts of its own (fresh fingerprints)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('review') / 'receipts.db'}"
    migrate(url)
    engine = make_engine(url)
    yield ReceiptStore(engine)
    engine.dispose()


def at(store: ReceiptStore, state: S, **updates) -> str:
    op = recorded(store, intent()).operation_id
    walk(store, op, state, **updates)
    return op


def said(store: ReceiptStore, op: str) -> str:
    return review.what_happened(store.receipts.get(op), store.receipts.history(op))


# -- resolve ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["rejected", "outcome_unknown", "manual_review", "bogus", ""])
def test_only_succeeded_or_safe_to_retry_is_a_resolution(store, state):
    op = at(store, S.MANUAL_REVIEW)
    with pytest.raises(InvalidResolutionError, match="safe_to_retry, succeeded"):
        review.resolve(store, op, state, "checked")
    assert store.receipts.get(op).state == "manual_review"


@pytest.mark.parametrize("note", ["", "   ", "\n\t", None])
def test_a_resolution_needs_a_note(store, note):
    op = at(store, S.OUTCOME_UNKNOWN)
    with pytest.raises(InvalidResolutionError, match="note is required"):
        review.resolve(store, op, "succeeded", note)
    assert store.receipts.get(op).state == "outcome_unknown"


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.REJECTED, S.SAFE_TO_RETRY, S.SUBMITTED, S.RECONCILING])
def test_only_manual_review_or_outcome_unknown_can_be_resolved(store, state):
    """A settled receipt keeps its verdict; an in-flight or reconciling one is someone else's to settle."""
    op = at(store, state)
    with pytest.raises(NotResolvableError, match=f"is {state.value}"):
        review.resolve(store, op, "safe_to_retry", "checked")
    assert store.receipts.get(op).state == state.value


def test_an_unknown_receipt_is_not_found(store):
    with pytest.raises(ReceiptNotFoundError):
        review.resolve(store, "op_nope", "succeeded", "checked")


def test_a_resolution_is_kept_in_the_history_with_who_and_the_external_id_and_ends_any_lease(store):
    op = at(store, S.OUTCOME_UNKNOWN, lease_owner="worker-1")
    before, after = review.resolve(store, op, "succeeded", "found it in the dashboard", "  inv_42 ", who="alice")
    assert (before.state, after.state, after.external_id, after.lease_owner) == ("outcome_unknown", "succeeded", "inv_42", None)
    assert after.completed_at is not None
    last = store.receipts.history(op)[-1]
    assert (last.from_state, last.to_state) == ("outcome_unknown", "succeeded")
    assert last.detail == {"who": "person:alice", "note": "found it in the dashboard", "external_id": "inv_42",
                           "verdict": "succeeded"}


def test_a_blank_external_id_leaves_the_one_the_receipt_has(store):
    op = at(store, S.MANUAL_REVIEW, external_id="ch_1")
    _, after = review.resolve(store, op, "safe_to_retry", "not there", "   ")
    assert after.external_id == "ch_1" and store.receipts.history(op)[-1].detail["external_id"] is None


# -- what_happened ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "updates", "sentence"),
    [
        (S.PLANNED, {}, "The request was journaled but has not been sent."),
        (S.SUBMITTED, {}, "The request was sent upstream; no answer is recorded yet."),
        (S.SUCCEEDED, {"status_code": 201, "external_id": "art_7"}, "The upstream accepted it (status 201), external id art_7."),
        (S.SUCCEEDED, {}, "The upstream accepted it."),
        (S.REJECTED, {"error_code": "not_sent"}, "It was never sent: nothing reached the upstream."),
        (S.REJECTED, {"status_code": 422, "error_code": "upstream_status"},
         "The upstream refused it (status 422); it did not take effect."),
        (S.OUTCOME_UNKNOWN, {"status_code": 503}, "The upstream may or may not have acted (status 503); the reconciler will"),
        (S.OUTCOME_UNKNOWN, {"error_code": "upstream_timeout"}, "may or may not have acted (upstream_timeout)"),
        (S.OUTCOME_UNKNOWN, {}, "may or may not have acted (no answer)"),
        (S.RECONCILING, {}, "A reconciliation worker is reading the upstream now"),
        (S.SAFE_TO_RETRY, {}, "A read of the upstream showed it did not take effect: it is safe to retry."),
        (S.MANUAL_REVIEW, {}, "The system could not prove what happened; a person must decide."),
    ],
)
def test_what_happened_in_one_sentence(store, state, updates, sentence):
    assert sentence in said(store, at(store, state, **updates))


def test_a_reconciler_that_found_it_and_a_person_who_settled_it_are_told_apart(store):
    found = at(store, S.RECONCILING)
    store.receipts.transition(found, S.RECONCILING, S.SUCCEEDED, {"who": "worker-1"}, external_id="x_1")
    assert said(store, found) == "The reconciler found it upstream: it took effect, external id x_1."
    settled = at(store, S.MANUAL_REVIEW)
    review.resolve(store, settled, "succeeded", "seen in the vendor's console", who="bob")
    assert said(store, settled) == "A person settled it as succeeded: seen in the vendor's console"
    not_done = at(store, S.OUTCOME_UNKNOWN)
    review.resolve(store, not_done, "safe_to_retry", "not in the list")
    assert said(store, not_done) == "A person settled it as not done, safe to retry: not in the list"


def test_manual_review_says_the_reason_its_history_gives(store):
    op = at(store, S.RECONCILING)
    store.receipts.transition(op, S.RECONCILING, S.MANUAL_REVIEW, {"who": "worker-1", "reason": "3 reads failed"})
    assert said(store, op) == "The system could not prove what happened; a person must decide (3 reads failed)."


# -- proof --------------------------------------------------------------------------------------------------------


def test_proof_of_an_open_receipt_proves_nothing_and_a_retry_is_refused(store):
    op = at(store, S.OUTCOME_UNKNOWN, error_code="upstream_timeout")
    got = review.proof(store, CONFIG, op)
    assert (got["open"], got["proven"], got["state"], got["error_code"]) == (True, False, "outcome_unknown", "upstream_timeout")
    assert got["retry"]["decision"] == "refused" and got["retry"]["blocking_operation_id"] == op
    assert [e["to_state"] for e in got["evidence"]] == ["outcome_unknown"]  # not planned, not submitted


def test_proof_keeps_only_the_verdicts_as_evidence_and_counts_the_refused_repeats(store):
    i = intent()
    op = recorded(store, i).operation_id
    walk(store, op, S.RECONCILING)
    store.receipts.transition(op, S.RECONCILING, S.SAFE_TO_RETRY, {"who": "worker-1"})
    store.refusals.record(RefusalReason.DUPLICATE_OPEN, op, i, "proxy-1")
    store.refusals.record(RefusalReason.DUPLICATE_OPEN, op, i, "proxy-1")
    store.refusals.record(RefusalReason.DUPLICATE_OPEN, at(store, S.SUBMITTED), intent(), "proxy-1")  # another's
    got = review.proof(store, CONFIG, op)
    assert [e["to_state"] for e in got["evidence"]] == ["outcome_unknown", "safe_to_retry"]  # reconciling is a lease
    assert got["duplicates_refused"] == 2 and (got["open"], got["proven"]) == (False, True)
    assert got["retry"]["decision"] == "forwarded" and got["retry"]["blocking_operation_id"] is None


def test_proof_of_a_success_says_a_retry_is_replayed_until_its_window_ends(store):
    op = at(store, S.SUCCEEDED, status_code=201, response_headers=[["content-type", "application/json"]],
            response_body=b"{}")
    got = review.proof(store, CONFIG, op)
    receipt = store.receipts.get(op)
    assert got["retry"]["decision"] == "replayed" and got["retry"]["status"] == 201
    assert got["retry"]["until"] is not None and got["retry"]["until"] > receipt.completed_at
    assert got["what_happened"] == "The upstream accepted it (status 201)."
