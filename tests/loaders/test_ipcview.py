"""The numpy-only IPC reader against pyarrow: same values, same types, errors on bad input."""

from __future__ import annotations

import datetime as dt
import io
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders.ipcview import (
    Column,
    IpcFormatError,
    UnsupportedIpc,
    column_from_arrow,
    field_type_from_arrow,
    open_ipc_file,
    read_schema,
)

ROOT = Path(__file__).resolve().parents[2]


def ipc_bytes(*tables: pa.Table, compression: str | None = None) -> bytes:
    """An IPC file of the tables' record batches, in order."""
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_file(sink, tables[0].schema, options=options) as writer:
        for table in tables:
            for batch in table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]:
                writer.write_batch(batch)
    return sink.getvalue()


def as_python(column: Column) -> list:
    """The column's rows as Python values (temporal types as their stored integers)."""
    t = column.type
    if t.id == "null":
        return [None] * column.length
    if t.id in ("int", "float", "temporal", "bool"):
        rows = column.values.tolist()
    elif t.id in ("utf8", "binary"):
        data, offsets = column.values, column.offsets
        rows = [bytes(data[offsets[i] : offsets[i + 1]]) for i in range(column.length)]
        if t.id == "utf8":
            rows = [row.decode() for row in rows]
    elif t.id == "fixed_binary":
        rows = [bytes(row) for row in column.values]
    elif t.id == "list":
        items, offsets = as_python(column.child), column.offsets
        rows = [items[offsets[i] : offsets[i + 1]] for i in range(column.length)]
    else:
        assert t.id == "fixed_list"
        items, w = as_python(column.child), t.width
        rows = [items[i * w : (i + 1) * w] for i in range(column.length)]
    if column.valid is not None:
        rows = [row if ok else None for row, ok in zip(rows, column.valid)]
    return rows


def arrow_python(array: pa.Array) -> list:
    """pyarrow's rows, temporal values as their stored integers."""
    if pa.types.is_temporal(array.type):
        return array.view(pa.int32() if array.type.bit_width == 32 else pa.int64()).to_pylist()
    if pa.types.is_fixed_size_list(array.type) and pa.types.is_fixed_size_list(array.type.value_type):
        inner = array.type.value_type.list_size
        flat = arrow_python(array.flatten().flatten()) if array.null_count == 0 else None
        if flat is not None:
            outer = array.type.list_size
            return [
                [flat[(r * outer + j) * inner : (r * outer + j + 1) * inner] for j in range(outer)]
                for r in range(len(array))
            ]
    return array.to_pylist()


def assert_same(column: Column, array: pa.Array) -> None:
    assert column.type == field_type_from_arrow(array.type)
    assert column.length == len(array)
    assert column.null_count == array.null_count
    expected = arrow_python(array)
    got = as_python(column)
    if pa.types.is_floating(array.type):
        assert got == pytest.approx(expected, nan_ok=True) if None not in expected else got == expected
    else:
        assert got == expected
    if column.type.id not in ("null",) and array.null_count:
        assert column.valid.tolist() == array.is_valid().to_pylist()
    else:
        assert column.valid is None


def read_back(array: pa.Array) -> Column:
    data = ipc_bytes(pa.table({"x": array}))
    return open_ipc_file(data).column(0, "x")


# --- one column of each type ---------------------------------------------------------------

