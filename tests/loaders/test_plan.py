"""The epoch plan: a pure, stable function of (version, seed, epoch)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError
from loaders.plan import keyed_permutation, make_plan, plan_key

shard_sizes = st.lists(st.integers(min_value=0, max_value=40), min_size=0, max_size=12)


def _shards(sizes):
    return [(f"s{i}", n) for i, n in enumerate(sizes)]


def _records(plan):
    """Every position of the plan as (shard id, row)."""
    out = []
    for w in range(plan.num_windows):
        size = int(plan.window_starts[w + 1] - plan.window_starts[w])
        which, rows = plan.window_rows(w, 0, size)
        rows = np.arange(size)[rows] if isinstance(rows, slice) else rows
        which = np.full(size, which) if isinstance(which, int) else which
        assert set(which.tolist()) <= set(plan.window_shards(w))
        out.extend((plan.shard_ids[i], int(r)) for i, r in zip(which.tolist(), rows.tolist()))
    return out


def test_keyed_permutation_is_frozen():
    # The order must never change between releases: a training job resumed after an
    # upgrade would otherwise see a different epoch. These values pin the function.
    assert keyed_permutation(8, 12345).tolist() == [2, 6, 0, 3, 1, 5, 7, 4]
    assert plan_key("v", 0, 0) == 8427224220209195459
    blocked = make_plan(
        "v", [("a", 200), ("b", 200)], seed=0, epoch=0, shuffle=True, window=2, weights=[200, 200], block=64
    )
    which, rows = blocked.window_rows(1, 0, 8)
    assert [(blocked.shard_ids[w], r) for w, r in zip(which.tolist(), rows.tolist())] == [
        ("a", 158), ("b", 14), ("a", 21), ("a", 131), ("b", 48), ("a", 26), ("a", 129), ("b", 49)
    ]  # fmt: skip
    assert [blocked.block_end(p) for p in (100, 167, 168, 299)] == [168, 168, 236, 300]


@given(n=st.integers(min_value=0, max_value=500), key=st.integers(min_value=0, max_value=2**64 - 1))
def test_keyed_permutation_is_a_permutation(n, key):
    assert sorted(keyed_permutation(n, key).tolist()) == list(range(n))


@given(
    sizes=shard_sizes,
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
    window=st.integers(1, 5),
    shuffle=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_every_record_has_exactly_one_position(sizes, seed, epoch, window, shuffle):
    plan = make_plan("ver", _shards(sizes), seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    records = _records(plan)
    assert plan.records == sum(sizes) == len(records)
    assert sorted(records) == sorted((f"s{i}", r) for i, n in enumerate(sizes) for r in range(n))


def test_no_shuffle_is_version_order():
    plan = make_plan("ver", _shards([3, 0, 2]), seed=9, epoch=4, shuffle=False, window=4)
    assert _records(plan) == [("s0", 0), ("s0", 1), ("s0", 2), ("s2", 0), ("s2", 1)]


def test_shuffle_depends_on_version_seed_and_epoch_only():
    shards = _shards([20] * 10)
    base = _records(make_plan("ver", shards, seed=1, epoch=0, shuffle=True, window=3))
    assert base == _records(make_plan("ver", shards, seed=1, epoch=0, shuffle=True, window=3))
    for other in (
        make_plan("ver2", shards, seed=1, epoch=0, shuffle=True, window=3),
        make_plan("ver", shards, seed=2, epoch=0, shuffle=True, window=3),
        make_plan("ver", shards, seed=1, epoch=1, shuffle=True, window=3),
    ):
        assert _records(other) != base


def test_shuffle_mixes_a_few_shards_and_uses_each_shard_in_a_few_windows():
    plan = make_plan("ver", _shards([60] * 8), seed=0, epoch=0, shuffle=True, window=3)
    records = _records(plan)
    assert plan.num_windows == 8 + 3 - 1
    assert list(plan.window_shards(0)) == [0] and list(plan.window_shards(5)) == [3, 4, 5]
    assert list(plan.window_shards(9)) == [7]
    for w in range(2, 8):  # past the ramp: every window mixes 3 shards, 20 records of each
        lo, hi = int(plan.window_starts[w]), int(plan.window_starts[w + 1])
        shards = [s for s, _ in records[lo:hi]]
        assert sorted(set(shards)) == sorted(plan.shard_ids[i] for i in plan.window_shards(w))
        assert all(shards.count(s) == 20 for s in set(shards))
        assert len(set(shards[:16])) == 3, "a batch should draw from every shard of its window"
    first_use = {}
    for pos, (s, _) in enumerate(records):
        first_use.setdefault(s, plan.window_of(pos))
    assert [first_use[s] for s in plan.shard_ids] == list(range(8)), "shards are needed one by one, in order"


def test_segments_split_ranges_at_window_bounds():
    plan = make_plan("ver", _shards([10, 10, 10]), seed=0, epoch=0, shuffle=False, window=4)
    assert list(plan.segments(5, 25)) == [(0, 5, 10), (1, 0, 10), (2, 0, 5)]
    assert list(plan.segments(7, 7)) == []


def test_bad_window_is_refused():
    with pytest.raises(BadInputError, match="shuffle_window"):
        make_plan("ver", _shards([1]), seed=0, epoch=0, shuffle=True, window=0)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=12), min_size=0, max_size=30),
    weights=st.lists(st.integers(min_value=0, max_value=50), min_size=30, max_size=30),
    min_group=st.integers(0, 120),
    window=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    block=st.integers(0, 300),
)
@settings(max_examples=120, deadline=None)
def test_grouped_windows_cover_every_record_once_and_retire_each_shard_once(
    sizes, weights, min_group, window, seed, block
):
    weights = weights[: len(sizes)]
    plan = make_plan(
        "ver",
        _shards(sizes),
        seed=seed,
        epoch=0,
        shuffle=True,
        window=window,
        weights=weights,
        min_group=min_group,
        block=block,
    )
    records = _records(plan)  # also checks each window's rows lie in its shards
    assert sorted(records) == sorted((f"s{i}", r) for i, n in enumerate(sizes) for r in range(n))
    by_id = {f"s{i}": w for i, w in enumerate(weights)}
    bounds = plan.groups.tolist()
    for g, (lo, hi) in enumerate(pairwise(bounds)):
        group_weight = [by_id[plan.shard_ids[i]] for i in range(lo, hi)]
        if g < len(bounds) - 2:  # all but the last reach min_group, and need their last shard for it
            assert sum(group_weight) >= min_group
            assert hi - lo == 1 or sum(group_weight[:-1]) < min_group
    retired = [i for w in range(plan.num_windows) for i in plan.retired_after(w)]
    assert sorted(retired) == list(range(len(plan.shard_ids)))
    for w in range(plan.num_windows):
        later = {i for v in range(w + 1, plan.num_windows) for i in plan.window_shards(v)}
        assert not later & set(plan.retired_after(w))


def test_groups_of_small_shards_mix_as_many_records_as_big_shards_do():
    shards = _shards([5] * 400)
    plain = make_plan("ver", shards, seed=0, epoch=0, shuffle=True, window=2)
    grouped = make_plan("ver", shards, seed=0, epoch=0, shuffle=True, window=2, min_group=200)
    assert len(grouped.groups) - 1 == 10  # 40 shards of 5 records per group

    def shards_per_window(plan) -> int:
        records = _records(plan)
        w = plan.num_windows // 2
        lo, hi = int(plan.window_starts[w]), int(plan.window_starts[w + 1])
        return len({s for s, _ in records[lo:hi]})

    assert shards_per_window(plain) == 2
    assert shards_per_window(grouped) >= 60  # records of both groups' 80 shards


def test_groups_of_one_shard_keep_the_order_of_shard_windows():
    shards = _shards([30, 10, 25, 40])
    plain = make_plan("ver", shards, seed=4, epoch=2, shuffle=True, window=3)
    singles = make_plan("ver", shards, seed=4, epoch=2, shuffle=True, window=3, min_group=5)
    assert _records(plain) == _records(singles)


def _runs(records, run_rows):
    return {(s, r // run_rows) for s, r in records}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_block_shuffle_reads_a_few_runs_at_a_time_and_mixes_them(seed):
    # 4 shards of 2000 records weighing 1 each; blocks of 320: runs of 20 rows, 16 per block.
    shards = _shards([2000] * 4)
    blocked = make_plan(
        "ver", shards, seed=seed, epoch=0, shuffle=True, window=2, weights=[2000] * 4, block=320
    )
    assert blocked.run_rows.tolist() == [20] * 4
    records = _records(blocked)
    assert sorted(records) == sorted((s, r) for s, n in shards for r in range(n))
    for w in range(1, 4):  # windows that mix two shards: 2000 records in 6 blocks
        lo, hi = int(blocked.window_starts[w]), int(blocked.window_starts[w + 1])
        at, blocks, both = lo, 0, 0
        while at < hi:
            end = blocked.block_end(at)
            block = records[at:end]
            runs = _runs(block, 20)
            assert 16 <= len(runs) <= 17 and len(block) == 20 * len(runs), "a block is 16-17 whole runs"
            assert len(_runs(block[:32], 20)) >= 8, "a batch draws from many runs of its block"
            both += len({s for s, _ in block}) == 2
            at, blocks = end, blocks + 1
        assert blocks == 6 and both >= 3, "blocks of equal size mix the window's shards"
    uniform = make_plan("ver", shards, seed=seed, epoch=0, shuffle=True, window=2, weights=[2000] * 4)
    lo = int(uniform.window_starts[2])
    assert len(_runs(_records(uniform)[lo : lo + 320], 20)) > 100  # 320 records scattered over 200 runs


def test_groups_that_fit_in_a_block_are_shuffled_uniformly():
    shards = _shards([100] * 6)
    plan = make_plan("ver", shards, seed=3, epoch=0, shuffle=True, window=2, weights=[100] * 6, block=250)
    assert plan.run_rows.tolist() == [1] * 6
    lo, hi = int(plan.window_starts[2]), int(plan.window_starts[3])
    assert hi - lo == 100  # half of two shards: one block, permuted uniformly
    assert len(_runs(_records(plan)[lo : lo + 20], 10)) >= 8


def test_a_negative_block_is_refused():
    with pytest.raises(BadInputError, match="shuffle_block"):
        make_plan("ver", _shards([1]), seed=0, epoch=0, shuffle=True, window=1, weights=[1], block=-1)
