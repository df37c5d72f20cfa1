"""Arrow types to torch values, through real shard files, in batch and per-sample mode."""

from __future__ import annotations

import datetime as dt
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.config import CacheConfig
from datastore import Repo
from loaders import ArrowFileSource, StreamingDataLoader, StreamingDataset
from loaders.decoded import DecodedShard, GatheredRows, batch_from_pieces, slice_rows


@pytest.fixture
def typed_source(tmp_path):
    table = pa.table(
        {
            "i8": pa.array([1, -2, 3], pa.int8()),
            "u16": pa.array([1, 2, 65535], pa.uint16()),
            "f": pa.array([1.5, None, 3.0], pa.float32()),
            "n": pa.array([None, 5, 6], pa.int64()),
            "flag": pa.array([True, False, True]),
            "img": pa.array(
                [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]],
                pa.list_(pa.list_(pa.uint8(), 2), 2),
            ),
            "when": pa.array([dt.datetime(2024, 1, 1), None, dt.datetime(2024, 1, 2)], pa.timestamp("us")),
            "day": pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)], pa.date32()),
            "ragged": pa.array([[1.0], None, [2.0, 3.0, 4.0]], pa.large_list(pa.float64())),
            "blob": pa.array([b"a", None, b"ccc"], pa.large_binary()),
            "cat": pa.array(["x", "y", "x"]).dictionary_encode(),
            "meta": pa.array([{"a": 1}, {"a": 2}, None], pa.struct([("a", pa.int32())])),
        }
    )
    path = tmp_path / "typed.arrow"
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer,
    ):
        writer.write_table(table, max_chunksize=2)
    return ArrowFileSource([path])


def test_every_type_becomes_the_documented_batch_value(typed_source):
    batch = next(iter(StreamingDataset(typed_source, batch_size=3)))
    assert batch["i8"].dtype == torch.int8 and batch["i8"].tolist() == [1, -2, 3]
    assert batch["u16"].dtype == torch.uint16 and batch["u16"].to(torch.int32).tolist() == [1, 2, 65535]
    f = batch["f"]
    assert f.dtype == torch.float32 and f[0] == 1.5 and torch.isnan(f[1]) and f[2] == 3.0
    assert batch["n"].tolist() == [0, 5, 6]
    assert batch["flag"].dtype == torch.bool and batch["flag"].tolist() == [True, False, True]
    assert batch["img"].shape == (3, 2, 2) and batch["img"][2].tolist() == [[9, 10], [11, 12]]
    assert batch["when"].dtype == torch.int64 and batch["when"][1] == 0
    assert batch["when"][2] - batch["when"][0] == 86_400_000_000
    assert batch["day"].dtype == torch.int32 and batch["day"].tolist() == [19723, 19724, 19725]
    assert batch["ragged"].tolist() == [[1.0, 0, 0], [0, 0, 0], [2.0, 3.0, 4.0]]
    assert batch["ragged_lengths"].tolist() == [1, 0, 3]
    assert batch["blob"] == [b"a", None, b"ccc"]
    assert batch["cat"] == ["x", "y", "x"]
    assert batch["meta"] == [{"a": 1}, {"a": 2}, None]


def test_per_sample_values(typed_source):
    samples = list(StreamingDataset(typed_source, columns=["i8", "img", "ragged", "blob", "cat"]))
    assert [s["i8"] for s in samples] == [1, -2, 3]
    assert samples[1]["img"].tolist() == [[5, 6], [7, 8]]
    assert [s["ragged"].tolist() for s in samples] == [[1.0], [], [2.0, 3.0, 4.0]]
    assert samples[2]["blob"] == b"ccc" and samples[0]["cat"] == "x"


def test_shuffled_batches_gather_the_same_values(typed_source):
    rows = {}
    for batch in StreamingDataset(typed_source, batch_size=2, shuffle=True, shuffle_window=1):
        for i, v, r in zip(batch["i8"].tolist(), batch["img"], batch["ragged_lengths"].tolist()):
            rows[i] = (v.tolist(), r)
    assert rows == {1: ([[1, 2], [3, 4]], 1), -2: ([[5, 6], [7, 8]], 0), 3: ([[9, 10], [11, 12]], 3)}


@pytest.fixture
def bool_repo(tmp_path):
    table = pa.table(
        {
            "id": pa.array(range(6), pa.int64()),
            "b": pa.array([True, None, False, None, True, True], pa.bool_()),
            "lb": pa.array(
                [[True, None], None, [None, False, True], [], [None], [True]], pa.list_(pa.bool_())
            ),
        }
    )
    pq.write_table(table, tmp_path / "bools.parquet")
    repo = Repo.init(tmp_path / "repo", workspace=None)
    repo.ingest(tmp_path / "bools.parquet")
    repo.commit("bools")
    cache = CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=8 << 20, ssd_bytes=8 << 20
    )
    return str(tmp_path / "repo"), cache


