"""The loader's Arrow memory pool: decoded shards come from it, and DataLoader workers
(not the training process) make it their default pool. Gathered rows are copies."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pyarrow as pa
import pytest

from cachetier.pages import FileMapping
from loaders import ArrowFileSource, StreamingDataLoader, StreamingDataset
from loaders.columns import NumericKind, RaggedKind, StringKind
from loaders.decoded import DecodedShard, GatheredRows, batch_from_pieces, slice_rows
from loaders.ipcview import column_from_arrow, open_ipc_file
from loaders.source import loader_memory_pool

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def test_the_pool_is_jemalloc_where_pyarrow_has_it():
    expected = (
        "jemalloc" if "jemalloc" in pa.supported_memory_backends() else pa.default_memory_pool().backend_name
    )
    assert loader_memory_pool().backend_name == expected
    assert loader_memory_pool() is loader_memory_pool()


def test_a_shard_file_is_decoded_into_the_loader_pool(shard_folder):
    source = ArrowFileSource.from_dir(shard_folder, "shard-*.arrow")
    pool = loader_memory_pool()
    before = pool.bytes_allocated()
    table = source.read_shard(source.shards[1][0])
    tokens = table.column("tokens").combine_chunks().flatten()
    held = pool.bytes_allocated() - before
    # the decompressed buffers are in the pool (an id and 4 int32 tokens per record at least)
    assert held >= table.num_rows * (8 + 4 * 4)
    del table, tokens
    assert pool.bytes_allocated() - before < held


def test_gathered_strings_and_lists_are_copies_that_do_not_pin_the_shard():
    texts = pa.array([f"record-{i}" * 50 if i % 7 else None for i in range(1000)])
    lists = pa.array([list(range(i % 50)) for i in range(1000)], pa.list_(pa.int32()))
    rows = np.arange(0, 1000, 2)
    strings, ragged = StringKind(), RaggedKind()
    text_data, list_data = strings.prepare(column_from_arrow(texts)), ragged.prepare(column_from_arrow(lists))
    kept_texts = strings.subset([(text_data, rows)])
    kept_lists = ragged.subset([(list_data, rows)])
    shard = [np.frombuffer(b, np.uint8) for a in (texts, lists) for b in a.buffers() if b is not None]
    copies = [
        np.frombuffer(kept_texts.data, np.uint8),
        kept_texts.offsets,
        kept_lists.offsets,
        kept_lists.values,
    ]
    for copy in copies:
        assert not any(np.shares_memory(copy, s) for s in shard), (
            "a gathered copy must not point into the shard"
        )
    assert strings.slice(kept_texts, 0, len(rows)) == texts.take(pa.array(rows)).to_pylist()
    flat, lengths = kept_lists.flat()
    expected = lists.take(pa.array(rows)).to_pylist()
    assert lengths.tolist() == [len(v) for v in expected]
    assert flat.tolist() == [x for v in expected for x in v]


def _tag_pool(batch):
    """A transform that records which default Arrow pool the process reading it has."""
    batch["pool"] = pa.default_memory_pool().backend_name
    return batch


def test_workers_use_the_loader_pool_by_default_and_the_training_process_keeps_its_own(source):
    mine = pa.default_memory_pool().backend_name
    ds = StreamingDataset(source, batch_size=16, transform=_tag_pool)
    in_process = {b["pool"] for b in StreamingDataLoader(ds, num_workers=0)}
    in_workers = {b["pool"] for b in StreamingDataLoader(ds, num_workers=2)}
    assert in_process == {mine}
    assert in_workers == {loader_memory_pool().backend_name}
    assert pa.default_memory_pool().backend_name == mine


def _mapping_at(address: int) -> str | None:
    """The name of the mapping holding ``address`` ("" when anonymous), None when unmapped."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split()
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return rest[4] if len(rest) > 4 else ""
    return None


def test_gathered_blocks_live_in_mappings_of_their_own_given_back_when_dropped():
    numbers, ragged = NumericKind((512,)), RaggedKind()
    block = numbers.new_block(3000, np.zeros((1, 512), np.int32))
    lists = ragged.prepare(
        column_from_arrow(pa.array([list(range(i % 900)) for i in range(2000)], pa.list_(pa.int32())))
    )
    joined = ragged.finish([lists.take(np.arange(0, 2000, 2)), lists.take(np.arange(1, 2000, 2))])
    assert len(joined) == 2000 and joined.flat()[1].tolist()[:3] == [0, 2, 4]
    addresses = [block.ctypes.data, joined.values.ctypes.data]
    # never in the malloc heap, whose free space glibc keeps once a block of megabytes is freed
    assert [_mapping_at(a) for a in addresses] == ["", ""]
    del block, joined
    gc.collect()
    assert [_mapping_at(a) for a in addresses] == [None, None]


