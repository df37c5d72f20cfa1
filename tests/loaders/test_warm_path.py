"""The warm path: shards read from the RAM tier's decoded files without pyarrow.

A process that streams a version already in the cache reads the shard index and the
decoded shards with numpy alone (:mod:`loaders.ipcview`), so neither it nor its
DataLoader workers load pyarrow (about 30 MB of RSS each). These tests hold that path
to the same batches as the pyarrow path, value for value, for every column type it reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.config import CacheConfig
from cachetier.errors import IntegrityError
from cachetier.pages import FileMapping
from datastore import Repo
from datastore.files import FILES_SCHEMA
from datastore.source import _read_shard_index, decode_shard_index
from loaders import StreamingDataLoader, StreamingDataset, decoded
from loaders.decoded import DecodedShard, GatheredRows, batch_from_pieces, samples_from_pieces, slice_rows
from loaders.ipcview import Field, field_type_from_arrow, open_ipc_file
from loaders.selection import is_files_layout

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

RECORDS = 900


def _records(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    ids = np.arange(n)
    return pa.table(
        {
            "id": ids,
            "score": pa.array([None if i % 11 == 0 else float(i) / 3 for i in range(n)], pa.float32()),
            "flag": pa.array([None if i % 13 == 0 else bool(i % 2) for i in range(n)]),
            "text": pa.array([None if i % 17 == 0 else f"récord {i} " * (i % 5) for i in range(n)]),
            "blob": pa.array([bytes([i % 256]) * (i % 9) for i in range(n)], pa.large_binary()),
            "tokens": pa.array(
                [None if i % 19 == 0 else rng.integers(0, 1000, i % 7).tolist() for i in range(n)],
                pa.list_(pa.int32()),
            ),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(3 * n, dtype=np.float32)), 3),
            "when": pa.array(ids * 1_000_000, pa.timestamp("us")),
        }
    )


@pytest.fixture(scope="module")
def repo_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warm")
    pq.write_table(_records(RECORDS), root / "data.parquet")
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(root / "data.parquet", format="parquet", shard_size=24 << 10)
    repo.commit("data")
    return root / "repo"


def _cache(root: Path) -> CacheConfig:
    return CacheConfig(dir=root / "cache", ram_dir=root / "ram", ram_bytes=256 << 20, ssd_bytes=256 << 20)


# how a batch is written down for comparison (NaN as -1.5, bytes as hex): the same code
# here and in the child process, which must not import this module (it imports pyarrow)
_DIGEST = textwrap.dedent(
    """
    def _digest(batch):
        import torch

        out = []
        for key in sorted(batch):
            value = batch[key]
            if isinstance(value, torch.Tensor):
                floats = value.is_floating_point()
                value = value.double().nan_to_num(nan=-1.5).tolist() if floats else value.tolist()
            elif value and isinstance(value[0], bytes):
                value = [v.hex() if v is not None else None for v in value]
            out.append([key, value])
        return out
    """
)
_names: dict = {}
exec(_DIGEST, _names)
_digest = _names["_digest"]


_CHILD = textwrap.dedent(
    """
    import json, sys

    class NoArrow:  # any import of pyarrow, here or in a forked worker, fails loudly
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "pyarrow":
                raise ImportError("pyarrow imported on the warm path")

    sys.meta_path.insert(0, NoArrow())
    from cachetier.config import CacheConfig
    from loaders import StreamingDataLoader, StreamingDataset

    root, repo, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cache = CacheConfig(dir=root + "/cache", ram_dir=root + "/ram", ram_bytes=256 << 20, ssd_bytes=256 << 20)
    ds = StreamingDataset(repo, cache=cache, shuffle=True, seed=5, batch_size=29)
    batches = [_digest(b) for b in StreamingDataLoader(ds, num_workers=workers)]
    print(json.dumps({"batches": batches, "pyarrow": "pyarrow" in sys.modules}))
    """
)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_warm_version_streams_without_pyarrow_and_as_the_arrow_path_does(repo_path, tmp_path, workers):
    warm = StreamingDataset(str(repo_path), cache=_cache(tmp_path), batch_size=64)
    assert sum(len(b["id"]) for b in warm) == RECORDS  # fills the RAM tier (shards, shard index)
    arrow_path = StreamingDataset(str(repo_path), cache=False, shuffle=True, seed=5, batch_size=29)
    expected = [_digest(b) for b in StreamingDataLoader(arrow_path, num_workers=0)]
    assert len(arrow_path._shards) > 3, "the test needs several shards"
    run = subprocess.run(
        [sys.executable, "-c", _DIGEST + _CHILD, str(tmp_path), str(repo_path), str(workers)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["pyarrow"] is False
    if workers:  # workers interleave their batches: compare the records, not the order
        flat = sorted(json.dumps(b) for b in got["batches"])
        assert flat == sorted(json.dumps(json.loads(json.dumps(b))) for b in expected)
    else:
        assert got["batches"] == json.loads(json.dumps(expected))


# -- the two readers of one shard, side by side ----------------------------------------

_TYPES = {
    "i8": pa.int8(),
    "u64": pa.uint64(),
    "f16": pa.float16(),
    "f64": pa.float64(),
    "bool": pa.bool_(),
    "date": pa.date32(),
    "ts": pa.timestamp("ns", tz="UTC"),
    "str": pa.string(),
    "lstr": pa.large_string(),
    "bin": pa.binary(),
    "fbin": pa.binary(3),
    "ragged": pa.list_(pa.int16()),
    "lragged": pa.large_list(pa.float32()),
    "fixed": pa.list_(pa.int32(), 2),
    "nested": pa.list_(pa.list_(pa.float64(), 2), 3),
    "null": pa.null(),
}


def _column(typ: pa.DataType, n: int, rng: np.random.Generator, nulls: bool) -> pa.Array:
    valid = rng.random(n) > 0.3 if nulls else np.ones(n, bool)
    if pa.types.is_null(typ):
        return pa.nulls(n)
    if pa.types.is_fixed_size_list(typ):
        inner = _column(typ.value_type, n * typ.list_size, rng, nulls)
        return pa.FixedSizeListArray.from_arrays(inner, typ.list_size)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        values = [
            _column(typ.value_type, int(k), rng, nulls).to_pylist() if ok else None
            for k, ok in zip(rng.integers(0, 5, n), valid)
        ]
        return pa.array(values, typ)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return pa.array(
            [
                f"s{i}é" * int(k) if ok else None
                for i, (k, ok) in enumerate(zip(rng.integers(0, 4, n), valid))
            ],
            typ,
        )
    if pa.types.is_fixed_size_binary(typ):
        return pa.array([bytes(rng.integers(0, 256, 3, dtype=np.uint8)) if ok else None for ok in valid], typ)
    if pa.types.is_binary(typ):
        return pa.array(
            [
                bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) if ok else None
                for k, ok in zip(rng.integers(0, 6, n), valid)
            ],
            typ,
        )
    if pa.types.is_boolean(typ):
        return pa.array([bool(b) if ok else None for b, ok in zip(rng.integers(0, 2, n), valid)], typ)
    if pa.types.is_temporal(typ):
        raw = pa.array(rng.integers(0, 1 << 30, n), pa.int64() if typ.bit_width == 64 else pa.int32())
        return pa.array([v if ok else None for v, ok in zip(raw.to_pylist(), valid)], raw.type).cast(typ)
    values = rng.integers(0, 100, n).astype(typ.to_pandas_dtype())
    return pa.array([v if ok else None for v, ok in zip(values.tolist(), valid)], typ)


def _as_lists(value):
    if isinstance(value, torch.Tensor):
        return value.double().nan_to_num(nan=-1.5).tolist() if value.is_floating_point() else value.tolist()
    if isinstance(value, list):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    if isinstance(value, float) and value != value:
        return -1.5  # NaN, which equals nothing
    return value


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert _as_lists(a[key]) == _as_lists(b[key]), key


@settings(max_examples=40, deadline=None)
@given(
    names=st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=5, unique=True),
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    nulls=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_a_decoded_file_gives_the_batches_its_arrow_table_gives(names, sizes, nulls, seed, data):
    rng = np.random.default_rng(seed)
    schema = pa.schema([(n, _TYPES[n]) for n in names])
    batches = [
        pa.record_batch([_column(t, k, rng, nulls) for t in schema.types], schema=schema) for k in sizes
    ]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    buffer = sink.getvalue()
    by_view = DecodedShard(0, "s", open_ipc_file(memoryview(buffer)))
    by_arrow = DecodedShard(0, "s", pa.Table.from_batches(batches, schema))
    by_file = _from_mapped_file(buffer)
    assert set(by_file.reads) == set(names)
    rows = by_arrow.rows
    assert by_view.rows == rows
    if rows:  # (an empty table keeps one empty chunk, the file none: neither is ever read)
        assert by_view.bounds.tolist() == by_arrow.bounds.tolist()
    assert {n: type(k) for n, k in by_view.kinds.items()} == {n: type(k) for n, k in by_arrow.kinds.items()}
    if not rows:
        return
    start = data.draw(st.integers(0, rows - 1))
    stop = data.draw(st.integers(start + 1, rows))
    (arrow_kinds, arrow_piece), *others = (slice_rows(s, start, stop) for s in (by_arrow, by_view, by_file))
    expected = batch_from_pieces(arrow_kinds, [arrow_piece])
    expected_samples = _as_lists(samples_from_pieces(arrow_kinds, [arrow_piece]))
    for kinds, piece in others:
        _same(batch_from_pieces(kinds, [piece]), expected)
        assert _as_lists(samples_from_pieces(kinds, [piece])) == expected_samples
    picked = np.array(data.draw(st.permutations(range(rows))), dtype=np.int64)
    # every row (ranges of rows), half of them (spread rows), a tenth (sparse rows)
    for chosen in (picked, picked[: max(1, rows // 2)], picked[:: max(1, rows // 10)]):
        gathered = []
        for shard in (by_arrow, by_view, by_file):
            block = GatheredRows(len(chosen))
            block.add({0: shard}, 0, chosen)
            kinds, piece = block.finish().take(0, len(chosen))
            gathered.append(batch_from_pieces(kinds, [piece]))
        for other in gathered[1:]:
            _same(other, gathered[0])
    kept = np.sort(picked[: max(1, rows // 2)])
    (arrow_kinds, arrow_piece), *cut = (
        slice_rows(s.subset(kept), 0, len(kept)) for s in (by_arrow, by_view, by_file)
    )
    for kinds, piece in cut:
        _same(batch_from_pieces(kinds, [piece]), batch_from_pieces(arrow_kinds, [arrow_piece]))


def test_a_column_of_nulls_counts_no_value_bytes_of_its_validity():
    # Found by the property above: one null in a binary column has a validity byte and no
    # values; counting it as -1 value bytes left the column out of the pread readers.
    table = pa.table({"bin": pa.array([None], pa.binary()), "n": pa.array([None], pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert set(_from_mapped_file(sink.getvalue()).reads) == {"bin", "n"}


def _from_mapped_file(buffer: pa.Buffer, header: int = 64) -> DecodedShard:
    """A shard read as the RAM tier's decoded file is: an IPC file ``header`` bytes into a
    :class:`~cachetier.pages.FileMapping`, every column (however narrow) copied out with
    ``pread``."""
    with tempfile.TemporaryFile() as f:
        f.write(b"h" * header)
        f.write(memoryview(buffer))
        f.flush()
        mapping = FileMapping.open(f.fileno(), header + buffer.size)
    with mock.patch.object(decoded, "_READ_ROW_BYTES", 0):
        return DecodedShard(0, "s", open_ipc_file(memoryview(mapping)[header:]), drop_pages=lambda: None)


def test_the_loader_knows_the_files_layout_without_pyarrow():
    fields = [Field(f.name, f.nullable, field_type_from_arrow(f.type)) for f in FILES_SCHEMA]
    assert is_files_layout(fields)
    hidden = [*fields, Field("__record_hash", False, field_type_from_arrow(pa.binary(16)))]
    assert is_files_layout(hidden)
    for i, other in enumerate([pa.large_string(), pa.int32(), pa.binary(), pa.list_(pa.large_string())]):
        changed = list(fields)
        changed[i] = Field(fields[i].name, True, field_type_from_arrow(other))
        assert not is_files_layout(changed), other
    assert not is_files_layout(fields[:3])


def test_the_shard_index_holds_what_the_loader_reads_of_a_shard_table(repo_path):
    repo = Repo.open(str(repo_path))
    record = repo.show("main").record
    table = repo.shard_table("main")
    index = memoryview(decode_shard_index(repo.objects.get(record.data_hash)))
    ids, records, sizes = _read_shard_index(index, "t")
    assert ids == table.hashes()
    assert records == table.records.tolist() and sizes == table.uncompressed_bytes.tolist()
    for broken in (index[:10], index[:-8], b"NOTANIDX" + bytes(index[8:])):
        with pytest.raises(IntegrityError):
            _read_shard_index(memoryview(bytes(broken)), "t")


def test_columns_only_pyarrow_converts_are_read_as_tables_without_trying_the_view(tmp_path):
    table = pa.table({"id": list(range(50)), "meta": [{"a": i} for i in range(50)], "tags": [["x"]] * 50})
    pq.write_table(table, tmp_path / "data.parquet")
    repo = Repo.init(tmp_path / "repo", workspace=None)
    repo.ingest(tmp_path / "data.parquet", format="parquet")
    repo.commit("data")
    for columns, views in ((["id", "meta"], False), (["id", "tags"], False), (["id"], True)):
        ds = StreamingDataset(str(tmp_path / "repo"), cache=_cache(tmp_path), columns=columns, batch_size=16)
        tried = []
        real = ds.source.read_shard_view
        ds.source.read_shard_view = lambda *a, real=real, tried=tried: tried.append(a) or real(*a)
        rows = [row for batch in ds for row in zip(*(batch[c] for c in columns))]
        assert [r[0].item() for r in rows] == list(range(50))
        assert bool(tried) is views, columns
    meta = StreamingDataset(
        str(tmp_path / "repo"), cache=_cache(tmp_path), columns=["meta", "tags"], batch_size=50
    )
    batch = next(iter(meta))
    assert batch["meta"][:2] == [{"a": 0}, {"a": 1}] and batch["tags"][0] == ["x"]