UTC = dt.UTC
PRIMITIVES = [
    *[pa.array([1, None, -3, 2**bits // 2 - 1, 0], getattr(pa, f"int{bits}")()) for bits in (8, 16, 32, 64)],
    *[pa.array([1, None, 3, 2**bits - 1, 0], getattr(pa, f"uint{bits}")()) for bits in (8, 16, 32, 64)],
    pa.array(np.array([1.5, -2.0, 0.0, 65504.0], np.float16), pa.float16()),
    pa.array([1.5, None, -2.25, 3e38], pa.float32()),
    pa.array([1.5, None, -2.25, 1e300], pa.float64()),
    pa.array([True, None, False, True, True, False, False, True, True, None, False, True, True]),
    pa.array([True] * 8, pa.bool_()),
    pa.array([dt.date(2024, 1, 1), None, dt.date(1969, 12, 31)], pa.date32()),
    pa.array([dt.date(2024, 1, 1), None, dt.date(1969, 12, 31)], pa.date64()),
    *[pa.array([1, None, -5, 2**40], pa.timestamp(unit)) for unit in ("s", "ms", "us", "ns")],
    pa.array([dt.datetime(2024, 1, 1, tzinfo=UTC), None], pa.timestamp("us", tz="Europe/Paris")),
    pa.array([1, None, 86399], pa.time32("s")),
    pa.array([1, None, 86399999], pa.time32("ms")),
    pa.array([1, None, 86399999999], pa.time64("us")),
    pa.array([1, None, 86399999999999], pa.time64("ns")),
    pa.array([1, None, -7], pa.duration("ms")),
]

BYTES = [
    *[pa.array(["a", None, "", "héllo wörld ✓", "z" * 100], t) for t in (pa.string(), pa.large_string())],
    *[pa.array([b"\x00\xff", None, b"", b"abc"], t) for t in (pa.binary(), pa.large_binary())],
    pa.array([b"abcd", None, b"\x00\x01\x02\x03"], pa.binary(4)),
    pa.array([], pa.string()),
]

LISTS = [
    pa.array([[1, 2], None, [], [3], []], pa.list_(pa.int32())),
    pa.array([[1.5], None, [], [2.0, None, 3.0]], pa.large_list(pa.float64())),
    pa.array([["a", None], [], None, ["bc"]], pa.list_(pa.string())),
    pa.array([list(range(i, i + 512)) for i in range(5)], pa.list_(pa.int32(), 512)),
    pa.array([[1, 2], None, [3, None]], pa.list_(pa.int64(), 2)),
    pa.array(
        [[[float(r * 12 + j * 3 + k) for k in range(3)] for j in range(4)] for r in range(3)],
        pa.list_(pa.list_(pa.float32(), 3), 4),
    ),
    pa.array([[[1, 2]], [[3, 4]]], pa.list_(pa.list_(pa.uint8(), 2))),
]


@pytest.mark.parametrize("array", PRIMITIVES + BYTES + LISTS, ids=lambda a: str(a.type))
def test_each_type_reads_as_pyarrow(array):
    column = read_back(array)
    assert_same(column, array)
    if column.type.id in ("int", "float", "temporal"):
        assert column.values.dtype == column.type.dtype
        if column.type.id != "temporal":
            assert column.values.dtype == array.type.to_pandas_dtype()


def test_types_and_names():
    assert field_type_from_arrow(pa.int16()).dtype == np.int16
    assert field_type_from_arrow(pa.uint64()).arrow == "uint64"
    assert field_type_from_arrow(pa.float16()).dtype == np.float16
    assert field_type_from_arrow(pa.date64()).dtype == np.int64
    assert field_type_from_arrow(pa.time32("s")).dtype == np.int32
    assert field_type_from_arrow(pa.bool_()).dtype == np.bool_
    assert field_type_from_arrow(pa.large_string()).offsets_dtype == np.int64
    assert field_type_from_arrow(pa.large_string()).arrow == "large_string"
    assert field_type_from_arrow(pa.binary()).offsets_dtype == np.int32
    listed = field_type_from_arrow(pa.list_(pa.int32()))
    assert (listed.id, listed.arrow, listed.child.name) == ("list", "list<int32>", "item")
    assert listed.child.type == field_type_from_arrow(pa.int32())
    fixed = field_type_from_arrow(pa.list_(pa.float32(), 512))
    assert (fixed.id, fixed.width, fixed.dtype, fixed.offsets_dtype) == ("fixed_list", 512, None, None)
    assert field_type_from_arrow(pa.binary(16)).width == 16
    assert field_type_from_arrow(pa.timestamp("ns", tz="UTC")).arrow == "timestamp[ns, tz=UTC]"


def test_values_are_views_of_the_buffer():
    table = pa.table({"x": pa.array(range(100), pa.int64()), "s": pa.array(["ab"] * 100)})
    data = ipc_bytes(table)
    whole = np.frombuffer(data, np.uint8)
    ipc = open_ipc_file(data)
    assert np.shares_memory(ipc.column(0, "x").values, whole)
    assert np.shares_memory(ipc.column(0, "s").values, whole)
    assert np.shares_memory(ipc.column(0, "s").offsets, whole)


def test_null_type():
    column = read_back(pa.nulls(7))
    assert (column.type.id, column.length, column.null_count) == ("null", 7, 7)
    assert column.values is None and column.valid is None
    assert column_from_arrow(pa.nulls(7)) == column


def test_null_column_takes_no_buffers():
    table = pa.table({"n": pa.nulls(4), "x": pa.array([1, 2, None, 4], pa.int32()), "n2": pa.nulls(4)})
    ipc = open_ipc_file(ipc_bytes(table))
    assert_same(ipc.column(0, "x"), table["x"].chunk(0))
    assert ipc.column(0, "n2").length == 4


OTHERS = {
    "st": pa.array([{"a": 1, "b": "x"}, None, {"a": 3, "b": None}]),
    "map": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int32())),
    "dict": pa.array(["x", "y", None]).dictionary_encode(),
    "dec": pa.array([1, 2, None], pa.decimal128(10, 2)),
    "ll": pa.array([[[1], [2, 3]], None, []], pa.list_(pa.list_(pa.int32()))),
    "lst": pa.array([[{"a": 1}], None, []], pa.list_(pa.struct([("a", pa.int8())]))),
    "fl_l": pa.array([[[1], []], None, [[2], [3]]], pa.list_(pa.list_(pa.int32()), 2)),
    "iv": pa.array([(1, 2, 3), None, (4, 5, 6)], pa.month_day_nano_interval()),
    "un": pa.UnionArray.from_sparse(
        pa.array([0, 1, 0], pa.int8()), [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])]
    ),
    "dun": pa.UnionArray.from_dense(
        pa.array([0, 1, 0], pa.int8()),
        pa.array([0, 0, 1], pa.int32()),
        [pa.array([1, 2]), pa.array(["a"])],
    ),
    "sv": pa.array(["short", None, "a string longer than twelve bytes"], pa.string_view()),
    "bv": pa.array([b"x" * 20, b"", None], pa.binary_view()),
}


