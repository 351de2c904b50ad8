"""The foundation planner: correct best-fit decreasing and the CSR plan contract."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer._ranges import concat_ranges
from packer.pack import ALGORITHMS, plan


def check_plan(p, lengths, capacity):
    assert p.offsets[0] == 0 and np.all(np.diff(p.offsets) >= 1)
    assert sorted(p.indices.tolist()) == list(range(len(lengths)))  # every sample exactly once
    assert np.all(p.bin_tokens() <= capacity)
    assert p.n_bins >= p.lower_bound


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64).flatmap(lambda c: st.tuples(st.just(c), st.lists(st.integers(1, c), max_size=200))))
def test_bfd_places_every_sample_once_within_capacity(case):
    capacity, lengths = case
    p = plan(np.array(lengths, dtype=np.int64), capacity)
    check_plan(p, lengths, capacity)


def test_bfd_golden():
    p = plan([5, 3, 4, 4, 8, 1], capacity=8)
    assert [p.bin(b).tolist() for b in range(p.n_bins)] == [[4], [0, 1], [2, 3], [5]]
    assert p.lower_bound == 4 and p.efficiency == pytest.approx(25 / 32)


def test_bfd_chooses_the_tightest_bin():
    # After 6 and 5 open two bins (free 4 and 5), a 4 must go to the bin with 4 free.
    p = plan([6, 5, 4], capacity=10)
    assert [sorted(p.bin(b).tolist()) for b in range(p.n_bins)] == [[0, 2], [1]]


def test_empty_plan():
    p = plan(np.zeros(0, dtype=np.int64), 16)
    assert p.n_bins == 0 and p.lower_bound == 0 and p.efficiency == 0.0


def test_reorder_keeps_bins():
    p = plan([5, 3, 4, 4, 8, 1], capacity=8)
    q = p.reorder(np.array([3, 1, 0, 2]))
    assert [q.bin(b).tolist() for b in range(q.n_bins)] == [[5], [0, 1], [4], [2, 3]]


@pytest.mark.parametrize(
    "lengths, capacity, kwargs, match",
    [
        ([5, 9], 8, {}, r"sample 1 is too long \(9 > 8\); apply an oversize policy"),
        ([0, 3], 8, {}, "sample 0 has length 0"),
        ([[1, 2]], 8, {}, "1-D integer array"),
        ([1.5], 8, {}, "1-D integer array"),
        ([1], 0, {}, "capacity must be at least 1"),
        ([1], 8, {"algorithm": "magic"}, "unknown packing algorithm 'magic'; known: bfd"),
    ],
)
def test_plan_rejects_bad_arguments(lengths, capacity, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(lengths, capacity, **kwargs)


def test_registry_has_bfd():
    assert "bfd" in ALGORITHMS


def test_concat_ranges():
    assert concat_ranges(np.array([10, 3, 7]), np.array([2, 0, 3])).tolist() == [10, 11, 7, 8, 9]
    assert concat_ranges(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []
