"""Which agent made each write, as the store keeps it (column `receipts.agent`, migration 0010) and lists it: one
agent's receipts, the anonymous ones, or everyone's, in pages; on SQLite and PostgreSQL."""

import pytest
from support.store import intent

from proxy_addon.rules.records import ANY_AGENT
from proxy_addon.rules.states import RefusalReason
from proxy_addon.store import ReceiptStore


@pytest.fixture
def journaled(store: ReceiptStore) -> dict[str | None, list[str]]:
    """Receipts of `billing`, `support` and anonymous agents, interleaved, oldest first; their ids by agent."""
    made: dict[str | None, list[str]] = {"billing": [], "support": [], None: []}
    for i in range(9):
        agent = ("billing", "support", None)[i % 3]
        new = intent(agent=agent, proxy_instance="proxy-test")
        store.receipts.record_and_submit(new, None, "proxy-test")
        made[agent].append(new.operation_id)
    return made


def ids(rows) -> list[str]:
    return [r.operation_id for r in rows]


def test_a_receipt_keeps_its_agent_and_its_creation_row_names_it(store, journaled):
    billing = store.receipts.get(journaled["billing"][0])
    anonymous = store.receipts.get(journaled[None][0])
    assert (billing.agent, anonymous.agent) == ("billing", None)
    created = store.receipts.history(billing.operation_id)[0]
    assert created.to_state == "planned" and created.detail["agent"] == "billing"  # hashed into the audit chain
    assert "agent" not in store.receipts.history(anonymous.operation_id)[0].detail


def test_the_list_is_one_agents_the_anonymous_ones_or_everyones(store, journaled):
    newest_first = {agent: list(reversed(made)) for agent, made in journaled.items()}
    assert ids(store.receipts.list(agent="billing")) == newest_first["billing"]
    assert ids(store.receipts.list(agent=None)) == newest_first[None]
    assert len(store.receipts.list(agent=ANY_AGENT)) == len(store.receipts.list()) == 9
    assert store.receipts.list(agent="nobody") == []
    page = store.receipts.list(agent="support", limit=2)
    assert ids(page) == newest_first["support"][:2]
    assert ids(store.receipts.list(agent="support", after=page[-1].operation_id)) == newest_first["support"][2:]


def test_a_refused_duplicate_names_the_agent_refused(store, journaled):
    blocker = store.receipts.get(journaled["billing"][0])
    repeat = intent(blocker.intent_fingerprint, blocker.account, agent="support")
    refusal = store.refusals.record(RefusalReason.DUPLICATE_OPEN, blocker.operation_id, repeat, "proxy-test")
    assert refusal.agent == "support"
    assert [r.agent for r in store.refusals.list(blocking_operation_id=blocker.operation_id)] == ["support"]
