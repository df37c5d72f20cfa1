"""Uncompressed Arrow IPC *files* read with numpy alone: columns as views into a buffer.

The loader's warm path reads the RAM tier's decoded shards (uncompressed Arrow IPC files
in memory-mapped cache pages) from training processes that should not pay pyarrow's
~30 MB of resident memory just to look at them. This module parses the IPC footer and
message flatbuffers by hand (no pyarrow, no ``flatbuffers`` package) and hands out the
columns of a record batch as numpy arrays that view the buffer it was given.

Read: integers, floats (half too), bool, temporal types (as their stored integers),
string / binary (and their large forms), fixed-size binary, list / large list and
fixed-size list (nested fixed-size lists too) of those, and the null type. Every other
type is listed in the schema with id ``"other"`` and raises :class:`UnsupportedIpc` when
read; so do compressed bodies and big-endian files. Every offset and length taken from
the buffer is checked against it: a truncated or corrupt file raises
:class:`IpcFormatError`, never reads out of range.

:func:`column_from_arrow` gives the same :class:`Column` for an in-memory pyarrow array,
for callers that already hold pyarrow (it imports pyarrow only when called).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Column",
    "Field",
    "FieldType",
    "IpcFile",
    "IpcFormatError",
    "UnsupportedIpc",
    "column_from_arrow",
    "field_type_from_arrow",
    "open_ipc_file",
    "read_schema",
]


class UnsupportedIpc(Exception):
    """The buffer is valid Arrow IPC but uses what this reader does not read: compressed
    bodies, big-endian data, or (only when such a column is read) an unsupported type,
    dictionary-encoded fields included. The message says what."""


class IpcFormatError(ValueError):
    """The buffer is not an Arrow IPC file (or schema message): bad magic, truncated, or an
    offset / length out of bounds. The message is one line."""


@dataclass(frozen=True, slots=True)
class FieldType:
    """What this reader knows of an Arrow type.

    ``id`` is one of "int", "float", "bool", "temporal", "utf8", "binary", "fixed_binary",
    "list", "fixed_list", "null", "other" ("other": listed, never read). ``dtype`` is the
    numpy dtype of the values for int / float / temporal (the stored int32 / int64) and
    bool, else None. ``offsets_dtype`` is int32 or int64 for utf8 / binary / list (int64
    for the large forms), else None. ``width`` is the list size of a fixed_list and the
    byte width of a fixed_binary. ``child`` is the element field of a list / fixed_list.
    ``arrow`` is a short human name (pyarrow's spelling where it is short) for messages.
    """

    id: str
    dtype: np.dtype | None
    offsets_dtype: np.dtype | None
    width: int = 0
    child: Field | None = None
    arrow: str = ""


@dataclass(frozen=True, slots=True)
class Field:
    """A schema field: its name, whether it may hold nulls, and its type."""

    name: str
    nullable: bool
    type: FieldType


@dataclass(slots=True)
class Column:
    """One record batch's data of one field, describing exactly rows ``[0, length)``.

    Arrays are numpy views into the file buffer (no copy) except ``valid`` and bool
    ``values``, which are unpacked from bits. ``valid`` is an np.bool_ mask (True = not
    null), None when ``null_count`` is 0 and for the null type (whose ``null_count`` is
    ``length``). ``offsets`` holds ``length + 1`` offsets for utf8 / binary / list, as
    stored (they need not start at 0). ``values``: int / float / temporal: ``length``
    items of ``type.dtype``; bool: np.bool_; utf8 / binary: the whole data buffer as
    uint8; fixed_binary: uint8 of shape ``(length, width)``; list / fixed_list / null:
    None. ``child``: the element column of a list / fixed_list (a fixed_list's child
    has at least ``length * width`` items).
    """

    type: FieldType
    length: int
    null_count: int
    valid: np.ndarray | None
    offsets: np.ndarray | None
    values: np.ndarray | None
    child: Column | None = None


# --- flatbuffers -------------------------------------------------------------------------

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I16 = struct.Struct("<h")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_BLOCK = struct.Struct("<qi4xq")  # File.fbs Block: offset, metaDataLength, (pad), bodyLength
_MAGIC = b"ARROW1"
_CONTINUATION = -1  # 0xFFFFFFFF read as int32
_MAX_DEPTH = 64

_MESSAGE_SCHEMA = 1
_MESSAGE_RECORD_BATCH = 3
_METADATA_V5 = 4


@functools.cache
def _vtable_struct(fields: int) -> struct.Struct:
    return struct.Struct(f"<{fields}H")


class _Flat:
    """One flatbuffer (a footer or a message's metadata): every read is bounds-checked."""

    __slots__ = ("mv", "size", "what")

    def __init__(self, mv: memoryview, what: str) -> None:
        self.mv = mv
        self.size = len(mv)
        self.what = what

    def check(self, pos: int, nbytes: int) -> None:
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            raise IpcFormatError(f"{self.what}: {nbytes} bytes at {pos} lie outside its {self.size} bytes")

    def read(self, st: struct.Struct, pos: int) -> int:
        if pos < 0 or pos + st.size > self.size:
            self.check(pos, st.size)  # raises, with the message
        return st.unpack_from(self.mv, pos)[0]

    def root(self) -> _Table:
        return _Table(self, self.read(_U32, 0))


class _Table:
    """A flatbuffer table: fields located through its vtable; an absent field reads as its default."""

    __slots__ = ("flat", "pos", "slots")

    def __init__(self, flat: _Flat, pos: int) -> None:
        self.flat = flat
        self.pos = pos
        vtable = pos - flat.read(_I32, pos)
        vtable_size = flat.read(_U16, vtable)
        if vtable_size < 4 or vtable_size % 2:
            raise IpcFormatError(f"{flat.what}: bad vtable size {vtable_size} at {vtable}")
        flat.check(vtable, vtable_size)
        # the field offsets, all at once: one unpack instead of one per field read
        self.slots = _vtable_struct((vtable_size - 4) // 2).unpack_from(flat.mv, vtable + 4)

    def _field(self, i: int) -> int:
        """Position of field ``i``, or -1 when absent."""
        offset = self.slots[i] if i < len(self.slots) else 0
        return self.pos + offset if offset else -1

    def scalar(self, i: int, st: struct.Struct, default: int) -> int:
        pos = self._field(i)
        return default if pos < 0 else self.flat.read(st, pos)

    def table(self, i: int) -> _Table | None:
        pos = self._field(i)
        return None if pos < 0 else _Table(self.flat, pos + self.flat.read(_U32, pos))

    def vector(self, i: int, item_size: int) -> tuple[int, int]:
        """(position of the first item, item count); (0, 0) when absent."""
        pos = self._field(i)
        if pos < 0:
            return 0, 0
        start = pos + self.flat.read(_U32, pos)
        count = self.flat.read(_U32, start)
        self.flat.check(start + 4, count * item_size)
        return start + 4, count

    def tables(self, i: int) -> list[_Table]:
        start, count = self.vector(i, 4)
        return [_Table(self.flat, p + self.flat.read(_U32, p)) for p in range(start, start + 4 * count, 4)]

    def string(self, i: int) -> str | None:
        if self._field(i) < 0:
            return None
        start, count = self.vector(i, 1)
        try:
            return bytes(self.flat.mv[start : start + count]).decode()
        except UnicodeDecodeError:
            raise IpcFormatError(f"{self.flat.what}: a string is not UTF-8") from None


# --- types -------------------------------------------------------------------------------

_TIME_UNITS = ("s", "ms", "us", "ns")
_NULL = FieldType("null", None, None, arrow="null")
_BOOL = FieldType("bool", np.dtype(np.bool_), None, arrow="bool")
_FLOAT_NAMES = {16: "halffloat", 32: "float", 64: "double"}


def _int_type(bits: int, signed: bool) -> FieldType:
    if bits not in (8, 16, 32, 64):
        raise IpcFormatError(f"integer of {bits} bits")
    kind = "i" if signed else "u"
    return FieldType("int", np.dtype(f"<{kind}{bits // 8}"), None, arrow=f"{'' if signed else 'u'}int{bits}")


def _float_type(bits: int) -> FieldType:
    return FieldType("float", np.dtype(f"<f{bits // 8}"), None, arrow=_FLOAT_NAMES[bits])


def _temporal_type(bits: int, name: str) -> FieldType:
    return FieldType("temporal", np.dtype(f"<i{bits // 8}"), None, arrow=name)


def _timestamp_name(unit: str, tz: str | None) -> str:
    return f"timestamp[{unit}, tz={tz}]" if tz else f"timestamp[{unit}]"


def _bytes_type(is_utf8: bool, large: bool) -> FieldType:
    name = ("large_" if large else "") + ("string" if is_utf8 else "binary")
    offsets = np.dtype("<i8" if large else "<i4")
    return FieldType("utf8" if is_utf8 else "binary", None, offsets, arrow=name)


def _fixed_binary_type(width: int) -> FieldType:
    if width < 0:
        raise IpcFormatError(f"fixed-size binary of width {width}")
    return FieldType("fixed_binary", None, None, width=width, arrow=f"fixed_size_binary[{width}]")


def _other(name: str) -> FieldType:
    return FieldType("other", None, None, arrow=name)


def _has_variable_list(t: FieldType) -> bool:
    return t.id == "list" or (t.child is not None and _has_variable_list(t.child.type))


def _list_type(child: Field, large: bool) -> FieldType:
    name = f"{'large_' if large else ''}list<{child.type.arrow}>"
    # Lists of lists (at any fixed-size depth) and lists of unread types stay unread.
    if child.type.id == "other" or _has_variable_list(child.type):
        return _other(name)
    return FieldType("list", None, np.dtype("<i8" if large else "<i4"), child=child, arrow=name)


def _fixed_list_type(child: Field, size: int) -> FieldType:
    if size < 0:
        raise IpcFormatError(f"fixed-size list of size {size}")
    name = f"fixed_size_list<{child.type.arrow}>[{size}]"
    if child.type.id == "other" or _has_variable_list(child.type):
        return _other(name)
    return FieldType("fixed_list", None, None, width=size, child=child, arrow=name)


def _decimal_name(bits: int, precision: int, scale: int) -> str:
    return f"decimal{bits}({precision}, {scale})"


def _dictionary_name(values: FieldType, indices: FieldType) -> str:
    return f"dictionary<values={values.arrow}, indices={indices.arrow}>"


# Types with no parameters that are listed but never read, by Schema.fbs Type id.
_OTHER_NAMES = {
    11: "interval",
    13: "struct",
    14: "union",
    17: "map",
    22: "run_end_encoded",
    23: "binary_view",
    24: "string_view",
    25: "list_view",
    26: "large_list_view",
}


@dataclass(frozen=True, slots=True)
class _Layout:
    """How much of a record batch one field takes: field nodes, fixed buffers, and view
    fields (each of which adds that batch's variadic buffer count). ``buffers`` is -1
    for a type of unknown layout: no column after it can be located."""

    nodes: int
    buffers: int
    views: int = 0


def _sum_layouts(own: _Layout, children: list[_Layout]) -> _Layout:
    if own.buffers < 0 or any(c.buffers < 0 for c in children):
        return _Layout(own.nodes, -1)
    return _Layout(
        own.nodes + sum(c.nodes for c in children),
        own.buffers + sum(c.buffers for c in children),
        own.views + sum(c.views for c in children),
    )


def _type_layout(type_id: int, params: _Table | None, version: int) -> _Layout:
    """The field's own node and buffers (children excluded), in Arrow's columnar layout."""
    if type_id == 1:  # Null: no buffers at all
        return _Layout(1, 0)
    if type_id in (4, 5, 19, 20):  # (Large)Binary / (Large)Utf8: validity, offsets, data
        return _Layout(1, 3)
    if type_id in (12, 17, 21):  # (Large)List, Map: validity, offsets
        return _Layout(1, 2)
    if type_id in (13, 16):  # Struct, FixedSizeList: validity
        return _Layout(1, 1)
    if type_id == 14:  # Union: type ids (+ offsets when dense); validity only before V5
        dense = params is not None and params.scalar(0, _I16, 0) == 1
        return _Layout(1, 1 + int(dense) + int(version < _METADATA_V5))
    if type_id == 22:  # RunEndEncoded: all in its two children
        return _Layout(1, 0)
    if type_id in (23, 24):  # Binary/Utf8 view: validity, views, then variadic data buffers
        return _Layout(1, 2, views=1)
    if type_id in (25, 26):  # (Large)ListView: validity, offsets, sizes
        return _Layout(1, 3)
    if 2 <= type_id <= 18:  # fixed-width types: validity, values
        return _Layout(1, 2)
    return _Layout(1, -1)


def _flat_type(type_id: int, params: _Table | None, children: list[Field]) -> FieldType:
    """The FieldType of a Schema.fbs ``Type`` union member."""

    def param(i: int, st: struct.Struct, default: int) -> int:
        return default if params is None else params.scalar(i, st, default)

    if type_id == 1:
        return _NULL
    if type_id == 2:
        return _int_type(param(0, _I32, 0), bool(param(1, _U8, 0)))
    if type_id == 3:
        precision = param(0, _I16, 0)
        if precision not in (0, 1, 2):
            raise IpcFormatError(f"floating point precision {precision}")
        return _float_type(16 << precision)
    if type_id in (4, 5, 19, 20):
        return _bytes_type(type_id in (5, 20), type_id >= 19)
    if type_id == 6:
        return _BOOL
    if type_id == 7:
        return _other(_decimal_name(param(2, _I32, 128), param(0, _I32, 0), param(1, _I32, 0)))
    if type_id == 8:  # DateUnit DAY 0 (int32); MILLISECOND 1 (int64) is the default
        return (
            _temporal_type(32, "date32[day]") if param(0, _I16, 1) == 0 else _temporal_type(64, "date64[ms]")
        )
    if type_id in (9, 10, 18):
        unit_index = param(0, _I16, 0 if type_id == 10 else 1)
        if not 0 <= unit_index < 4:
            raise IpcFormatError(f"time unit {unit_index}")
        unit = _TIME_UNITS[unit_index]
        if type_id == 9:
            bits = param(1, _I32, 32)
            if bits not in (32, 64):
                raise IpcFormatError(f"time of {bits} bits")
            return _temporal_type(bits, f"time{bits}[{unit}]")
        if type_id == 10:
            return _temporal_type(64, _timestamp_name(unit, params.string(1) if params else None))
        return _temporal_type(64, f"duration[{unit}]")
    if type_id == 15:
        return _fixed_binary_type(param(0, _I32, 0))
    if type_id in (12, 16, 21):
        if len(children) != 1:
            raise IpcFormatError(f"a list type with {len(children)} children")
        if type_id == 16:
            return _fixed_list_type(children[0], param(0, _I32, 0))
        return _list_type(children[0], large=type_id == 21)
    return _other(_OTHER_NAMES.get(type_id, f"arrow type {type_id}"))


def _flat_field(table: _Table, version: int, depth: int = 0) -> tuple[Field, _Layout]:
    """A Schema.fbs ``Field`` and the part of a record batch it takes."""
    if depth > _MAX_DEPTH:
        raise IpcFormatError(f"fields nested deeper than {_MAX_DEPTH}")
    name = table.string(0) or ""
    nullable = bool(table.scalar(1, _U8, 0))
    type_id = table.scalar(2, _U8, 0)
    params = table.table(3)
    parsed = [_flat_field(t, version, depth + 1) for t in table.tables(5)]
    children = [field for field, _ in parsed]
    field_type = _flat_type(type_id, params, children)
    layout = _sum_layouts(_type_layout(type_id, params, version), [lay for _, lay in parsed])
    dictionary = table.table(4)
    if dictionary is not None:
        index = dictionary.table(1)  # DictionaryEncoding.indexType; absent = int32
        index_type = _int_type(index.scalar(0, _I32, 0), bool(index.scalar(1, _U8, 0))) if index else None
        field_type = _other(_dictionary_name(field_type, index_type or _int_type(32, True)))
        layout = _Layout(1, 2)  # a batch holds only the indices
    return Field(name, nullable, field_type), layout


def _flat_schema(table: _Table, version: int) -> tuple[list[Field], list[_Layout]]:
    if table.scalar(0, _I16, 0) != 0:
        raise UnsupportedIpc("big-endian Arrow data")
    parsed = [_flat_field(t, version) for t in table.tables(1)]
    return [field for field, _ in parsed], [layout for _, layout in parsed]


def _message_flat(mv: memoryview, pos: int, limit: int, what: str) -> _Flat:
    """The Message flatbuffer of an encapsulated message at ``pos`` (with or without the
    0xFFFFFFFF continuation marker), not reaching past ``limit``."""
    outer = _Flat(mv[:limit], what)
    length = outer.read(_I32, pos)
    start = pos + 4
    if length == _CONTINUATION:
        length = outer.read(_I32, pos + 4)
        start = pos + 8
    if length <= 0:
        raise IpcFormatError(f"{what}: metadata length {length}")
    outer.check(start, length)
    return _Flat(mv[start : start + length], what)


def _byte_view(buffer: Any) -> memoryview:
    mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


# --- record batches ----------------------------------------------------------------------


@dataclass(slots=True)
class _Batch:
    """One record batch's parsed metadata."""

    length: int
    nodes: np.ndarray  # (n, 2) int64: length, null_count
    buffers: np.ndarray  # (n, 2) int64: offset, length within the body
    body: int  # absolute position of the body in the file
    variadic: np.ndarray  # int64 variadic buffer counts, one per view field
    starts: list[tuple[int, int]] | None = None  # per field, when view fields shift them


class _Cursor:
    """Walks one batch's field nodes and buffers in the order the fields take them."""

    __slots__ = ("batch", "buffer", "mv", "node")

    def __init__(self, mv: memoryview, batch: _Batch, node: int, buffer: int) -> None:
        self.mv = mv
        self.batch = batch
        self.node = node
        self.buffer = buffer

    def next_node(self) -> tuple[int, int]:
        length, nulls = (int(v) for v in self.batch.nodes[self.node])
        self.node += 1
        if length < 0 or not 0 <= nulls <= length:
            raise IpcFormatError(f"field node with length {length} and {nulls} nulls")
        return length, nulls

    def next_buffer(self) -> tuple[int, int]:
        offset, length = (int(v) for v in self.batch.buffers[self.buffer])
        self.buffer += 1
        return self.batch.body + offset, length

    def view(self, buffer: tuple[int, int], dtype: np.dtype, count: int, what: str) -> np.ndarray:
        pos, size = buffer
        if count * dtype.itemsize > size:
            raise IpcFormatError(f"{what} buffer of {size} bytes holds fewer than {count} items")
        return np.frombuffer(self.mv, dtype, count, pos)

    def bits(self, buffer: tuple[int, int], count: int, what: str) -> np.ndarray:
        packed = self.view(buffer, np.dtype(np.uint8), (count + 7) // 8, what)
        return np.unpackbits(packed, count=count, bitorder="little").view(np.bool_)

    def offsets(self, buffer: tuple[int, int], dtype: np.dtype, length: int, end: int) -> np.ndarray:
        """``length + 1`` offsets, the first and last within ``0..end``."""
        if length == 0 and buffer[1] < dtype.itemsize:
            return np.zeros(1, dtype)  # writers may leave an empty column's offsets empty
        offsets = self.view(buffer, dtype, length + 1, "offsets")
        first, last = int(offsets[0]), int(offsets[-1])
        if first < 0 or last < first or last > end:
            raise IpcFormatError(f"offsets run from {first} to {last}, outside 0..{end}")
        return offsets

    def read(self, t: FieldType) -> Column:
        length, nulls = self.next_node()
        if t.id == "null":
            return Column(t, length, length, None, None, None)
        validity = self.next_buffer()
        valid = self.bits(validity, length, "validity") if nulls else None
        column = Column(t, length, nulls, valid, None, None)
        if t.id in ("int", "float", "temporal"):
            column.values = self.view(self.next_buffer(), t.dtype, length, t.arrow)
        elif t.id == "bool":
            column.values = self.bits(self.next_buffer(), length, "bool")
        elif t.id in ("utf8", "binary"):
            offsets_buffer = self.next_buffer()
            data_pos, data_size = self.next_buffer()
            column.offsets = self.offsets(offsets_buffer, t.offsets_dtype, length, data_size)
            column.values = np.frombuffer(self.mv, np.uint8, data_size, data_pos)
        elif t.id == "fixed_binary":
            flat = self.view(self.next_buffer(), np.dtype(np.uint8), length * t.width, t.arrow)
            column.values = flat.reshape(length, t.width)
        elif t.id == "list":
            offsets_buffer = self.next_buffer()
            column.child = self.read(t.child.type)
            column.offsets = self.offsets(offsets_buffer, t.offsets_dtype, length, column.child.length)
        elif t.id == "fixed_list":
            column.child = self.read(t.child.type)
            if column.child.length < length * t.width:
                raise IpcFormatError(
                    f"{t.arrow} child holds {column.child.length} items, not {length * t.width}"
                )
        else:
            raise UnsupportedIpc(f"type {t.arrow} is not read by ipcview")
        return column


class IpcFile:
    """An opened Arrow IPC file: its schema, and each record batch's columns on demand.

    Batch metadata is parsed on first use and kept; columns are numpy views into the
    buffer given to :func:`open_ipc_file`, which this object keeps alive.
    """

    schema: list[Field]
    num_batches: int

    def __init__(self, mv: memoryview, footer: _Table, body_end: int) -> None:
        self._mv = mv
        self._body_end = body_end
        self._version = footer.scalar(0, _I16, 0)
        schema = footer.table(1)
        if schema is None:
            raise IpcFormatError("the footer has no schema")
        self.schema, self._layouts = _flat_schema(schema, self._version)
        self._blocks, self.num_batches = footer.vector(3, _BLOCK.size)
        self._footer = footer.flat
        self._batches: list[_Batch | None] = [None] * self.num_batches
        self._index: dict[str, int] = {}
        for k, field in enumerate(self.schema):
            self._index.setdefault(field.name, k)
        # Fields after one of unknown layout cannot be located in a batch.
        self._located = next(
            (k for k, lay in enumerate(self._layouts) if lay.buffers < 0), len(self._layouts)
        )
        self._has_views = any(lay.views for lay in self._layouts[: self._located])
        self._static_starts = None if self._has_views else self._starts(np.zeros(0, np.int64))

    @property
    def buffer(self) -> memoryview:
        """The buffer the file was opened from (as bytes), which its columns are views of."""
        return self._mv

    def _starts(self, variadic: np.ndarray) -> list[tuple[int, int]]:
        """(first node, first buffer) of each locatable field, given a batch's variadic counts."""
        starts = []
        node = buffer = view = 0
        for layout in self._layouts[: self._located]:
            if view + layout.views > len(variadic):
                raise IpcFormatError("a record batch has too few variadic buffer counts")
            starts.append((node, buffer))
            node += layout.nodes
            buffer += layout.buffers + int(variadic[view : view + layout.views].sum())
            view += layout.views
        return starts

    def _batch(self, i: int) -> _Batch:
        if not 0 <= i < self.num_batches:
            raise IndexError(f"record batch {i} of {self.num_batches}")
        batch = self._batches[i]
        if batch is None:
            batch = self._batches[i] = self._parse_batch(i)
        return batch

    def _parse_batch(self, i: int) -> _Batch:
        offset, meta_length, body_length = _BLOCK.unpack_from(self._footer.mv, self._blocks + i * _BLOCK.size)
        body = offset + meta_length
        if offset < 0 or meta_length < 8 or body_length < 0 or body + body_length > self._body_end:
            raise IpcFormatError(f"record batch {i} block lies outside the file")
        message = _message_flat(self._mv, offset, body, f"record batch {i}").root()
        if message.scalar(1, _U8, 0) != _MESSAGE_RECORD_BATCH:
            raise IpcFormatError(f"record batch {i} block holds no record batch message")
        header = message.table(2)
        if header is None:
            raise IpcFormatError(f"record batch {i} message has no header")
        compression = header.table(3)
        if compression is not None:
            codec = {0: "lz4", 1: "zstd"}.get(compression.scalar(0, _U8, 0), "unknown")
            raise UnsupportedIpc(f"record batch {i} is {codec}-compressed")
        flat = header.flat
        start, count = header.vector(1, 16)
        nodes = np.frombuffer(flat.mv, "<i8", 2 * count, start).reshape(count, 2)
        start, count = header.vector(2, 16)
        buffers = np.frombuffer(flat.mv, "<i8", 2 * count, start).reshape(count, 2)
        if count and (
            (buffers < 0).any()
            or (buffers[:, 0] > body_length).any()
            or (buffers[:, 1] > body_length - buffers[:, 0]).any()
        ):
            raise IpcFormatError(f"record batch {i} has a buffer outside its {body_length}-byte body")
        start, count = header.vector(4, 8)
        variadic = np.frombuffer(flat.mv, "<i8", count, start)
        if count and (variadic < 0).any():
            raise IpcFormatError(f"record batch {i} has a negative variadic buffer count")
        batch = _Batch(header.scalar(0, _I64, 0), nodes, buffers, body, variadic)
        if self._has_views:
            batch.starts = self._starts(variadic)
        known = self._layouts[: self._located]
        need_nodes = sum(lay.nodes for lay in known)
        need_buffers = sum(lay.buffers for lay in known) + int(variadic.sum())
        if len(nodes) < need_nodes or len(buffers) < need_buffers:
            raise IpcFormatError(f"record batch {i} has too few field nodes or buffers for its schema")
        return batch

    def batch_rows(self, i: int) -> int:
        """Rows of record batch ``i`` (IndexError when out of range)."""
        return self._batch(i).length

    def column(self, i: int, name: str) -> Column:
        """Column ``name`` of record batch ``i``, as views into the buffer.

        Raises KeyError for an unknown name, IndexError for a batch out of range,
        UnsupportedIpc for a type this reader does not read (``supports`` says which),
        IpcFormatError when the batch's data does not fit the buffer.
        """
        k = self._index.get(name)
        if k is None:
            raise KeyError(name)
        field = self.schema[k]
        if field.type.id == "other":
            raise UnsupportedIpc(f"column {name!r} has type {field.type.arrow}, which ipcview does not read")
        if k >= self._located:
            raise UnsupportedIpc(f"column {name!r} follows a column of unknown layout")
        batch = self._batch(i)
        start = (batch.starts or self._static_starts)[k]
        return _Cursor(self._mv, batch, *start).read(field.type)

    def supports(self, names: Iterable[str]) -> bool:
        """True when every named column exists and ``column`` can read it."""
        if isinstance(names, str):
            names = [names]
        for name in names:
            k = self._index.get(name)
            if k is None or k >= self._located or self.schema[k].type.id == "other":
                return False
        return True


def open_ipc_file(buffer: Any) -> IpcFile:
    """Open the Arrow IPC file held in ``buffer`` (bytes, memoryview, mmap.mmap, anything
    with the buffer protocol): reads the footer and schema, keeps a reference to the
    buffer, never copies it. Raises IpcFormatError for what is not an IPC file, and
    UnsupportedIpc for big-endian files and compressed record batches."""
    mv = _byte_view(buffer)
    size = len(mv)
    if size < 18 or mv[:6] != _MAGIC or mv[size - 6 :] != _MAGIC:
        raise IpcFormatError("not an Arrow IPC file (no ARROW1 magic at both ends)")
    footer_length = _I32.unpack_from(mv, size - 10)[0]
    footer_start = size - 10 - footer_length
    if footer_length <= 0 or footer_start < 8:
        raise IpcFormatError(f"footer length {footer_length} does not fit a {size}-byte file")
    footer = _Flat(mv[footer_start : size - 10], "footer").root()
    ipc = IpcFile(mv, footer, footer_start)
    if ipc.num_batches:
        ipc._batch(0)  # compressed files are written compressed throughout: say so at open
    return ipc


def read_schema(message: Any) -> list[Field]:
    """The fields of a serialized Schema message, as ``pyarrow.Schema.serialize()`` writes
    it (0xFFFFFFFF continuation, length, Message flatbuffer; the legacy form without the
    continuation is accepted too). Unread types are listed with id "other"."""
    mv = _byte_view(message)
    root = _message_flat(mv, 0, len(mv), "schema message").root()
    if root.scalar(1, _U8, 0) != _MESSAGE_SCHEMA:
        raise IpcFormatError("the message is not a schema")
    schema = root.table(2)
    if schema is None:
        raise IpcFormatError("the schema message has no schema")
    return _flat_schema(schema, root.scalar(0, _I16, 0))[0]


# --- pyarrow arrays (for callers that already hold pyarrow) -------------------------------


def field_type_from_arrow(typ: Any) -> FieldType:
    """The FieldType of a pyarrow DataType: equal to what the IPC path gives for a file
    with that type. Extension types map to their storage type."""
    import pyarrow as pa  # only called by code that already holds pyarrow

    types = pa.types
    if isinstance(typ, pa.BaseExtensionType):
        typ = typ.storage_type
    if types.is_dictionary(typ):
        return _other(
            _dictionary_name(field_type_from_arrow(typ.value_type), field_type_from_arrow(typ.index_type))
        )
    if types.is_null(typ):
        return _NULL
    if types.is_integer(typ):
        return _int_type(typ.bit_width, types.is_signed_integer(typ))
    if types.is_floating(typ):
        return _float_type(typ.bit_width)
    if types.is_boolean(typ):
        return _BOOL
    if types.is_date32(typ):
        return _temporal_type(32, "date32[day]")
    if types.is_date64(typ):
        return _temporal_type(64, "date64[ms]")
    if types.is_time(typ):
        return _temporal_type(typ.bit_width, f"time{typ.bit_width}[{typ.unit}]")
    if types.is_timestamp(typ):
        return _temporal_type(64, _timestamp_name(typ.unit, typ.tz))
    if types.is_duration(typ):
        return _temporal_type(64, f"duration[{typ.unit}]")
    if types.is_decimal(typ):
        return _other(_decimal_name(typ.bit_width, typ.precision, typ.scale))
    for is_kind, is_utf8, large in (
        (types.is_string, True, False),
        (types.is_large_string, True, True),
        (types.is_binary, False, False),
        (types.is_large_binary, False, True),
    ):
        if is_kind(typ):
            return _bytes_type(is_utf8, large)
    if types.is_fixed_size_binary(typ):
        return _fixed_binary_type(typ.byte_width)
    if types.is_map(typ):
        return _other("map")
    if types.is_list(typ) or types.is_large_list(typ):
        return _list_type(_arrow_field(typ.value_field), large=types.is_large_list(typ))
    if types.is_fixed_size_list(typ):
        return _fixed_list_type(_arrow_field(typ.value_field), typ.list_size)
    for is_kind, name in (
        (types.is_struct, "struct"),
        (types.is_union, "union"),
        (types.is_interval, "interval"),
        (types.is_run_end_encoded, "run_end_encoded"),
        (types.is_binary_view, "binary_view"),
        (types.is_string_view, "string_view"),
        (types.is_list_view, "list_view"),
        (types.is_large_list_view, "large_list_view"),
    ):
        if is_kind(typ):
            return _other(name)
    return _other(str(typ))


def _arrow_field(field: Any) -> Field:
    return Field(field.name, field.nullable, field_type_from_arrow(field.type))


def _arrow_bits(buffer: Any, bit_offset: int, count: int) -> np.ndarray:
    """Bits ``[bit_offset, bit_offset + count)`` of a pyarrow bitmap buffer, unpacked."""
    if count == 0:
        return np.zeros(0, np.bool_)
    skip = bit_offset % 8
    packed = np.frombuffer(buffer, np.uint8, (skip + count + 7) // 8, bit_offset // 8)
    return np.unpackbits(packed, count=skip + count, bitorder="little")[skip:].view(np.bool_)


def _arrow_values(buffer: Any, dtype: np.dtype, start: int, count: int) -> np.ndarray:
    if count == 0 or buffer is None:
        return np.zeros(count, dtype)
    return np.frombuffer(buffer, dtype, count, start * dtype.itemsize)


def _arrow_column(array: Any, t: FieldType) -> Column:
    length = len(array)
    if t.id == "null":
        return Column(t, length, length, None, None, None)
    start = array.offset
    buffers = array.buffers()
    nulls = array.null_count
    column = Column(t, length, nulls, _arrow_bits(buffers[0], start, length) if nulls else None, None, None)
    if t.id in ("int", "float", "temporal"):
        column.values = _arrow_values(buffers[1], t.dtype, start, length)
    elif t.id == "bool":
        column.values = _arrow_bits(buffers[1], start, length)
    elif t.id in ("utf8", "binary"):
        column.offsets = _arrow_values(buffers[1], t.offsets_dtype, start, length + 1)
        data = buffers[2]
        column.values = np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8)
    elif t.id == "fixed_binary":
        column.values = _arrow_values(
            buffers[1], np.dtype(np.uint8), start * t.width, length * t.width
        ).reshape(length, t.width)
    elif t.id == "list":
        column.offsets = _arrow_values(buffers[1], t.offsets_dtype, start, length + 1)
        column.child = _arrow_column(array.values, t.child.type)  # .values ignores the list's offset
    elif t.id == "fixed_list":
        child = array.values.slice(start * t.width, length * t.width)
        column.child = _arrow_column(child, t.child.type)
    else:
        raise UnsupportedIpc(f"type {t.arrow} is not read by ipcview")
    return column


def column_from_arrow(array: Any) -> Column:
    """The Column of a pyarrow Array (or ChunkedArray: one chunk is used as is, several are
    combined, which copies), equal to what the IPC path gives for the same rows. A slice
    (non-zero offset) is normalised: values, bits and the fixed-size list child describe
    rows ``[0, len)``; offsets are sliced but not rebased. Raises UnsupportedIpc for a
    type this reader does not read."""
    import pyarrow as pa  # only called by code that already holds pyarrow

    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    t = field_type_from_arrow(array.type)
    if t.id == "other":
        raise UnsupportedIpc(f"type {t.arrow} is not read by ipcview")
    return _arrow_column(array, t)
