"""The state machine against the contract's own list (CONTRACT.md, "States"), written out here by hand: the
table in rules/states.py cannot be its own oracle."""

import itertools

import pytest

from proxy_addon.rules.states import (
    ALLOWED_TRANSITIONS,
    IN_FLIGHT_STATES,
    OPEN_STATES,
    RESOLUTION_STATES,
    RESOLVABLE_STATES,
    TERMINAL_STATES,
    State,
    is_allowed,
)

# Copied from CONTRACT.md, "States"; never built from ALLOWED_TRANSITIONS.
STATES = ["planned", "submitted", "succeeded", "rejected", "outcome_unknown", "reconciling", "safe_to_retry", "manual_review"]
CONTRACT_TRANSITIONS = {
    ("planned", "submitted"), ("planned", "rejected"),
    ("submitted", "succeeded"), ("submitted", "rejected"), ("submitted", "outcome_unknown"),
    ("outcome_unknown", "reconciling"), ("outcome_unknown", "manual_review"), ("outcome_unknown", "succeeded"),
    ("outcome_unknown", "safe_to_retry"),
    ("reconciling", "succeeded"), ("reconciling", "safe_to_retry"), ("reconciling", "manual_review"),
    ("reconciling", "outcome_unknown"),
    ("manual_review", "succeeded"), ("manual_review", "safe_to_retry"),
}
TERMINAL = {"succeeded", "rejected", "safe_to_retry"}
PAIRS = list(itertools.product(STATES, STATES))


def test_the_states_are_the_contracts():
    assert sorted(s.value for s in State) == sorted(STATES)


@pytest.mark.parametrize("src, dst", PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_a_transition_is_allowed_exactly_when_the_contract_lists_it(src, dst):
    assert is_allowed(State(src), State(dst)) is ((src, dst) in CONTRACT_TRANSITIONS)
    assert (State(dst) in ALLOWED_TRANSITIONS[State(src)]) is ((src, dst) in CONTRACT_TRANSITIONS)


@pytest.mark.parametrize("dst", STATES)
def test_a_receipt_is_created_planned_and_in_no_other_state(dst):
    assert is_allowed(None, State(dst)) is (dst == "planned")


def test_terminal_and_open_states_are_the_contracts():
    assert {s.value for s in TERMINAL_STATES} == TERMINAL
    assert {s.value for s in OPEN_STATES} == set(STATES) - TERMINAL
    assert not any(src in TERMINAL for src, _ in CONTRACT_TRANSITIONS)  # the contract's own list agrees with itself
    assert {s.value for s in IN_FLIGHT_STATES} == {"planned", "submitted"}


def test_a_persons_resolve_settles_what_the_contract_says():
    """`resolve` (by a person): outcome_unknown or manual_review, into succeeded or safe_to_retry."""
    assert {s.value for s in RESOLVABLE_STATES} == {"outcome_unknown", "manual_review"}
    assert {s.value for s in RESOLUTION_STATES} == {"succeeded", "safe_to_retry"}
    assert all((src.value, dst.value) in CONTRACT_TRANSITIONS for src in RESOLVABLE_STATES for dst in RESOLUTION_STATES)
