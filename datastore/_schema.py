"""The type lattice that makes inferred schemas (JSON Lines, CSV) independent of blocking.

Readers infer types block by block; the schema of a source is the least upper bound
(``widen``) of every block's types, so it is the same whatever the block size, the
thread count or the process. Widening rules:

- equal types stay; ``null`` widens to anything; ``int64`` and ``double`` give ``double``;
- lists widen element-wise; structs take the union of their fields (first-seen order)
  and widen field-wise;
- ``lenient`` (CSV, where every value is text): any two other scalar types give ``string``;
- otherwise the types conflict (``None``), e.g. a JSON number against a JSON string.

New columns are appended in the order they first appear. Schemas carry no metadata.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = [
    "conform",
    "fits_schema",
    "normalize_json",
    "normalize_json_schema",
    "same_types",
    "widen",
    "widen_schema",
]


def widen(a: pa.DataType, b: pa.DataType, *, lenient: bool = False) -> pa.DataType | None:
    """Return the least type holding values of both ``a`` and ``b``, or None on a conflict."""
    if a.equals(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    numeric = {pa.int64(), pa.float64()}
    if a in numeric and b in numeric:
        return pa.float64()
    if pa.types.is_list(a) and pa.types.is_list(b):
        inner = widen(a.value_type, b.value_type, lenient=lenient)
        return None if inner is None else pa.list_(inner)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = _widen_fields(list(a), list(b), lenient=lenient)
        return None if fields is None else pa.struct(fields)
    if lenient and not _nested(a) and not _nested(b):
        if pa.types.is_binary(a) or pa.types.is_binary(b):
            return pa.binary()
        return pa.string()
    return None


def same_types(a: pa.Schema, b: pa.Schema) -> bool:
    """True when both schemas have the same column names and types, in order."""
    return a.names == b.names and all(x.type.equals(y.type) for x, y in zip(a, b))


def fits_schema(own: pa.Schema, target: pa.Schema) -> bool:
    """True when data of schema ``own`` can be read in ``target`` losing nothing: the same
    columns, perhaps in another order, each of the same type or holding only nulls (a
    ``null`` type, also inside lists and structs).

    A column of ``target`` missing from ``own`` does not fit: reading it in as nulls would
    also give data committed with ``--replace`` a column it never had.
    """
    if sorted(own.names) != sorted(target.names) or len(set(own.names)) != len(own.names):
        return False
    theirs = {f.name: f.type for f in target}
    return all(_fits(f.type, theirs[f.name]) for f in own)


def _fits(own: pa.DataType, target: pa.DataType) -> bool:
    if own.equals(target) or pa.types.is_null(own):
        return True
    if pa.types.is_list(own) and pa.types.is_list(target):
        return _fits(own.value_type, target.value_type)
    if pa.types.is_struct(own) and pa.types.is_struct(target):
        return fits_schema(pa.schema(list(own)), pa.schema(list(target)))
    return False


def widen_schema(a: pa.Schema, b: pa.Schema, *, lenient: bool = False) -> tuple[pa.Schema | None, str | None]:
    """Widen two schemas; on a conflict return ``(None, column)`` naming the column at fault."""
    out = []
    names_b = {f.name: f for f in b}
    for field in a:
        other = names_b.get(field.name)
        if other is None:
            out.append(field.with_nullable(True))
            continue
        t = widen(field.type, other.type, lenient=lenient)
        if t is None:
            return None, field.name
        out.append(pa.field(field.name, t, nullable=True))
    seen = set(a.names)
    out.extend(f.with_nullable(True) for f in b if f.name not in seen)
    return pa.schema(out), None


def _widen_fields(a: list[pa.Field], b: list[pa.Field], *, lenient: bool) -> list[pa.Field] | None:
    schema, bad = widen_schema(pa.schema(a), pa.schema(b), lenient=lenient)
    return None if bad is not None else list(schema)


def _nested(t: pa.DataType) -> bool:
    return pa.types.is_nested(t)


def normalize_json(t: pa.DataType) -> pa.DataType:
    """Map what Arrow's JSON inference may produce onto the JSON lattice.

    Timestamps (ISO strings that Arrow recognised) become ``string``, so a JSON string
    comes back as the same string.
    """
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(normalize_json(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normalize_json(f.type)) for f in t])
    if pa.types.is_dictionary(t):
        return normalize_json(t.value_type)
    return t


def normalize_json_schema(schema: pa.Schema) -> pa.Schema:
    """:func:`normalize_json` applied to every column (all nullable, no metadata)."""
    return pa.schema([pa.field(f.name, normalize_json(f.type)) for f in schema])


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Return ``batch`` with ``schema``'s columns in order: missing ones null, others cast."""
    if batch.schema.equals(schema):
        return batch
    columns = []
    names = batch.schema.names
    for field in schema:
        if field.name in names:
            column = batch.column(names.index(field.name))
            columns.append(column if column.type.equals(field.type) else column.cast(field.type))
        else:
            columns.append(pa.nulls(batch.num_rows, field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