def test_unread_types_are_listed_and_do_not_shift_other_columns():
    columns = {}
    for name, array in OTHERS.items():
        columns[name] = array
        columns[f"after_{name}"] = pa.array([len(name), None, 7], pa.int64())
    table = pa.table(columns)
    ipc = open_ipc_file(ipc_bytes(table))
    names = {field.name: field for field in ipc.schema}
    for name, array in OTHERS.items():
        field_type = names[name].type
        assert field_type.id == "other"
        assert field_type == field_type_from_arrow(array.type)
        assert not ipc.supports([name, f"after_{name}"])
        with pytest.raises(UnsupportedIpc, match=name):
            ipc.column(0, name)
        with pytest.raises(UnsupportedIpc):
            column_from_arrow(array)
        assert_same(ipc.column(0, f"after_{name}"), table[f"after_{name}"].chunk(0))
    assert names["dict"].type.arrow == "dictionary<values=string, indices=int32>"
    assert names["dec"].type.arrow == "decimal128(10, 2)"
    assert ipc.supports([f"after_{name}" for name in OTHERS])


def test_unknown_names_and_batches():
    ipc = open_ipc_file(ipc_bytes(pa.table({"x": [1, 2]})))
    with pytest.raises(KeyError):
        ipc.column(0, "nope")
    with pytest.raises(IndexError):
        ipc.column(1, "x")
    with pytest.raises(IndexError):
        ipc.batch_rows(-1)
    assert not ipc.supports(["x", "nope"])
    assert ipc.supports("x") and ipc.supports([])


# --- files, batches, buffers ---------------------------------------------------------------


def mixed_table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ints = rng.integers(-1000, 1000, rows)
    return pa.table(
        {
            "i": pa.array(ints, pa.int64(), mask=ints % 7 == 0),
            "f": pa.array(rng.random(rows, np.float32), pa.float32()),
            "b": pa.array(ints % 3 == 0, pa.bool_(), mask=ints % 5 == 0),
            "s": pa.array([None if v % 4 == 0 else "é" * (v % 9) for v in ints], pa.string()),
            "l": pa.array([None if v % 6 == 0 else list(range(v % 5)) for v in ints], pa.list_(pa.int16())),
            "emb": pa.array(list(rng.random((rows, 8), np.float32)), pa.list_(pa.float32(), 8)),
            "ts": pa.array(ints, pa.timestamp("us", tz="UTC")),
        }
    )


