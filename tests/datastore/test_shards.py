"""Shards: round trips, deterministic bytes, content-defined boundaries, record hashes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError, IntegrityError
from datastore import recordhash
from datastore.recordhash import HASH_COLUMN, hash_records, record_hashes
from datastore.shards import (
    BoundaryCutter,
    ShardOptions,
    ShardWriter,
    read_record_hashes,
    read_shard,
    read_shard_schema,
    shard_batches,
    write_shards,
)
from datastore.source import decode_shard
from datastore.sources import read_table

SMALL = ShardOptions(shard_size=4096)


def roundtrip(table: pa.Table, options: ShardOptions = SMALL) -> tuple[pa.Table, list]:
    shards = list(write_shards(table.to_batches(max_chunksize=100), options))
    back = pa.concat_tables([read_shard(s.data) for s in shards]) if shards else table.slice(0, 0)
    return back, shards


def text_records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    return [
        {"id": i, "text": " ".join(rng.choice(words, int(rng.integers(5, 30)))), "score": float(rng.random())}
        for i in range(n)
    ]


# ---------------------------------------------------------------- round trips


def test_roundtrip_of_every_tabular_format(tmp_path: Path) -> None:
    rows = text_records(500)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.csv").write_text(
        "id,text,score\n" + "".join(f"{r['id']},{r['text']},{r['score']!r}\n" for r in rows)
    )
    (tmp_path / "a.txt").write_text("".join(r["text"] + "\n" for r in rows))
    for name in ("a.jsonl", "a.csv", "a.txt"):
        table, _ = read_table([tmp_path / name])
        back, shards = roundtrip(table)
        assert len(shards) > 3
        assert back.equals(table), name
    assert roundtrip(read_table([tmp_path / "a.jsonl"])[0])[0].to_pylist() == rows


def test_parquet_types_survive_exactly(tmp_path: Path) -> None:
    original = pa.table(
        {
            "u16": pa.array([1, 2, None], pa.uint16()),
            "f32": pa.array([1.5, None, -0.0], pa.float32()),
            "ts": pa.array([1, None, 3], pa.timestamp("ns", tz="Europe/Paris")),
            "day": pa.array([1, 2, 3], pa.date32()),
            "dec": pa.array([1, 2, None], pa.decimal128(12, 3)),
            "bin": pa.array([b"\x00", None, b""], pa.binary()),
            "nested": pa.array([{"a": [1, None]}, None, {"a": []}], pa.struct([("a", pa.list_(pa.int16()))])),
            "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
        }
    )
    pq.write_table(original, tmp_path / "t.parquet")
    table, _ = read_table([tmp_path / "t.parquet"])
    back, _ = roundtrip(table)
    assert back.schema.equals(table.schema)
    assert back.equals(original)


def test_read_shard_columns_and_hidden_hash() -> None:
    table = pa.table({"a": list(range(50)), "b": [str(i) for i in range(50)]})
    (shard,) = write_shards(table.to_batches(), ShardOptions())
    assert read_shard(shard.data).column_names == ["a", "b"]
    assert read_shard(shard.data, ["b"]).column_names == ["b"]
    assert read_shard(shard.data, ["b", "a"]).column_names == ["b", "a"]
    full = read_shard(shard.data, with_hidden=True)
    assert full.column_names == ["a", "b", HASH_COLUMN]
    assert full.column(HASH_COLUMN).combine_chunks().equals(record_hashes(table))
    assert read_record_hashes(shard.data) == record_hashes(table).to_pylist()
    assert read_shard_schema(shard.data).names == ["a", "b"]
    with pytest.raises(BadInputError, match="'c'"):
        read_shard(shard.data, ["c"])
    with pytest.raises(IntegrityError):
        read_shard(shard.data[: len(shard.data) // 2])
    assert shard.records == 50 and shard.bytes == len(shard.data) and shard.uncompressed_bytes > 0


def test_a_decoded_shard_is_read_in_place() -> None:
    table = pa.table({"a": np.arange(300_000), "b": np.arange(300_000) * 2})
    (shard,) = write_shards(table.to_batches(), ShardOptions())
    plain = pa.py_buffer(decode_shard(shard.data))
    before = pa.total_allocated_bytes()
    picked = read_shard(plain, ["b"], plain=True)
    assert pa.total_allocated_bytes() == before  # views of the decoded buffer, no copy
    assert picked.column_names == ["b"] and picked.column("b").equals(table.column("b"))
    assert read_shard(plain).equals(table)


def test_decoding_batch_by_batch_gives_the_bytes_of_the_whole_table() -> None:
    # decode_shard streams one decompressed batch at a time into the plain copy; the bytes
    # must be those of the table read whole (the RAM tier's copies are compared by size).
    table = pa.Table.from_pylist(text_records(30_000))
    shard = max(write_shards(table.to_batches(), ShardOptions(shard_size=4 << 20)), key=lambda s: s.bytes)
    schema, batches = shard_batches(shard.data)
    assert len(list(batches)) > 1
    whole = read_shard(shard.data, with_hidden=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(whole)
    assert decode_shard(shard.data).equals(sink.getvalue())
    with pytest.raises(IntegrityError):
        shard_batches(shard.data[: len(shard.data) // 2])


# ---------------------------------------------------------------- determinism

records_strategy = st.lists(
    st.fixed_dictionaries(
        {
            "i": st.one_of(st.none(), st.integers(-(2**62), 2**62)),
            "s": st.one_of(st.none(), st.text(max_size=30)),
            "l": st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=5)),
        }
    ),
    min_size=1,
    max_size=300,
)
SCHEMA = pa.schema([("i", pa.int64()), ("s", pa.string()), ("l", pa.list_(pa.int64()))])


@settings(max_examples=40, deadline=None)
@given(records=records_strategy, cuts=st.lists(st.integers(0, 300), max_size=6), size=st.integers(1024, 8192))
def test_same_records_give_same_shards_whatever_the_batching(records, cuts, size: int) -> None:
    table = pa.Table.from_pylist(records, schema=SCHEMA)
    options = ShardOptions(shard_size=size)
    one = list(write_shards(table.to_batches(), options))
    bounds = sorted({0, len(records), *(c for c in cuts if c < len(records))})
    pieces = [table.slice(a, b - a).to_batches()[0] for a, b in itertools.pairwise(bounds)]
    pieces = [pa.Table.from_pylist(p.to_pylist(), schema=SCHEMA).to_batches()[0] for p in pieces]
    other = list(write_shards(pieces, options))
    assert [s.hash for s in one] == [s.hash for s in other]
    assert [s.data for s in one] == [s.data for s in other]
    assert [s.uncompressed_bytes for s in one] == [s.uncompressed_bytes for s in other]
    assert pa.concat_tables([read_shard(s.data) for s in one]).to_pylist() == table.to_pylist()
    sizes = hash_records(table).sizes
    ends = np.cumsum([s.records for s in one])
    shard_bytes = np.diff(np.concatenate([[0], np.cumsum(sizes)[ends - 1]]))
    assert all(b >= options.min_size for b in shard_bytes[:-1])
    assert all(b - sizes[e - 1] < options.max_size for b, e in zip(shard_bytes, ends))


_CHILD = """
import json, sys
import pyarrow as pa
from datastore.shards import ShardOptions, write_shards
rows = [{"id": i, "text": "w" * (i % 97), "f": i / 7} for i in range(20000)]
table = pa.Table.from_pylist(rows)
print(json.dumps([s.hash for s in write_shards(table.to_batches(max_chunksize=int(sys.argv[1])),
                                                   ShardOptions(shard_size=65536))]))
