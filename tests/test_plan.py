"""The planner: every algorithm and constraint, against invariants and reference packers."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer._ranges import concat_ranges
from packer.pack import ALGORITHMS, plan, register
from packer.pack.oversize import resolve

ALL = sorted(ALGORITHMS)


def reference_bfd(lengths, capacity):
    """Plain-Python best-fit decreasing with the same tie rule (latest bin at a free value)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    stacks, values, bins = {}, [], []
    for i in order:
        k = bisect.bisect_left(values, lengths[i])
        if k == len(values):
            b, free = len(bins), capacity
            bins.append([])
        else:
            free = values[k]
            b = stacks[free].pop()
            if not stacks[free]:
                del stacks[free]
                values.pop(k)
        bins[b].append(i)
        left = free - lengths[i]
        if left > 0:
            if left not in stacks:
                stacks[left] = []
                bisect.insort(values, left)
            stacks[left].append(b)
    return bins


def reference_first_fit(order, lengths, capacity):
    bins, free = [], []
    for i in order:
        for b, f in enumerate(free):
            if f >= lengths[i]:
                break
        else:
            b = len(bins)
            bins.append([])
            free.append(capacity)
        bins[b].append(i)
        free[b] -= lengths[i]
    return bins


def bins_of(p):
    return [p.bin(b).tolist() for b in range(p.n_bins)]


def check_invariants(p, lengths, capacity):
    assert p.offsets[0] == 0 and np.all(np.diff(p.offsets) >= 1) and p.offsets[-1] == len(p.indices)
    assert np.all(p.bin_tokens() <= capacity)
    assert p.n_bins >= p.lower_bound
    dropped = set(np.concatenate(list(p.dropped.values())).tolist()) if p.dropped else set()
    placed = set(p.indices.tolist())
    assert placed.isdisjoint(dropped)
    assert placed | dropped == set(range(len(lengths))), "a sample was neither placed nor accounted for"


lengths_and_capacity = st.integers(1, 64).flatmap(
    lambda c: st.tuples(st.lists(st.integers(1, c), max_size=150), st.just(c)))


@settings(max_examples=150, deadline=None)
@given(lengths_and_capacity, st.sampled_from(ALL), st.integers(0, 3))
def test_every_algorithm_places_every_sample_once_within_capacity(case, algorithm, seed):
    lengths, capacity = case
    p = plan(np.array(lengths, np.int64), capacity, algorithm=algorithm, seed=seed)
    check_invariants(p, lengths, capacity)
    assert sorted(p.indices.tolist()) == list(range(len(lengths)))
    assert np.all(p.starts == 0) and np.array_equal(p.lengths, np.asarray(lengths, np.int64)[p.indices])


@settings(max_examples=150, deadline=None)
@given(lengths_and_capacity)
def test_bfd_equals_the_reference_best_fit_decreasing(case):
    lengths, capacity = case
    p = plan(np.array(lengths, np.int64), capacity, order="planner")
    assert bins_of(p) == reference_bfd(lengths, capacity)


@settings(max_examples=100, deadline=None)
@given(lengths_and_capacity, st.integers(0, 5))
def test_ffd_and_shuffle_equal_reference_first_fit(case, seed):
    lengths, capacity = case
    decreasing = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    assert bins_of(plan(np.array(lengths, np.int64), capacity, algorithm="ffd", order="planner")) == \
        reference_first_fit(decreasing, lengths, capacity)
    shuffled = np.random.default_rng(seed).permutation(len(lengths)).tolist()
    assert bins_of(plan(np.array(lengths, np.int64), capacity, algorithm="shuffle", seed=seed, order="planner")) == \
        reference_first_fit(shuffled, lengths, capacity)


@settings(max_examples=100, deadline=None)
@given(lengths_and_capacity, st.integers(1, 4), st.sampled_from(ALL))
def test_max_segments(case, max_segments, algorithm):
    lengths, capacity = case
    p = plan(np.array(lengths, np.int64), capacity, algorithm=algorithm, max_segments=max_segments)
    check_invariants(p, lengths, capacity)
    assert np.all(np.diff(p.offsets) <= max_segments)