B = [True, False, False, False, True, True]
LB = [[True, False], [], [False, False, True], [], [False], [True]]


@pytest.mark.parametrize("shuffle", [False, True])
def test_nulls_in_boolean_columns_and_lists_become_false(bool_repo, shuffle):
    repo, cache = bool_repo
    (batch,) = list(StreamingDataset(repo, cache=cache, batch_size=6, shuffle=shuffle))
    order = batch["id"].tolist()
    assert batch["b"].dtype == torch.bool and batch["b"].tolist() == [B[i] for i in order]
    assert batch["lb"].dtype == torch.bool
    assert batch["lb_lengths"].tolist() == [len(LB[i]) for i in order]
    for row, n, i in zip(batch["lb"].tolist(), batch["lb_lengths"].tolist(), order):
        assert row[:n] == LB[i] and not any(row[n:])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_nulls_in_boolean_columns_per_sample_through_the_default_collate(bool_repo, num_workers):
    repo, cache = bool_repo
    samples = list(StreamingDataset(repo, cache=cache))
    assert [s["b"] for s in samples] == B
    assert [s["lb"].tolist() for s in samples] == LB
    loader = StreamingDataLoader(
        StreamingDataset(repo, cache=cache, columns=["b"]), batch_size=3, num_workers=num_workers
    )
    assert [v for batch in loader for v in batch["b"].tolist()] == B


def _shard(index: int, values: list[int], cuts: list[int]) -> DecodedShard:
    """A decoded shard of columns derived from ``values``, its record batches cut at ``cuts``."""
    table = pa.table(
        {
            "x": pa.array(values, pa.int64()),
            "pair": pa.array([[v, -v] for v in values], pa.list_(pa.int16(), 2)),
            "word": pa.array([f"w{v}" for v in values]),
            "var": pa.array([list(range(v % 3)) for v in values], pa.list_(pa.int32())),
        }
    )
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(values))), len(values)]
    batches = [b for a, z in itertools.pairwise(bounds) for b in table.slice(a, z - a).to_batches()]
    return DecodedShard(index, f"s{index}", pa.Table.from_batches(batches))


def test_batches_own_their_memory_and_never_pin_a_shard():
    shard = _shard(0, list(range(20)), [10])
    assert shard.bounds.tolist() == [0, 10, 20]
    kinds, piece = slice_rows(shard, 2, 5)
    out: dict = {}
    kinds["x"].emit("x", piece["x"], out)
    tensor = out["x"]
    assert tensor.tolist() == [2, 3, 4]
    assert tensor.untyped_storage().nbytes() == 3 * 8, "a slice must not share the shard's storage"
    tensor += 1  # writable, and the shard is unchanged
    assert slice_rows(shard, 2, 3)[1]["x"].tolist() == [2]
    assert slice_rows(shard, 8, 13)[1]["x"].tolist() == [8, 9, 10, 11, 12]
    assert slice_rows(shard, 8, 13)[1]["word"] == ["w8", "w9", "w10", "w11", "w12"]
    other = _shard(1, list(range(100, 110)), [])
    gathered = GatheredRows(4)
    gathered.add({0: shard, 1: other}, np.array([1, 0, 1, 0]), np.array([3, 15, 0, 1]))
    kinds, piece = gathered.finish().take(0, 4)
    batch = batch_from_pieces(kinds, [piece])
    assert batch["x"].tolist() == [103, 15, 100, 1] and batch["word"] == ["w103", "w15", "w100", "w1"]
    # the blocks are reused by the next group: what was handed out must not change
    again = GatheredRows(4, gathered.blocks)
    again.add({0: shard}, 0, np.array([5, 6, 7, 8]))
    assert again.finish().take(0, 4)[1]["x"].tolist() == [5, 6, 7, 8]
    assert batch["x"].tolist() == [103, 15, 100, 1] and batch["word"] == ["w103", "w15", "w100", "w1"]
    # a smaller group reuses them too, and no value of an earlier group stays alive in the tail
    blocks = again.blocks
    small = GatheredRows(2, blocks)
    small.add({0: shard}, 0, np.array([9, 2]))
    assert small.finish().take(0, 2)[1]["word"] == ["w9", "w2"]
    assert small.blocks["word"] is blocks["word"] and small.blocks["x"] is blocks["x"]
    assert all(v is None for v in small.blocks["word"][2:])


