"""local/packing.py: the length-sorted, token-budget plan of a part's batches (pure)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from embedserve.local.packing import length_order, plan_batches


def test_length_order_sorts_longest_first_inside_each_window_only():
    lengths = np.array([1, 5, 3, 9, 2, 2, 7])
    order = length_order(lengths, window=3)
    assert order.tolist() == [1, 2, 0, 3, 4, 5, 6]  # windows [0..2], [3..5], [6]: ties keep input order


def test_batches_fill_the_budget_and_a_long_document_runs_alone():
    lengths = np.array([10, 10, 10, 10, 100, 10])
    batches = plan_batches(lengths, token_budget=30, max_sequences=8, window=6)
    assert [b.tolist() for b in batches] == [[4], [0, 1, 2], [3, 5]]


def test_sequence_cap():
    batches = plan_batches(np.ones(10, np.int64), token_budget=1000, max_sequences=4, window=10)
    assert [len(b) for b in batches] == [4, 4, 2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 600), max_size=300), st.integers(1, 2048), st.integers(1, 64),
       st.integers(1, 400))
def test_every_document_once_within_budget_and_cap(lengths, budget, cap, window):
    lengths = np.array(lengths, dtype=np.int64)
    batches = plan_batches(lengths, budget, cap, window)
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= cap
        assert len(batch) == 1 or lengths[batch].sum() <= budget
    # The plan is a function of the lengths alone (resumed runs redo parts identically).
    again = plan_batches(lengths.copy(), budget, cap, window)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