media_case = st.integers(4, 64).flatmap(lambda c: st.tuples(
    st.lists(st.tuples(st.integers(1, c), st.integers(0, 3), st.integers(0, 2)), max_size=120), st.just(c)))


@settings(max_examples=150, deadline=None)
@given(media_case, st.integers(0, 4), st.integers(0, 3), st.sampled_from(["bfd", "next-fit"]))
def test_media_caps_by_kind_and_total(case, image_cap, total_cap, algorithm):
    rows, capacity = case
    lengths = np.array([r[0] for r in rows], np.int64)
    media = {"image": np.array([r[1] for r in rows], np.int64), "audio": np.array([r[2] for r in rows], np.int64)}
    caps = {"image": image_cap, "total": total_cap + 2}
    p = plan(lengths, capacity, algorithm=algorithm, media=media, max_media=caps)
    check_invariants(p, lengths, capacity)
    for b in range(p.n_bins):
        members = p.bin(b)
        assert media["image"][members].sum() <= image_cap
        assert (media["image"] + media["audio"])[members].sum() <= total_cap + 2
    over = (media["image"] > image_cap) | (media["image"] + media["audio"] > total_cap + 2)
    assert set(p.dropped.get("over_media_cap", np.zeros(0)).tolist()) == set(np.flatnonzero(over).tolist())


@settings(max_examples=80, deadline=None)
@given(lengths_and_capacity, st.sampled_from(ALL))
def test_group_by_keeps_rows_pure(case, algorithm):
    lengths, capacity = case
    groups = np.array(["text", "image", "audio"])[np.arange(len(lengths)) % 3]
    p = plan(np.array(lengths, np.int64), capacity, algorithm=algorithm, group_by=groups)
    check_invariants(p, lengths, capacity)
    for b in range(p.n_bins):
        assert len(set(groups[p.bin(b)])) == 1


@settings(max_examples=80, deadline=None)
@given(lengths_and_capacity, st.sampled_from(ALL), st.integers(0, 3), st.integers(0, 2**16), st.sampled_from([None, 2, 3]))
def test_row_keys_keep_rows_of_one_key(case, algorithm, n_keys, seed, max_segments):
    """A family's row constraint: no row holds two keys; every sample placed once; caps still hold."""
    lengths, capacity = case
    rng = np.random.default_rng(seed)
    keys = np.where(rng.random(len(lengths)) < 0.5, rng.integers(0, max(n_keys, 1), len(lengths)), -1)
    p = plan(np.array(lengths, np.int64), capacity, algorithm=algorithm, row_key=keys, max_segments=max_segments)
    check_invariants(p, lengths, capacity)
    for b in range(p.n_bins):
        assert len(set(keys[p.bin(b)].tolist()) - {-1}) <= 1
        assert max_segments is None or len(p.bin(b)) <= max_segments


