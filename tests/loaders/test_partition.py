"""The rank/worker partition, as properties over every world, block and cut point."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError
from loaders.partition import MAX_LEVELS, Partition, Remaining
from loaders.plan import make_plan
from loaders.prefetch import touched_windows

worlds = st.integers(min_value=1, max_value=6)
blocks = st.integers(min_value=1, max_value=9)


def positions(part: Partition, chunks) -> list[int]:
    out = []
    for c in chunks:
        runs = part.chunk(c)
        assert all(n > 0 for _, n in runs)
        out.extend(p for pos, n in runs for p in range(pos, pos + n))
    return out


def prefix(total: int, start: int) -> Remaining:
    return Remaining.prefix(total, start)


def delivered_order(part: Partition, num_workers: int) -> list[int]:
    """Chunks in the order a DataLoader hands them out: workers round-robin, exhausted ones skipped."""
    queues = [list(part.worker_chunks(w, num_workers)) for w in range(num_workers)]
    order, active, w = [], [True] * num_workers, 0
    while any(active):
        if active[w]:
            if queues[w]:
                order.append(queues[w].pop(0))
            else:
                active[w] = False
        w = (w + 1) % num_workers
    return order


@given(
    total=st.integers(0, 300), start=st.integers(0, 300), world=worlds, block=blocks, drop_last=st.booleans()
)
@settings(max_examples=200, deadline=None)
def test_ranks_are_disjoint_equal_and_complete(total, start, world, block, drop_last):
    assume(start <= total)
    parts = [Partition(prefix(total, start), world, r, block, drop_last) for r in range(world)]
    per_rank = [positions(p, range(p.num_chunks)) for p in parts]
    flat = [x for ps in per_rank for x in ps]
    assert len(flat) == len(set(flat)), "a position went to two ranks"
    assert all(start <= x < total for x in flat)
    assert len({len(ps) for ps in per_rank}) == 1, "ranks got different counts"
    assert all(len(ps) == p.samples for ps, p in zip(per_rank, parts))
    assert total - start - len(flat) < world * (block if drop_last else 1)
    assert all(ps == sorted(ps) for ps in per_rank), "a rank's positions go backwards"
    if world == 1 and not drop_last:
        assert flat == list(range(start, total))


@given(total=st.integers(0, 2000), world=st.integers(1, 8), block=blocks)
@settings(max_examples=100, deadline=None)
def test_each_rank_reads_one_contiguous_section(total, world, block):
    # Ranks read sections of the order, so each reads the windows (shards) of its own
    # stretch of the epoch, not a slice of every window.
    parts = [Partition(Remaining(total), world, r, block) for r in range(world)]
    for r, p in enumerate(parts):
        ps = positions(p, range(p.num_chunks))
        assert ps == list(range(r * p.per_rank, (r + 1) * p.per_rank))


@given(total=st.integers(0, 300), world=worlds, block=blocks, workers=st.integers(1, 5))
@settings(max_examples=150, deadline=None)
def test_workers_split_a_rank_and_deliver_in_rank_order(total, world, block, workers):
    part = Partition(Remaining(total), world, world - 1, block)
    shares = [set(part.worker_chunks(w, workers)) for w in range(workers)]
    assert sum(len(s) for s in shares) == part.num_chunks
    assert set().union(*shares) == set(range(part.num_chunks))
    assert delivered_order(part, workers) == list(range(part.num_chunks))


@given(
    total=st.integers(0, 300), start=st.integers(0, 300), world=worlds, block=blocks, cut=st.integers(0, 100)
)
@settings(max_examples=200, deadline=None)
def test_after_is_exactly_what_the_ranks_did_not_deliver(total, start, world, block, cut):
    assume(start <= total)
    parts = [Partition(prefix(total, start), world, r, block) for r in range(world)]
    m = min(cut, parts[0].num_chunks)
    consumed = {x for p in parts for x in positions(p, range(m))}
    after = parts[0].after(parts[0].samples_through(m - 1))
    left = positions(Partition(after, 1, 0, total + 1), range(1)) if after.size else []
    assert left == sorted(set(range(start, total)) - consumed)
    assert after.consumed == start + len(consumed)
    assert len(after.levels) <= (1 if start else 0) + 1


@given(total=st.integers(0, 500), world=worlds, block=blocks, cuts=st.lists(st.integers(0, 30), max_size=5))
@settings(max_examples=100, deadline=None)
def test_resuming_with_the_same_world_keeps_one_level(total, world, block, cuts):
    remaining = Remaining(total)
    for cut in cuts:
        part = Partition(remaining, world, 0, block)
        remaining = part.after(part.samples_through(min(cut, part.num_chunks) - 1))
    assert len(remaining.levels) <= 1
    if remaining.levels:
        assert remaining.levels[0][:2] == (world, total // world)


@given(
    total=st.integers(0, 250),
    worlds_seq=st.lists(worlds, min_size=1, max_size=4),
    block_seq=st.lists(blocks, min_size=4, max_size=4),
    cuts=st.lists(st.integers(0, 40), min_size=4, max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_elastic_resume_repeats_and_loses_nothing(total, worlds_seq, block_seq, cuts):
    """Run a few legs, each with another world size and batch size, cut after some batches."""
    seen: list[int] = []
    remaining = Remaining(total)
    for leg, world in enumerate(worlds_seq):
        parts = [Partition(remaining, world, r, block_seq[leg]) for r in range(world)]
        last = leg == len(worlds_seq) - 1
        m = parts[0].num_chunks if last else min(cuts[leg], parts[0].num_chunks)
        for p in parts:
            seen.extend(positions(p, range(m)))
        remaining = parts[0].after(parts[0].samples_through(m - 1))
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    assert len(seen) == remaining.consumed
    assert total - len(seen) < worlds_seq[-1], "more than the last world's remainder was left out"
    assert len(remaining.levels) <= len(worlds_seq)


def test_levels_are_bounded_and_checked():
    remaining = Remaining(10_000)
    for i in range(MAX_LEVELS):
        remaining = Partition(remaining, 1 + i % 2, 0, 1).after(1)
    assert len(remaining.levels) == MAX_LEVELS
    with pytest.raises(BadInputError, match="levels"):
        Partition(remaining, 3, 0, 1).after(1)
    with pytest.raises(BadInputError, match="does not fit"):
        Remaining(10, ((3, 4, 1),))
    with pytest.raises(BadInputError, match="outside"):
        Remaining.prefix(10, 11)


@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=10),
    window=st.integers(1, 4),
    shuffle=st.booleans(),
    world=worlds,
    block=blocks,
    workers=st.integers(1, 4),
    start=st.integers(0, 50),
)
@settings(max_examples=150, deadline=None)
def test_touched_windows_lists_exactly_the_windows_a_reader_needs(
    sizes, window, shuffle, world, block, workers, start
):
    plan = make_plan(
        "v", [(f"s{i}", n) for i, n in enumerate(sizes)], seed=3, epoch=1, shuffle=shuffle, window=window
    )
    assume(start <= plan.records)
    part = Partition(prefix(plan.records, start), world, 0, block)
    for w in range(workers):
        chunks = part.worker_chunks(w, workers)
        expected = []
        for c in chunks:
            for pos, n in part.chunk(c):
                for win, _, _ in plan.segments(pos, pos + n):
                    if not expected or expected[-1] != win:
                        expected.append(win)
        assert list(touched_windows(plan, part, chunks)) == expected
