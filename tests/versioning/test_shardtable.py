from __future__ import annotations

import os
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError, IntegrityError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from versioning import ShardEntry, ShardTable, load_shard_table, save_shard_table

hex_ids = st.binary(min_size=32, max_size=32).map(bytes.hex)
entries = st.builds(
    ShardEntry,
    hash=hex_ids,
    records=st.integers(0, 10**9),
    bytes=st.integers(0, 10**12),
    uncompressed_bytes=st.integers(0, 10**12),
    first_record=st.just(0),
    chunks=st.lists(hex_ids, max_size=3).map(tuple),
)


def entry(n: int, records: int = 10, chunks: tuple[str, ...] = ()) -> ShardEntry:
    return ShardEntry(f"{n:064x}", records, 100 * records, 200 * records, 0, chunks)


def test_entries_index_iterate_and_totals():
    table = ShardTable.from_entries([entry(1, 5), entry(2, 0), entry(3, 7, (f"{9:064x}",))])
    assert len(table) == 3
    assert [e.first_record for e in table] == [0, 5, 5]
    assert table[2] == ShardEntry(f"{3:064x}", 7, 700, 1400, 5, (f"{9:064x}",))
    assert table[-1] == table[2]
    assert list(table) == [table[0], table[1], table[2]]
    assert table[1:] == [table[1], table[2]]
    assert table.hashes() == [f"{n:064x}" for n in (1, 2, 3)]
    assert table.records_total == 12
    assert table.bytes_total == 1200
    assert table.chunk_ids() == {f"{9:064x}"}
    with pytest.raises(IndexError, match="3"):
        table[3]


def test_locate_finds_shard_by_binary_search_skipping_empty_shards():
    table = ShardTable.from_entries([entry(1, 5), entry(2, 0), entry(3, 7), entry(4, 1)])
    assert table.locate(0) == (0, 0)
    assert table.locate(4) == (0, 4)
    assert table.locate(5) == (2, 0)
    assert table.locate(11) == (2, 6)
    assert table.locate(12) == (3, 0)
    for bad in (-1, 13):
        with pytest.raises(IndexError, match=str(bad)):
            table.locate(bad)


def test_concat_recomputes_first_record():
    a = ShardTable.from_entries([entry(1, 5), entry(2, 3)])
    b = ShardTable.from_entries([entry(3, 4, (f"{7:064x}",))])
    both = a.concat(b)
    assert [e.first_record for e in both] == [0, 5, 8]
    assert both.records_total == 12
    assert both[2].chunks == (f"{7:064x}",)
    assert ShardTable.empty().concat(a) == a
    assert both == ShardTable.from_entries([*a, *b])


def test_from_arrays_matches_from_entries():
    ids = [f"{n:064x}" for n in range(5)]
    by_arrays = ShardTable.from_arrays(ids, [1, 2, 3, 4, 5], [10] * 5, [20] * 5, [[], [ids[0]], [], [], []])
    by_entries = ShardTable.from_entries(
        [
            ShardEntry(h, r, 10, 20, 0, (ids[0],) if i == 1 else ())
            for i, (h, r) in enumerate(zip(ids, range(1, 6)))
        ]
    )
    assert by_arrays == by_entries
    assert by_arrays.encode() == by_entries.encode()


@settings(max_examples=40, deadline=None)
@given(st.lists(entries, max_size=30))
def test_encoding_is_deterministic_and_round_trips(items):
    table = ShardTable.from_entries(items)
    data = table.encode()
    assert ShardTable.from_entries(items).encode() == data
    back = ShardTable.decode(data)
    assert back == table
    assert back.encode() == data
    assert [(e.hash, e.records, e.bytes, e.uncompressed_bytes, e.chunks) for e in back] == [
        (e.hash, e.records, e.bytes, e.uncompressed_bytes, e.chunks) for e in items
    ]


def test_different_entries_give_different_bytes():
    a = ShardTable.from_entries([entry(1), entry(2)])
    b = ShardTable.from_entries([entry(2), entry(1)])
    assert a.encode() != b.encode()


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        ({"hash": "xyz"}, "'xyz'"),
        ({"hash": "A" * 64}, "A" * 64),
        ({"records": -3}, "-3"),
        ({"bytes": 1.5}, "1.5"),
        ({"chunks": ("nope",)}, "'nope'"),
    ],
)
def test_bad_entries_are_quoted(kwargs, quoted):
    fields = {"hash": "a" * 64, "records": 1, "bytes": 1}
    fields.update(kwargs)
    with pytest.raises(BadInputError) as info:
        ShardEntry(**fields)
    assert quoted in str(info.value)


def test_bad_arrays_are_refused():
    with pytest.raises(BadInputError, match="negative: -1"):
        ShardTable.from_arrays(["a" * 64], [-1], [0])
    with pytest.raises(BadInputError, match="one count per shard"):
        ShardTable.from_arrays(["a" * 64], [1, 2], [0])
    with pytest.raises(BadInputError, match="multiple of 32"):
        ShardTable.from_arrays(b"abc", [1], [1])


def test_decode_rejects_garbage_and_tampered_tables():
    with pytest.raises(IntegrityError, match="shard table x"):
        ShardTable.decode(b"not parquet at all", subject="shard table x")
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow = ShardTable.from_entries([entry(1, 5), entry(2, 3)]).to_arrow()
    tampered = arrow.set_column(4, "first_record", pa.array([0, 4], pa.int64()))
    sink = pa.BufferOutputStream()
    pq.write_table(tampered, sink)
    with pytest.raises(IntegrityError, match="running total"):
        ShardTable.decode(sink.getvalue().to_pybytes())


def test_save_and_load_through_object_store(tmp_path):
    objects = ObjectStore(LocalStore(tmp_path))
    table = ShardTable.from_entries([entry(1), entry(2, 3, (f"{5:064x}",))])
    oid = save_shard_table(objects, table)
    assert save_shard_table(objects, ShardTable.from_entries(list(table))) == oid
    assert load_shard_table(objects, oid) == table


def test_million_shard_table_opens_in_well_under_a_second(tmp_path):
    n = 1_000_000
    rng = np.random.default_rng(0)
    records = rng.integers(1, 5000, n)
    table = ShardTable.from_arrays(os.urandom(32 * n), records, records * 300, records * 900)
    objects = ObjectStore(LocalStore(tmp_path))
    oid = save_shard_table(objects, table)

    reopened = ObjectStore(LocalStore(tmp_path))
    start = time.perf_counter()
    loaded = load_shard_table(reopened, oid)  # get bytes + verify hash + decode
    shard, offset = loaded.locate(int(records.sum()) - 1)  # ready to index
    last = loaded[shard]
    elapsed = time.perf_counter() - start

    print(
        f"\n1,000,000-shard table: {os.path.getsize(tmp_path / 'objects' / oid[:2] / oid) / 1e6:.1f} MB, "
        f"opened in {elapsed * 1000:.0f} ms"
    )
    assert (shard, offset) == (n - 1, int(records[-1]) - 1)
    assert last.first_record == int(records[:-1].sum())
    assert loaded.records_total == int(records.sum())
    assert elapsed < 1.0, f"opening a 1M-shard table took {elapsed:.2f} s"
