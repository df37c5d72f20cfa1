"""The batches a reader assembles are the records of its positions, in order.

Held against the plan itself: for any shards, window, shuffle block, batch size, ranks and
DataLoader workers, each batch ``batch_rows`` yields holds the records that the plan puts
at the positions of that batch's span, read through a real :class:`ShardPrefetcher`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.assemble import batch_rows
from loaders.decoded import DecodedShard, batch_from_pieces
from loaders.partition import Partition, Remaining
from loaders.plan import EpochPlan, make_plan
from loaders.prefetch import ShardPrefetcher, needed_shards, touched_windows


def _expected(plan: EpochPlan, runs: list[tuple[int, int]], base: dict[str, int]) -> list[int]:
    """The record values the plan puts at the positions of ``runs``."""
    out: list[int] = []
    for pos, n in runs:
        for w, lo, hi in plan.segments(pos, pos + n):
            which, rows = plan.window_rows(w, lo, hi)
            rows = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
            which = np.full(len(rows), which) if np.ndim(which) == 0 else which
            out.extend(base[plan.shard_ids[int(s)]] + int(r) for s, r in zip(which, rows))
    return out


@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=6),
    window=st.integers(1, 3),
    block=st.integers(0, 300),
    batch=st.integers(1, 40),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    seed=st.integers(0, 2**16),
    shuffle=st.booleans(),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_each_batch_holds_the_records_of_its_positions(
    sizes, window, block, batch, world, workers, seed, shuffle, data
):
    rank = data.draw(st.integers(0, world - 1))
    worker = data.draw(st.integers(0, workers - 1))
    ids = [f"s{i}" for i in range(len(sizes))]
    base = dict(zip(ids, np.cumsum([0, *sizes[:-1]]).tolist()))
    # records weigh 8 units each: a block of ``block`` units holds about block / 8 of them
    plan = make_plan(
        "v",
        list(zip(ids, sizes)),
        seed=seed,
        epoch=0,
        shuffle=shuffle,
        window=window,
        weights=[8 * n for n in sizes],
        block=block,
    )

    def load(i: int) -> DecodedShard:
        shard_id = plan.shard_ids[i]
        values = pa.array(range(base[shard_id], base[shard_id] + plan.counts[i]), pa.int64())
        # record batches of 7 rows: blocks and runs cross chunks too
        return DecodedShard(i, shard_id, pa.Table.from_batches(pa.table({"x": values}).to_batches(7)))

    part = Partition(Remaining(plan.records), world, rank, batch, False)
    chunks = part.worker_chunks(worker, workers)
    spans = [part.chunk(c) for c in chunks]
    order = needed_shards(plan, touched_windows(plan, part, chunks))
    with ShardPrefetcher(load, order, depth=1, threads=1) as shards:
        got = [
            (batch_from_pieces(kinds, parts)["x"].tolist(), n)
            for kinds, parts, n in batch_rows(plan, shards, spans)
        ]
    assert len(got) == len(spans)
    for (values, n), runs in zip(got, spans):
        assert n == len(values) == sum(k for _, k in runs)
        assert values == _expected(plan, runs, base)
