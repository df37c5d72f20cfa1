"""Arrow types to torch values, through real shard files, in batch and per-sample mode."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import ArrowFileSource, StreamingDataset
from loaders.columns import NumericKind, kind_of
from loaders.decoded import SlotRing


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


def test_batches_own_their_memory_and_never_pin_a_shard():
    kind = kind_of(pa.int64())
    assert isinstance(kind, NumericKind)
    data = kind.prepare(
        [pa.array(np.arange(10, dtype=np.int64)), pa.array(np.arange(10, 20, dtype=np.int64))]
    )
    out: dict = {}
    kind.emit("x", kind.take(data, slice(2, 5)), out)
    tensor = out["x"]
    assert tensor.tolist() == [2, 3, 4]
    assert tensor.untyped_storage().nbytes() == 3 * 8, "a slice must not share the shard's storage"
    tensor += 1  # writable, and the shard is unchanged
    assert kind.take(data, slice(2, 3)).tolist() == [2]
    assert kind.take(data, slice(8, 13)).tolist() == [8, 9, 10, 11, 12]
    assert kind.take(data, np.array([15, 1, 19])).tolist() == [15, 1, 19]
    other = kind.prepare([pa.array(np.arange(100, 110, dtype=np.int64))])
    kind.emit("x", kind.gather([data, other], np.array([1, 0, 1, 0]), np.array([3, 15, 0, 1])), out)
    assert out["x"].tolist() == [103, 15, 100, 1]
    strings = kind_of(pa.string())
    a, b = strings.prepare([pa.array(["a", "b"])]), strings.prepare([pa.array(["c", "d"])])
    assert strings.gather([a, b], np.array([1, 0, 0, 1]), np.array([1, 1, 0, 0])) == ["d", "b", "a", "c"]


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30), held=st.integers(1, 5))
@settings(max_examples=100, deadline=None)
def test_slot_ring_reservations_never_overlap(sizes, held):
    """Reserve in order, keep at most ``held`` alive, release in order: live rows never overlap."""
    ring = SlotRing(sum(sorted(sizes, reverse=True)[:held]) + max(sizes))
    live = []
    for n in sizes:
        if len(live) == held:
            ring.release(live.pop(0)[0])
        base = ring.reserve(n)
        assert base is not None, "a ring sized for the shards held at once must fit the next one"
        assert base >= 0 and base + n <= ring.capacity
        for b, m in live:
            assert base + n <= b or b + m <= base, "two live shards share rows"
        live.append((base, n))


def test_slot_ring_stores_columns_of_several_shards_for_one_gather():
    ring = SlotRing(10)
    kind = kind_of(pa.list_(pa.int16(), 2))
    a = ring.store("x", kind, ring.reserve(3), [pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int16(), 2))])
    b = ring.store("x", kind, ring.reserve(2), [pa.array([[7, 8]], pa.list_(pa.int16(), 2))] * 2)
    assert a.array is b.array
    assert kind.gather([a, b], np.array([1, 0, 0]), np.array([1, 2, 0])).tolist() == [[7, 8], [5, 6], [1, 2]]
    words = kind_of(pa.string())
    s1 = ring.store_objects("w", 0, ["a", "b", "c"])
    s2 = ring.store_objects("w", 3, ["d", "e"])
    assert words.gather([s1, s2], np.array([1, 0]), np.array([1, 2])) == ["e", "c"]
    assert words.take(s2, slice(0, 2)) == ["d", "e"]