SIZES = [10, 1, 0, 33, 7]


@pytest.fixture(scope="module")
def batches_file(tmp_path_factory):
    tables = [mixed_table(n, seed) for seed, n in enumerate(SIZES)]
    path = tmp_path_factory.mktemp("ipc") / "batches.arrow"
    path.write_bytes(ipc_bytes(*tables))
    return path, tables


def check_batches(ipc, tables):
    assert ipc.num_batches == len(tables)
    assert [field.name for field in ipc.schema] == tables[0].column_names
    for i, table in enumerate(tables):
        assert ipc.batch_rows(i) == table.num_rows
        for name in table.column_names:
            assert_same(ipc.column(i, name), table[name].combine_chunks())


def test_batches_from_bytes(batches_file):
    path, tables = batches_file
    check_batches(open_ipc_file(path.read_bytes()), tables)
    check_batches(open_ipc_file(memoryview(path.read_bytes())), tables)


def test_batches_from_mmap(batches_file):
    path, tables = batches_file
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        ipc = open_ipc_file(mapped)
        check_batches(ipc, tables)
        column = ipc.column(0, "i")
        assert not column.values.flags.writeable
        del ipc, column  # the views must go before the mapping closes


def test_schema_is_pyarrows(batches_file):
    path, tables = batches_file
    schema = tables[0].schema
    fields = open_ipc_file(path.read_bytes()).schema
    assert [(f.name, f.nullable, f.type) for f in fields] == [
        (f.name, f.nullable, field_type_from_arrow(f.type)) for f in schema
    ]


def test_read_schema_matches_the_file():
    columns = {**OTHERS, "p": PRIMITIVES[0][:3], "l": LISTS[0][:3], "fl": LISTS[-2], "n": pa.nulls(3)}
    columns["req"] = pa.array([1, 2, 3], pa.int32())
    columns["ts"] = pa.array([1, 2, 3], pa.timestamp("ns", tz="UTC"))
    schema = pa.schema([pa.field(n, a.type, nullable=n != "req") for n, a in columns.items()])
    expected = open_ipc_file(ipc_bytes(pa.table(columns, schema=schema))).schema
    message = schema.serialize().to_pybytes()
    assert read_schema(message) == expected
    assert read_schema(memoryview(message)) == expected
    assert message[:4] == b"\xff\xff\xff\xff"
    assert read_schema(message[4:]) == expected  # legacy: no continuation marker
    assert not expected[-2].nullable


def test_compressed_files_are_unsupported():
    data = ipc_bytes(mixed_table(20, 1), compression="zstd")
    with pytest.raises(UnsupportedIpc, match="zstd"):
        open_ipc_file(data)


def test_open_is_lazy_and_caches_batches():
    tables = [mixed_table(5, seed) for seed in range(50)]
    ipc = open_ipc_file(ipc_bytes(*tables))
    assert sum(batch is not None for batch in ipc._batches) == 1
    first = ipc._batch(3)
    assert ipc._batch(3) is first
    assert_same(ipc.column(49, "s"), tables[49]["s"].chunk(0))


# --- bad input -----------------------------------------------------------------------------


def read_everything(data) -> None:
    ipc = open_ipc_file(data)
    for i in range(ipc.num_batches):
        ipc.batch_rows(i)
        for field in ipc.schema:
            if ipc.supports([field.name]):
                ipc.column(i, field.name)


@pytest.fixture(scope="module")
def small_file() -> bytes:
    return ipc_bytes(mixed_table(9, 3), mixed_table(4, 4))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0))