def test_a_subset_of_a_shard_keeps_its_records_and_refuses_others():
    shard = _shard(3, list(range(100, 130)), [7, 20])
    part = shard.subset(np.array([1, 8, 9, 25]))
    assert part.index == 3 and part.rows == 4 and part.bounds.tolist() == [0, 4]
    gathered = GatheredRows(3)
    gathered.add({3: part}, 3, np.array([25, 1, 9]))
    kinds, piece = gathered.finish().take(0, 3)
    batch = batch_from_pieces(kinds, [piece])
    assert batch["x"].tolist() == [125, 101, 109] and batch["word"] == ["w125", "w101", "w109"]
    assert batch["pair"].tolist() == [[125, -125], [101, -101], [109, -109]]
    with pytest.raises(RuntimeError, match="fewer records"):
        part.local(np.array([2]))
    assert shard.subset(np.array([], dtype=np.int64)).rows == 0


@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=4),
    cuts=st.lists(st.integers(1, 29), max_size=6),
    data=st.data(),
)
@settings(max_examples=100, deadline=None)
def test_gathered_rows_are_the_addressed_records_in_order(sizes, cuts, data):
    """Whatever the chunking and however the positions are split into adds and takes."""
    shards, start = {}, 0
    for i, n in enumerate(sizes):
        shards[i] = _shard(i, list(range(start, start + n)), cuts)
        start += n
    firsts = np.cumsum([0, *sizes[:-1]])
    n = data.draw(st.integers(1, 60))
    which = np.array(data.draw(st.lists(st.integers(0, len(sizes) - 1), min_size=n, max_size=n)))
    rows = np.array([data.draw(st.integers(0, sizes[w] - 1)) for w in which.tolist()])
    expect = (firsts[which] + rows).tolist()
    gathered = GatheredRows(n)
    cut_points = sorted(set([*data.draw(st.lists(st.integers(1, n), max_size=3)), n]))
    lo = 0
    for hi in cut_points:
        if data.draw(st.booleans()) and len(set(which[lo:hi].tolist())) == 1:
            gathered.add(shards, int(which[lo]), rows[lo:hi])
        else:
            gathered.add(shards, which[lo:hi], rows[lo:hi])
        lo = hi
    gathered.finish()
    got, at = [], 0
    while at < n:
        end = min(n, at + data.draw(st.integers(1, n)))
        kinds, piece = gathered.take(at, end)
        batch = batch_from_pieces(kinds, [piece])
        assert batch["pair"].tolist() == [[v, -v] for v in batch["x"].tolist()]
        assert batch["word"] == [f"w{v}" for v in batch["x"].tolist()]
        assert batch["var_lengths"].tolist() == [v % 3 for v in batch["x"].tolist()]
        got += batch["x"].tolist()
        at = end
    assert got == expect


def test_gathering_lets_go_of_the_pages_it_has_copied_as_it_goes():
    # A shared (mapped) shard's pages are dropped every ~1 MiB of records gathered, not
    # only when the block is done: random rows touch whole pages, so a 2048-row block
    # would otherwise map several times its own size.
    from loaders.decoded import DROP_BYTES

    texts = pa.array([f"{i:08d}" + "x" * 1016 for i in range(8192)])  # 1 KB records
    table = pa.Table.from_batches(pa.table({"text": texts}).to_batches(max_chunksize=256))
    drops: list[int] = []
    shard = DecodedShard(0, "s0", table, drop_pages=lambda: drops.append(1))
    assert shard.shared and not DecodedShard(1, "s1", table).shared
    rows = np.random.default_rng(0).permutation(8192)[:2048]
    gathered = GatheredRows(len(rows))
    for part in np.array_split(rows, 4):  # four adds: drops carry across them
        gathered.add({0: shard}, 0, part)
    gathered.finish()
    record = shard.row_bytes
    assert len(drops) >= len(rows) * record // (2 * DROP_BYTES)
    assert len(drops) <= len(rows) * record // DROP_BYTES + 1
    kinds, piece = gathered.take(0, len(rows))
    assert [int(t[:8]) for t in batch_from_pieces(kinds, [piece])["text"]] == rows.tolist()


def _where_tensors_live(batch):
    """A transform, run in the worker: whether each tensor of the batch is in shared memory."""
    return {k: v.is_shared() for k, v in batch.items() if isinstance(v, torch.Tensor)}


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_workers_make_batch_tensors_in_shared_memory_the_training_process_in_its_own(typed_source):
    columns = ["i8", "f", "img", "ragged"]
    ds = StreamingDataset(typed_source, columns=columns, batch_size=2, transform=_where_tensors_live)
    in_workers = list(StreamingDataLoader(ds, num_workers=2))
    in_process = list(StreamingDataLoader(ds, num_workers=0))
    assert len(in_workers) == len(in_process) == 2
    expected_keys = {*columns, "ragged_lengths"}
    assert all(set(b) == expected_keys and all(b.values()) for b in in_workers)
    assert all(set(b) == expected_keys and not any(b.values()) for b in in_process)