def test_a_ragged_block_is_joined_into_the_room_of_the_block_before():
    ragged = RaggedKind()
    lists = pa.array([list(range(i % 90)) for i in range(2000)], pa.list_(pa.int32()))
    data = ragged.prepare(column_from_arrow(lists))

    def block(rows: np.ndarray, spare: object = None):
        pieces = ragged.new_block(len(rows), data, spare)
        for part in np.array_split(rows, 3):
            ragged.fill(pieces, 0, data, part)
        joined = ragged.finish(pieces)
        expected = lists.take(pa.array(rows)).to_pylist()
        assert joined.flat()[0].tolist() == [x for v in expected for x in v]
        return joined

    first = block(np.arange(0, 2000, 2))
    smaller = block(np.arange(1, 1800, 2), spare=first)
    assert smaller.values.ctypes.data == first.values.ctypes.data  # no new buffer
    bigger = block(np.arange(2000), spare=smaller)
    assert _mapping_at(bigger.values.ctypes.data) == ""  # a mapping of its own, with room
    assert bigger.values.ctypes.data != first.values.ctypes.data


def _mapped_pages(view: memoryview) -> int:
    """Pages of ``view`` that are mapped into this process now (the present bit of
    /proc/self/pagemap, readable without privileges)."""
    start = np.frombuffer(view, dtype=np.uint8).ctypes.data
    first, last = start // mmap.PAGESIZE, (start + view.nbytes - 1) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first + 1) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


@pytest.mark.parametrize("rows", ["in order", "all gathered", "half gathered", "a tenth gathered"])
def test_rows_read_from_a_mapped_decoded_file_map_none_of_their_values(tmp_path, rows):
    # 4,000 records of 2 KB of tokens and 1 KB of text: 12 MB of values in 3,000 pages
    n, rng = 4000, np.random.default_rng(3)
    table = pa.table(
        {
            "id": np.arange(n),
            "tokens": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.integers(0, 9, n * 512, dtype=np.int32)), 512
            ),
            "text": pa.array([f"{i:06d}" + "t" * (1000 + i % 40) for i in range(n)]),
        }
    )
    path = tmp_path / "decoded.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    with open(path, "rb") as f:
        mapping = FileMapping.open(f.fileno(), path.stat().st_size)
    whole = memoryview(mapping)
    shard = DecodedShard(0, "s", open_ipc_file(whole), drop_pages=lambda: None)
    assert set(shard.reads) == {"tokens", "text"}  # not the ids: 8 bytes a record, read in place
    before = _mapped_pages(whole)
    order = rng.permutation(n)
    chosen = {"all gathered": order, "half gathered": order[: n // 2], "a tenth gathered": order[::10]}
    if rows == "in order":
        parts = [slice_rows(shard, a, min(n, a + 64)) for a in range(0, n, 64)]
        got = [int(v) for kinds, piece in parts for v in batch_from_pieces(kinds, [piece])["id"]]
        assert got == list(range(n))
        texts = [t for kinds, piece in parts[:2] for t in batch_from_pieces(kinds, [piece])["text"]]
        assert texts == table["text"].to_pylist()[:128]
    else:
        wanted = chosen[rows]
        gathered = GatheredRows(len(wanted))
        gathered.add({0: shard}, 0, wanted)
        kinds, piece = gathered.finish().take(0, len(wanted))
        batch = batch_from_pieces(kinds, [piece])
        assert batch["id"].tolist() == wanted.tolist()
        assert batch["tokens"][:, :3].tolist() == [
            table["tokens"][int(i)].values[:3].to_pylist() for i in wanted
        ]
    mapped = _mapped_pages(whole) - before
    total = len(mapping) // mmap.PAGESIZE
    if rows == "a tenth gathered":  # rows too far apart to copy out with their neighbours
        assert mapped > total // 2
    else:  # offsets (16 KB) and what the kernel maps around them (64 KiB a fault)
        assert mapped < 200, f"{mapped} of {total} pages mapped"