def test_row_keys_cost_nothing_where_keyless_samples_fill_the_keyed_rows():
    """2,000 samples, 30% of them keyed by one of 4 frame counts: best fit decreasing reaches the rows it reaches
    without keys (388, lower bound 387); a single key is no constraint at all (the very same plan)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 1500, size=2000)
    keys = np.where(rng.random(2000) < 0.3, rng.integers(0, 4, size=2000), -1)
    free = plan(lengths, 4096)
    keyed = plan(lengths, 4096, row_key=keys)
    assert (keyed.n_bins, free.n_bins, keyed.lower_bound) == (388, 388, 387)
    one = plan(lengths, 4096, row_key=np.where(keys >= 0, 7, -1))
    assert np.array_equal(one.indices, free.indices) and np.array_equal(one.offsets, free.offsets)


def test_unconstrained_algorithms_refuse_caps():
    with pytest.raises(ValueError, match="algorithm 'ffd' does not support max_media; use bfd or next-fit"):
        plan([3, 4], 8, algorithm="ffd", media={"image": np.array([1, 1])}, max_media={"image": 1})


def test_same_seed_same_plan_other_seed_other_order():
    lengths = np.random.default_rng(1).integers(1, 100, 5000)
    a, b, c = plan(lengths, 128, seed=7), plan(lengths, 128, seed=7), plan(lengths, 128, seed=8)
    assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.indices, b.indices)
    assert not np.array_equal(a.indices, c.indices)
    assert sorted(map(tuple, map(sorted, bins_of(a)))) == sorted(map(tuple, map(sorted, bins_of(c))))  # same bins


def test_longest_first_puts_the_costliest_row_first():
    p = plan([10, 3, 3, 9, 2, 2, 2], capacity=10, order="longest-first", seed=3)
    tokens = p.bin_tokens()
    assert tokens[0] == tokens.max() and p.lengths[: np.diff(p.offsets)[0]].tolist() == [10]


def test_golden_bfd():
    p = plan([5, 3, 4, 4, 8, 1], capacity=8, order="planner")
    assert bins_of(p) == [[4], [0, 1], [2, 3], [5]]
    assert p.lower_bound == 4 and p.efficiency == pytest.approx(25 / 32)


def test_golden_each_algorithm():
    lengths = [6, 5, 4, 3, 2, 2]
    expect = {
        "bfd": [[0, 2], [1, 3, 4], [5]],  # 6+4, 5+3+2, 2
        "ffd": [[0, 2], [1, 3, 4], [5]],
        "next-fit": [[0], [1, 2], [3, 4, 5]],
    }
    for algorithm, bins in expect.items():
        assert bins_of(plan(lengths, 10, algorithm=algorithm, order="planner")) == bins, algorithm


def test_bfd_chooses_the_tightest_bin():
    p = plan([6, 5, 4], capacity=10, order="planner")  # bins free 4 and 5: the 4 goes to the one with 4 free
    assert [sorted(b) for b in bins_of(p)] == [[0, 2], [1]]


def test_empty_plan():
    for algorithm in ALL:
        p = plan(np.zeros(0, dtype=np.int64), 16, algorithm=algorithm)
        assert p.n_bins == 0 and p.lower_bound == 0 and p.efficiency == 0.0


def test_reorder_keeps_bins():
    p = plan([5, 3, 4, 4, 8, 1], capacity=8, order="planner")
    q = p.reorder(np.array([3, 1, 0, 2]))
    assert bins_of(q) == [[5], [0, 1], [4], [2, 3]]


@pytest.mark.parametrize(
    "lengths, capacity, kwargs, match",
    [
        ([5, 9], 8, {}, r"sample 1 is too long \(9 > 8\); apply an oversize policy \(truncate, split, drop\)"),
        ([0, 3], 8, {}, "sample 0 has length 0"),
        ([[1, 2]], 8, {}, "1-D integer array"),
        ([1.5], 8, {}, "1-D integer array"),
        ([1], 0, {}, "capacity must be at least 1"),
        ([1], 8, {"algorithm": "magic"}, "unknown packing algorithm 'magic'; known: bfd, ffd, next-fit, shuffle"),
        ([1], 8, {"order": "sideways"}, "unknown row order 'sideways'"),
        ([1], 8, {"oversize": "squash"}, "unknown oversize policy 'squash'"),
        ([1], 8, {"max_segments": 0}, "max_segments must be at least 1"),
        ([1], 8, {"max_media": {"video": 1}, "media": {"image": np.array([1])}}, "max_media caps 'video' but media has no 'video'"),
        ([1, 2], 8, {"max_media": {"image": 1}, "media": {"image": np.array([1])}}, "one entry per sample"),
    ],
)
def test_plan_rejects_bad_arguments(lengths, capacity, kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan(lengths, capacity, **kwargs)


def test_oversize_policies_golden():
    # capacity 4; sample 0 has 10 tokens with an image at 3..5 (the docstring example).
    lengths = np.array([10, 2])
    protected = {0: np.array([[3, 3]])}
    t = resolve(lengths, 4, "truncate", protected=protected)
    assert list(zip(t.sample.tolist(), t.start.tolist(), t.length.tolist())) == [(1, 0, 2), (0, 0, 3)]
    assert t.truncated.tolist() == [0] and t.truncated_tokens == 7
    s = resolve(lengths, 4, "split", protected=protected)
    # the last piece [7:10] talks about the image it does not hold: left out and counted
    assert list(zip(s.sample.tolist(), s.start.tolist(), s.length.tolist())) == [(1, 0, 2), (0, 0, 3), (0, 3, 4)]
    assert s.split.tolist() == [0] and s.pieces_lost_media == 1 and s.pieces_dropped == 0
    d = resolve(lengths, 4, "drop")
    assert d.sample.tolist() == [1] and d.dropped["oversize"].tolist() == [0]


def test_oversize_nothing_trainable_and_media_over_capacity():
    lengths = np.array([10, 10])
    trained = {0: np.array([False] * 6 + [True] * 4), 1: np.ones(10, bool)}
    t = resolve(lengths, 4, "truncate", trained=trained, protected={1: np.array([[2, 6]])})
    assert {k: v.tolist() for k, v in t.dropped.items()} == {"media_over_capacity": [1], "nothing_trainable": [0]}
    s = resolve(np.array([10]), 4, "split", trained={0: np.array([False] * 6 + [True] * 4)})
    # pieces [0:4] (nothing trained after its first token) left out, [4:8] and [8:10] kept
    assert list(zip(s.start.tolist(), s.length.tolist())) == [(4, 4), (8, 2)] and s.pieces_dropped == 1


def split_pieces(s, i):
    mine = np.flatnonzero(s.sample == i)
    return list(zip(s.start[mine].tolist(), s.length[mine].tolist()))


def test_split_keeps_only_pieces_that_hold_their_media():
    # capacity 4. Sample 0: text, image at 4..6, text: [t t t t] [I I I t] (t t t) -> the last piece lost.
    # Sample 1: image first at 0..2: [I I I t] then three text pieces about it -> all three lost.
    # Sample 2: two images, 2..3 and 7..8: [t t I I] [t t t] (J J t t) (t) -> the second piece follows image I
    #           without it and the third holds J but not I: both lost; the 1-token piece has nothing to train.
    # Sample 3: text only: every piece kept.
    lengths = np.array([11, 14, 12, 10])
    protected = {0: np.array([[4, 3]]), 1: np.array([[0, 3]]), 2: np.array([[2, 2], [7, 2]])}
    s = resolve(lengths, 4, "split", protected=protected)
    assert split_pieces(s, 0) == [(0, 4), (4, 4)]
    assert split_pieces(s, 1) == [(0, 4)]
    assert split_pieces(s, 2) == [(0, 4)]
    assert split_pieces(s, 3) == [(0, 4), (4, 4), (8, 2)]
    assert s.pieces_lost_media == 1 + 3 + 2 and s.pieces_dropped == 1 and not s.dropped
    assert s.split.tolist() == [0, 1, 2, 3]
    # truncate keeps the first piece, which never follows a span: unchanged by the rule
    t = resolve(lengths, 4, "truncate", protected=protected)
    assert t.pieces_lost_media == 0 and t.length[np.argsort(t.sample)].tolist() == [4, 4, 4, 4]


def test_split_sample_left_with_no_piece_is_dropped_as_split_lost_media():
    # An image at 0..2 and an untrained question fill the first piece; the answer lies in pieces that
    # lack the image: nothing may be trained, so the sample is dropped -- as split_lost_media,
    # while a sample that simply has nothing to train stays nothing_trainable.
    lengths = np.array([12, 12])
    trained = {0: np.array([False] * 4 + [True] * 8), 1: np.zeros(12, bool)}
    s = resolve(lengths, 4, "split", protected={0: np.array([[0, 3]]), 1: np.array([[0, 3]])}, trained=trained)
    assert {k: v.tolist() for k, v in s.dropped.items()} == {"nothing_trainable": [1], "split_lost_media": [0]}
    assert len(s.sample) == 0 and s.pieces_lost_media == 2 and s.pieces_dropped == 1 + 3
    # plan() carries the count and the accounting: every sample placed or dropped, by reason
    p = plan(lengths, 4, oversize="split", protected={0: np.array([[0, 3]]), 1: np.array([[0, 3]])}, trained=trained)
    assert p.pieces_lost_media == 2 and p.n_bins == 0 and sorted(p.dropped) == ["nothing_trainable", "split_lost_media"]


@st.composite
def samples_with_media(draw):
    """Lengths, capacity, non-overlapping media spans (some over capacity) and trained masks."""
    capacity = draw(st.integers(3, 24))
    lengths, protected, trained = [], {}, {}
    for i in range(draw(st.integers(1, 12))):
        n = draw(st.integers(1, 4 * capacity))
        lengths.append(n)
        spans, pos = [], 0
        while pos < n and draw(st.booleans()):
            start = pos + draw(st.integers(0, n - pos - 1))
            length = draw(st.integers(1, min(n - start, capacity + 2)))
            spans.append((start, length))
            pos = start + length
        protected[i] = np.array(spans, np.int64).reshape(-1, 2)
        trained[i] = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    return np.array(lengths, np.int64), capacity, protected, trained


def reference_cuts(n, capacity, spans):
    """Piece boundaries of a split, independently: at most ``capacity``, moved back before a span."""
    cuts, start = [], 0
    while start < n:
        end = min(start + capacity, n)
        inside = [s for s, m in spans if start < s < end < s + m]
        end = min(inside) if inside else end
        cuts.append((start, end))
        start = end
    return cuts


@settings(max_examples=300, deadline=None)
@given(samples_with_media(), st.sampled_from(ALL))
def test_split_never_trains_a_piece_on_media_it_lacks(case, algorithm):
    lengths, capacity, protected, trained = case
    p = plan(lengths, capacity, oversize="split", protected=protected, trained=trained, algorithm=algorithm)
    check_invariants(p, lengths.tolist(), capacity)
    for i, start, n in zip(p.indices.tolist(), p.starts.tolist(), p.lengths.tolist(), strict=True):
        for s, m in protected[i].tolist():
            overlaps = s < start + n and start < s + m
            assert not overlaps or start <= s and s + m <= start + n, f"span {s}:{s + m} is cut"
            if s < start + n:  # a span that starts before the piece ends ...
                assert start <= s, f"piece {start}:{start + n} of sample {i} follows span {s}:{s + m} it lacks"
    # The rule loses exactly the trainable pieces that start after the first span: no more, no less.
    lost = 0
    for i, n in enumerate(lengths.tolist()):
        spans = protected[i].tolist()
        if n <= capacity or any(m > capacity for _, m in spans):
            continue
        first = min((s for s, _ in spans), default=n)
        cuts = [(a, b) for a, b in reference_cuts(n, capacity, spans) if trained[i][a + 1 : b].any()]
        kept = sorted(zip(p.starts[p.indices == i].tolist(), (p.starts + p.lengths)[p.indices == i].tolist()))
        assert kept == [(a, b) for a, b in cuts if a <= first]
        lost += sum(a > first for a, _ in cuts)
        if not kept:
            assert i in p.dropped["split_lost_media" if any(a > first for a, _ in cuts) else "nothing_trainable"]
    assert p.pieces_lost_media == lost


@settings(max_examples=100, deadline=None)
@given(st.integers(4, 40).flatmap(lambda c: st.tuples(st.lists(st.integers(1, 3 * c), min_size=1, max_size=40), st.just(c))),
       st.sampled_from(["truncate", "split", "drop"]), st.sampled_from(ALL))
def test_oversize_accounts_for_every_sample(case, policy, algorithm):
    lengths, capacity = case
    p = plan(np.array(lengths, np.int64), capacity, oversize=policy, algorithm=algorithm)
    check_invariants(p, lengths, capacity)
    if policy == "split":  # every token placed once, except 1-token pieces (nothing to train after the first)
        missing = 0
        for i, n in enumerate(lengths):
            if n <= capacity:
                continue
            mine = np.flatnonzero(p.indices == i)
            covered = sorted(zip(p.starts[mine].tolist(), p.lengths[mine].tolist()))
            assert covered[0][0] == 0 and all(1 < c[1] <= capacity for c in covered)
            assert all(a[0] + a[1] == b[0] for a, b in zip(covered, covered[1:]))
            missing += n - sum(c[1] for c in covered)
        assert missing == p.pieces_dropped


def test_register_a_custom_algorithm():
    @register("one-per-bin-test", description="each sample alone")
    def one_per_bin(lengths, capacity, *, seed=0, constraints=None):
        return np.arange(len(lengths) + 1), np.arange(len(lengths))

    try:
        assert plan([3, 4], 8, algorithm="one-per-bin-test", order="planner").n_bins == 2
        with pytest.raises(ValueError, match="does not support max_segments"):
            plan([3, 4], 8, algorithm="one-per-bin-test", max_segments=1)
        with pytest.raises(ValueError, match="registered twice"):
            register("one-per-bin-test")(one_per_bin)
    finally:
        del ALGORITHMS["one-per-bin-test"]


def test_concat_ranges():
    assert concat_ranges(np.array([10, 3, 7]), np.array([2, 0, 3])).tolist() == [10, 11, 7, 8, 9]
    assert concat_ranges(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []


# -- the numba-free twins of the default plan (packer.pack._small) against the numba kernels -----------------------

@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_small_bfd_twin_takes_the_numba_kernels_steps(data):
    """Same bins, same order, for any lengths, segment limit, media caps (bin classes) and needs."""
    from packer.pack import _small
    from packer.pack._bfd_numba import bfd as kernel

    capacity = data.draw(st.integers(1, 300))
    n = data.draw(st.integers(0, 400))
    lengths = np.asarray(data.draw(st.lists(st.integers(1, capacity), min_size=n, max_size=n)), np.int64)
    caps = np.asarray(data.draw(st.lists(st.integers(0, 3), max_size=2)), np.int64)
    need = np.asarray(data.draw(st.lists(st.lists(st.integers(0, 2), min_size=len(caps), max_size=len(caps)),
                                         min_size=n, max_size=n)), np.int64).reshape(n, len(caps))
    need = np.minimum(need, caps)  # the planner drops a sample over a cap before packing
    sizes = caps + 1
    stride = np.ones(len(caps), np.int64)
    for k in range(len(caps) - 2, -1, -1):
        stride[k] = stride[k + 1] * sizes[k + 1]
    n_classes = int(np.prod(sizes)) if len(caps) else 1
    class_rem = ((np.arange(n_classes)[:, None] // stride[None, :]) % sizes[None, :]).astype(np.int64)
    max_segments = data.draw(st.sampled_from([0, 1, 2, 5]))
    order = _small.decreasing_order(lengths, capacity)
    args = (lengths[order], capacity, max_segments, np.ascontiguousarray(need[order]), caps, class_rem, stride)
    assign, n_bins = _small.bfd(*args)
    want_assign, want_bins = kernel(*args)
    assert n_bins == want_bins and assign.tolist() == want_assign.tolist()


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), max_size=60), seed=st.integers(0, 10**6))
def test_small_csr_and_reorder_twins_equal_the_numba_ones(sizes, seed):
    from packer.pack import _bits, _small

    rng = np.random.default_rng(seed)
    n_bins = len(sizes)
    assign = rng.permutation(np.repeat(np.arange(n_bins), sizes)).astype(np.int32)
    order = rng.permutation(len(assign)).astype(np.int64)
    got, want = _small.csr_from_assignment(order, assign, n_bins), _bits.csr_from_assignment(order, assign, n_bins)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
    offsets = got[0]
    perm = rng.permutation(n_bins).astype(np.int64)
    new_offsets = np.zeros(n_bins + 1, np.int64)
    np.cumsum(np.diff(offsets)[perm], out=new_offsets[1:])
    values = rng.integers(0, 1000, len(assign))
    assert _small.reorder_values(offsets, new_offsets, perm, values).tolist() == \
        _bits.reorder_values(offsets, new_offsets, perm, values).tolist()


@pytest.mark.parametrize("caps", [None, {"image": 2}])
def test_plans_through_either_path_are_equal(monkeypatch, caps):
    """The planner's own switch: a plan below SMALL (Python twins) equals the same plan forced through numba."""
    from packer.pack import _small

    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 700, 3000)
    images = rng.integers(0, 3, 3000)
    kwargs = dict(algorithm="bfd", seed=3, order="shuffle", max_segments=6, oversize="split",
                  media={"image": images} if caps else None, max_media=caps)
    small = plan(lengths, 512, **kwargs)
    monkeypatch.setattr(_small, "SMALL", 0)
    large = plan(lengths, 512, **kwargs)
    for name in ("offsets", "indices", "starts", "lengths"):
        assert getattr(small, name).tolist() == getattr(large, name).tolist(), name
    assert small.n_bins > 10


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), max_size=60), capacity=st.integers(1, 70_000), seed=st.integers(0, 10**6))
def test_csr_with_values_and_sorted_lengths_equal_the_gathers_they_replace(sizes, capacity, seed):
    """bfd's CSR pass places the lengths with the items, and its sorted lengths come from counts:
    both equal the gathers ``lengths[order]`` / ``lengths[indices]`` they save, in both twins."""
    from packer.pack import _bits, _small

    rng = np.random.default_rng(seed)
    n_bins = len(sizes)
    assign = rng.permutation(np.repeat(np.arange(n_bins), sizes)).astype(np.int32)
    lengths = rng.integers(1, capacity + 1, len(assign)).astype(np.int64)
    order = _small.decreasing_order(lengths, capacity)
    placed = _small.sorted_decreasing(lengths, capacity)
    assert placed.tolist() == lengths[order].tolist()
    for twin in (_small.csr_from_assignment_with, _bits.csr_from_assignment_with):
        offsets, indices, values = twin(order, assign, n_bins, placed)
        want = _small.csr_from_assignment(order, assign, n_bins)
        assert offsets.tolist() == want[0].tolist() and indices.tolist() == want[1].tolist()
        assert values.tolist() == lengths[indices].tolist()
    perm = rng.permutation(n_bins).astype(np.int64)
    new_offsets = np.zeros(n_bins + 1, np.int64)
    np.cumsum(np.diff(offsets)[perm], out=new_offsets[1:])
    a, b = _bits.reorder_pair(offsets, new_offsets, perm, indices, values)
    assert a.tolist() == _small.reorder_values(offsets, new_offsets, perm, indices).tolist()
    assert b.tolist() == _small.reorder_values(offsets, new_offsets, perm, values).tolist()


