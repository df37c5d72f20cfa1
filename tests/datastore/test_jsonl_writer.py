"""The column-wise JSON lines writer writes the very bytes of the per-record path."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore._jsonl_writer import jsonl_bytes
from datastore.checkout import _json_default, _json_rows

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_COLUMNS = {
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u8": (pa.uint8(), st.integers(0, 255)),
    "f64": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "f32": (pa.float32(), st.floats(width=32, allow_nan=False)),
    "b": (pa.bool_(), st.booleans()),
    "s": (pa.string(), _TEXT),
    "ls": (pa.large_string(), _TEXT),
    'we"ird\nkey é': (pa.string(), st.sampled_from(["a", 'q"', "\\"])),
}


def _per_record(table: pa.Table) -> bytes:
    return "".join(
        json.dumps(row, ensure_ascii=False, default=_json_default) + "\n" for row in _json_rows(table)
    ).encode()


@st.composite
def tables(draw) -> pa.Table:
    names = draw(st.lists(st.sampled_from(sorted(_COLUMNS)), min_size=1, max_size=5, unique=True))
    n = draw(st.integers(0, 20))
    arrays = []
    for name in names:
        type_, values = _COLUMNS[name]
        column = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        array = pa.array(column, type_)
        if pa.types.is_string(type_) and draw(st.booleans()):
            array = array.dictionary_encode()
        arrays.append(array)
    table = pa.table(arrays, names=names)
    if n > 2 and draw(st.booleans()):  # several batches, one sliced
        table = pa.concat_tables([table.slice(0, 1), table.slice(1)])
    return table


@settings(max_examples=200, deadline=None)
@given(tables())
def test_column_wise_lines_are_the_per_record_bytes(table: pa.Table) -> None:
    buffers = jsonl_bytes(table)
    assert buffers is not None
    assert b"".join(b.to_pybytes() for b in buffers) == _per_record(table)


def test_null_columns_and_empty_tables() -> None:
    table = pa.table({"n": pa.nulls(3), "i": [1, None, 3]})
    assert b"".join(b.to_pybytes() for b in jsonl_bytes(table)) == _per_record(table)
    assert jsonl_bytes(table.slice(0, 0)) == []


def test_other_types_take_the_per_record_path() -> None:
    assert jsonl_bytes(pa.table({"l": [[1, 2]], "i": [1]})) is None
    assert jsonl_bytes(pa.table({"b": pa.array([b"x"], pa.binary())})) is None
    assert jsonl_bytes(pa.table({"t": pa.array([0], pa.timestamp("s"))})) is None
