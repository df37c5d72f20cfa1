"""The rank/worker partition, as properties over every world, block and cut point."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loaders.partition import Partition
from loaders.plan import make_plan
from loaders.prefetch import touched_windows

worlds = st.integers(min_value=1, max_value=6)
blocks = st.integers(min_value=1, max_value=9)


def positions(part: Partition, chunks) -> list[int]:
    out = []
    for c in chunks:
        pos, n = part.chunk(c)
        out.extend(range(pos, pos + n))
    return out


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
    parts = [Partition(start, total, world, r, block, drop_last) for r in range(world)]
    per_rank = [positions(p, range(p.num_chunks)) for p in parts]
    flat = [x for ps in per_rank for x in ps]
    assert len(flat) == len(set(flat)), "a position went to two ranks"
    assert all(start <= x < total for x in flat)
    assert len({len(ps) for ps in per_rank}) == 1, "ranks got different counts"
    assert all(len(ps) == p.samples for ps, p in zip(per_rank, parts))
    assert total - start - len(flat) < world * (block if drop_last else 1)
    if world == 1 and not drop_last:
        assert flat == list(range(start, total))


@given(total=st.integers(0, 300), world=worlds, block=blocks, workers=st.integers(1, 5))
@settings(max_examples=150, deadline=None)
def test_workers_split_a_rank_and_deliver_in_rank_order(total, world, block, workers):
    part = Partition(0, total, world, world - 1, block)
    shares = [set(part.worker_chunks(w, workers)) for w in range(workers)]
    assert sum(len(s) for s in shares) == part.num_chunks
    assert set().union(*shares) == set(range(part.num_chunks))
    assert delivered_order(part, workers) == list(range(part.num_chunks))


@given(
    total=st.integers(0, 300), start=st.integers(0, 300), world=worlds, block=blocks, cut=st.integers(0, 100)
)
@settings(max_examples=200, deadline=None)
def test_what_ranks_delivered_is_a_prefix_of_the_global_order(total, start, world, block, cut):
    assume(start <= total)
    parts = [Partition(start, total, world, r, block) for r in range(world)]
    m = min(cut, parts[0].num_chunks)
    consumed = {x for p in parts for x in positions(p, range(m))}
    end = parts[0].consumed_after(parts[0].samples_through(m - 1))
    assert consumed == set(range(start, end))


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
    start = 0
    for leg, world in enumerate(worlds_seq):
        parts = [Partition(start, total, world, r, block_seq[leg]) for r in range(world)]
        last = leg == len(worlds_seq) - 1
        m = parts[0].num_chunks if last else min(cuts[leg], parts[0].num_chunks)
        for p in parts:
            seen.extend(positions(p, range(m)))
        start = parts[0].consumed_after(parts[0].samples_through(m - 1))
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    assert set(seen) == set(range(start)), "the consumed prefix has a hole"
    assert total - start < worlds_seq[-1], "more than the last world's remainder was left out"


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
    part = Partition(start, plan.records, world, 0, block)
    for w in range(workers):
        chunks = part.worker_chunks(w, workers)
        expected = []
        for c in chunks:
            pos, n = part.chunk(c)
            for win, _, _ in plan.segments(pos, pos + n):
                if not expected or expected[-1] != win:
                    expected.append(win)
        assert list(touched_windows(plan, part, chunks)) == expected