def test_any_truncation_is_a_format_error(small_file, cut):
    with pytest.raises(IpcFormatError):
        read_everything(small_file[: cut % len(small_file)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupt_bytes_never_crash(small_file, changes):
    data = bytearray(small_file)
    for at, value in changes:
        data[at % len(data)] = value
    try:
        read_everything(bytes(data))
    except (IpcFormatError, UnsupportedIpc):
        pass


@pytest.mark.parametrize("data", [b"", b"ARROW1", b"garbage" * 10, b"ARROW1\0\0" + b"\xff" * 40 + b"ARROW1"])
def test_garbage_is_a_format_error(data):
    with pytest.raises(IpcFormatError):
        open_ipc_file(data)
    with pytest.raises(IpcFormatError):
        read_schema(data)


def test_a_schema_message_is_not_a_file():
    with pytest.raises(IpcFormatError):
        open_ipc_file(pa.schema([("x", pa.int8())]).serialize())


# --- pyarrow arrays ------------------------------------------------------------------------


@pytest.mark.parametrize("array", PRIMITIVES + BYTES[:-1] + LISTS, ids=lambda a: str(a.type))
def test_column_from_arrow_on_slices(array):
    whole = pa.concat_arrays([array] * (14 // len(array) + 1))  # long enough for slice(3, 10)
    piece = whole.slice(3, 10)
    from_arrow = column_from_arrow(piece)
    assert from_arrow.length == 10
    assert_same(from_arrow, piece)
    from_ipc = read_back(piece)
    assert as_python(from_arrow) == as_python(from_ipc)
    assert (from_arrow.type, from_arrow.null_count) == (from_ipc.type, from_ipc.null_count)
    if from_arrow.type.id in ("int", "float", "temporal", "bool", "fixed_binary"):
        np.testing.assert_array_equal(from_arrow.values, from_ipc.values)
    if from_arrow.type.id == "fixed_list":
        assert from_arrow.child.length == 10 * from_arrow.type.width
    if from_arrow.offsets is not None:
        assert len(from_arrow.offsets) == 11
        assert (from_arrow.offsets - from_arrow.offsets[0] == from_ipc.offsets - from_ipc.offsets[0]).all()


def test_column_from_arrow_in_a_chunked_array(batches_file):
    _, tables = batches_file
    table = pa.concat_tables(tables).slice(3, 20)
    ipc = open_ipc_file(ipc_bytes(table.combine_chunks()))
    for name in table.column_names:
        chunked = table[name]
        first = chunked.chunk(0)
        assert first.offset == 3
        expected = as_python(ipc.column(0, name))
        assert as_python(column_from_arrow(first)) == expected[: len(first)]
        assert as_python(column_from_arrow(chunked)) == expected
        assert_same(column_from_arrow(chunked), chunked.combine_chunks())


def test_column_from_arrow_bits_at_odd_offsets():
    flags = pa.array([i % 3 == 0 if i % 5 else None for i in range(40)])
    for start in range(9):
        piece = flags.slice(start, 17)
        column = column_from_arrow(piece)
        assert column.values.tolist()[:1] == [bool(piece[0].as_py())]
        assert_same(column, piece)


# --- hypothesis round trips ----------------------------------------------------------------

ints = st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=40)
texts = st.lists(st.one_of(st.none(), st.text(max_size=8)), max_size=40)
lists = st.lists(st.one_of(st.none(), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(a=ints, s=texts, lst=lists, start=st.integers(0, 10))
def test_round_trip(a, s, lst, start):
    arrays = [pa.array(a, pa.int64()), pa.array(s, pa.large_string()), pa.array(lst, pa.list_(pa.int32()))]
    for array in arrays:
        assert_same(read_back(array), array)
        piece = array.slice(min(start, len(array)))
        assert_same(column_from_arrow(piece), piece)


# --- no pyarrow ----------------------------------------------------------------------------


def test_importing_and_reading_does_not_load_pyarrow(tmp_path):
    path = tmp_path / "x.arrow"
    path.write_bytes(ipc_bytes(mixed_table(12, 0)))
    script = f"""
import importlib.util, mmap, sys
spec = importlib.util.spec_from_file_location("standalone_ipcview", {str(ROOT / "loaders" / "ipcview.py")!r})
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
with open({str(path)!r}, "rb") as f:
    ipc = module.open_ipc_file(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    assert ipc.column(0, "s").length == 12 and ipc.column(0, "emb").child.length == 96
assert "pyarrow" not in sys.modules, "pyarrow was imported"
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=60)