@pytest.mark.slow  # compiles every kernel (~9 s)
def test_warm_reaches_every_numba_kernel(tmp_path):
    """``python -m packer.pack.warm`` (``make setup``) compiles and caches each kernel, so no build pays it: run with an
    empty cache of its own, it leaves an entry for every ``@njit`` function of the planner (an inlined helper is
    compiled into its callers)."""
    import os
    import subprocess
    import sys

    from numba.core.registry import CPUDispatcher

    from packer.pack import _bfd_numba, _bits, _first_fit, next_fit

    kernels = {name for m in (_bfd_numba, _bits, _first_fit, next_fit) for name, f in vars(m).items()
               if isinstance(f, CPUDispatcher) and f.py_func.__module__ == m.__name__
               and f.targetoptions.get("inline") != "always"}
    r = subprocess.run([sys.executable, "-m", "packer.pack.warm"], capture_output=True, text=True,
                       env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    cached = {p.name.split(".")[1].rsplit("-", 1)[0] for p in tmp_path.rglob("*.nbi")}
    assert len(kernels) >= 11 and kernels - cached == set(), kernels - cached


def test_lower_bound_honours_max_segments_and_media_caps():
    """Ten short samples of one image and one audio clip each, in rows of 100 tokens (L1 = 1): at most 3 segments a
    row they need 4 rows, at 2 images a row 5, at 4 media of any kind a row 5; a sample dropped over a cap counts
    for nothing; a budgeted resource beside the caps leaves the media bound as it is."""
    ones = np.ones(10, np.int64)
    media = {"image": ones, "audio": ones}
    assert plan(ones, 100).lower_bound == 1
    assert plan(ones, 100, max_segments=3).lower_bound == 4
    for caps in ({"image": 2}, {"total": 4}):
        p = plan(ones, 100, media=media, max_media=caps)
        assert p.cap_bound == p.lower_bound == 5 and p.n_bins >= p.lower_bound
    heavy = {"image": np.r_[3, ones[1:]], "audio": ones}  # sample 0: 3 images > the cap of 2, dropped
    p = plan(ones, 100, media=heavy, max_media={"image": 2})
    assert p.dropped["over_media_cap"].tolist() == [0] and p.lower_bound == 5  # ceil(9 / 2)
    p = plan(ones, 100, media=media, max_media={"image": 2}, resources={"encoder": ones * 0.1}, budgets={"encoder": 1.0})
    assert (p.lower_bound, p.resource_bound, p.bound) == (5, 1, 5)