"""


def test_two_processes_give_the_same_shard_hashes() -> None:
    outs = []
    for chunk, seed in (("1000", "1"), ("7777", "2")):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, chunk], capture_output=True, text=True, env=env, check=True
        )
        outs.append(json.loads(done.stdout))
    assert len(outs[0]) > 5
    assert outs[0] == outs[1]


# ---------------------------------------------------------------- content-defined boundaries


def _shard_bytes_new(before: list, after: list) -> float:
    old = {s.hash for s in before}
    return sum(s.bytes for s in after if s.hash not in old) / sum(s.bytes for s in after)


def test_clustered_one_percent_edit_rewrites_few_shards() -> None:
    rows = text_records(20_000)
    options = ShardOptions(shard_size=64 << 10)
    before = list(write_shards(pa.Table.from_pylist(rows).to_batches(max_chunksize=2048), options))
    for i in range(9_000, 9_200):  # 1% of the records, side by side
        rows[i] = {**rows[i], "text": rows[i]["text"] + " edited"}
    after = list(write_shards(pa.Table.from_pylist(rows).to_batches(max_chunksize=2048), options))
    assert len(before) > 30
    assert _shard_bytes_new(before, after) <= 0.10


def test_scattered_one_percent_edit_with_small_shards() -> None:
    """Edits at random places: a shard of k records is rewritten with chance 1 - 0.99**k."""
    rows = text_records(20_000)
    options = ShardOptions(shard_size=1024)  # about 6 records a shard
    table = pa.Table.from_pylist(rows)
    before = list(write_shards(table.to_batches(max_chunksize=4096), options))
    rng = np.random.default_rng(7)
    for i in rng.choice(len(rows), len(rows) // 100, replace=False):
        rows[int(i)] = {**rows[int(i)], "score": -1.0}
    after = list(write_shards(pa.Table.from_pylist(rows).to_batches(max_chunksize=4096), options))
    assert 20_000 / len(before) <= 10
    assert _shard_bytes_new(before, after) <= 0.10


def _all_cuts(prefixes: np.ndarray, sizes: np.ndarray, options: ShardOptions, pieces: list[int]) -> list[int]:
    """The cuts of one cutter fed the records in pieces of these lengths (then the rest)."""
    cutter, cuts, start = BoundaryCutter(options), [], 0
    for end in [*itertools.accumulate(pieces), len(sizes)]:
        end = min(end, len(sizes))
        cuts += [start + c for c in cutter.feed(prefixes[start:end], sizes[start:end])]
        start = max(start, end)
    return cuts


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 400),
    split=st.integers(0, 400),
    shard_size=st.sampled_from([1024, 4096, 16384]),
    big=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
    pieces=st.lists(st.integers(1, 50), max_size=6),
)
def test_sync_point_is_a_cut_whatever_came_before(n, split, shard_size, big, seed, pieces) -> None:
    """Two-process ingest rests on this: the cuts after a slice's sync point are those of
    one cutter fed everything, from any start and in any pieces."""
    rng = np.random.default_rng(seed)
    options = ShardOptions(shard_size=shard_size)
    sizes = rng.integers(1, int(shard_size * 4 * big) + 2, n).astype(np.int64)
    prefixes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    split = min(split, n)
    sync = BoundaryCutter(options).sync_point(prefixes[split:], sizes[split:])
    whole = _all_cuts(prefixes, sizes, options, pieces)
    if sync is None:
        return
    assert 0 < sync <= n - split
    assert split + sync in whole
    tail = _all_cuts(prefixes[split + sync :], sizes[split + sync :], options, [])
    assert [split + sync + c for c in tail] == [c for c in whole if c > split + sync]


def test_sync_point_is_found_near_the_start() -> None:
    rng = np.random.default_rng(1)
    options = ShardOptions(shard_size=64 << 10)
    sizes = rng.integers(8 << 10, 12 << 10, 2000).astype(np.int64)
    prefixes = rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64)
    sync = BoundaryCutter(options).sync_point(prefixes, sizes)
    assert sync is not None and sizes[:sync].sum() <= 6 * options.max_size


def test_insert_at_the_front_resynchronises() -> None:
    rows = text_records(5_000)
    options = ShardOptions(shard_size=16 << 10)
    before = list(write_shards(pa.Table.from_pylist(rows).to_batches(), options))
    after = list(write_shards(pa.Table.from_pylist([*text_records(3, seed=9), *rows]).to_batches(), options))
    assert len({s.hash for s in before} & {s.hash for s in after}) >= len(before) - 3


def test_writer_emits_shards_as_it_goes() -> None:
    writer = ShardWriter(ShardOptions(shard_size=4096))
    emitted = []
    for batch in pa.Table.from_pylist(text_records(3000)).to_batches(max_chunksize=100):
        emitted.append(writer.add(batch))
    assert sum(map(len, emitted[:5])) >= 1 and sum(map(len, emitted)) > 10
    tail = writer.finish()
    assert len(tail) <= 1 and writer.finish() == []
    assert sum(p.records for group in [*emitted, tail] for p in group) == 3000


# ---------------------------------------------------------------- record hashes


def test_record_hash_depends_on_names_types_values_and_nulls() -> None:
    base = pa.table({"a": [1, None], "s": ["x", ""]})
    h = record_hashes(base).to_pylist()
    assert len(set(h)) == 2
    assert record_hashes(base.rename_columns(["b", "s"])).to_pylist() != h
    assert record_hashes(base.cast(pa.schema([("a", pa.int32()), ("s", pa.string())]))).to_pylist() != h
    assert record_hashes(pa.table({"a": [1, None], "s": ["x", None]})).to_pylist()[1] != h[1]
    assert record_hashes(base.cast(pa.schema([("a", pa.int64()), ("s", pa.large_string())]))).to_pylist() == h
    nested = pa.table({"l": pa.array([["ab"], ["a", "b"]])})
    assert len(set(record_hashes(nested).to_pylist())) == 2


def test_wide_rows_hash_the_same_in_place_and_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    big = [os.urandom(5000) for _ in range(50)] + [None]
    table = pa.table({"p": [str(i) for i in range(51)], "d": pa.array(big, pa.large_binary())})
    in_place = hash_records(table)
    monkeypatch.setattr(recordhash, "_DIRECT_FROM", 1 << 62)
    copied = hash_records(table)
    assert in_place.hashes.equals(copied.hashes)
    assert list(in_place.sizes) == list(copied.sizes)
