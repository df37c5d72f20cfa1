"""Record hashes: a 16-byte xxh3-128 digest of each record's canonical encoding.

The digest names a record by its content (column names, types and values), whatever
batch, file or process it came from. Shards use it for content-defined boundaries and
store it in the hidden ``__record_hash`` column; diff and dedup compare records by it.

Canonical encoding (version 1) of one record: for each column in schema order, the
encoding of its value, concatenated. A null is the byte ``00``; a valid value is ``01``
followed by its payload:

- fixed-width values (integers, floats, temporals, decimals, fixed-size binary): the
  little-endian bytes Arrow holds; booleans one byte ``00``/``01``;
- strings and binaries: an 8-byte little-endian length, then the bytes;
- lists and maps: an 8-byte element count, then each element's encoding;
- fixed-size lists and structs: each child's encoding;
- dictionaries and extension types: encoded as their values / storage.

Column names and types enter through the hash seed (a 64-bit hash of the schema), so
the same values under another name or type hash differently. The encoding is built
column-wise with Arrow kernels and numpy over whole batches; only the final per-record
hash call is a Python loop (about half a microsecond a record). Its length is the
record's *canonical size*, which shard boundaries count in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

# pyarrow.compute is imported inside the functions that hash records: a process that only
# reads shards (a DataLoader worker) imports this module too, and the import costs ~9 MB.

__all__ = [
    "HASH_COLUMN",
    "RECORD_HASH_TYPE",
    "RecordDigests",
    "digest_prefixes",
    "hash_records",
    "record_hashes",
    "schema_seed",
]

#: The hidden column every shard carries: the record hash of each row.
HASH_COLUMN = "__record_hash"
RECORD_HASH_TYPE = pa.binary(16)
_ENCODING_TAG = b"tierdata.record/1"
_EMPTY = pa.scalar(b"", pa.large_binary())


@dataclass(frozen=True, slots=True)
class RecordDigests:
    """The hash and canonical size of every record of a batch, in row order."""

    hashes: pa.FixedSizeBinaryArray
    sizes: np.ndarray  # int64, bytes of each record's canonical encoding

    def __len__(self) -> int:
        return len(self.hashes)


def record_hashes(batch: pa.RecordBatch | pa.Table) -> pa.FixedSizeBinaryArray:
    """Return the xxh3-128 digest of each record as a ``fixed_size_binary(16)`` array."""
    return hash_records(batch).hashes


def hash_records(batch: pa.RecordBatch | pa.Table) -> RecordDigests:
    """Return hashes and canonical sizes of the records of ``batch``; deterministic everywhere.

    Hidden columns (names starting with ``__``) take no part, so a shard's records hash
    the same as the source batch they came from.
    """
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else _empty_batch(batch.schema)
    names = [n for n in batch.schema.names if not n.startswith("__")]
    n = batch.num_rows
    if n == 0:
        return RecordDigests(pa.array([], RECORD_HASH_TYPE), np.zeros(0, np.int64))
    schema = pa.schema([batch.schema.field(name) for name in names])
    seed = schema_seed(schema)
    segments = _segments([batch.column(name) for name in names], n)
    if len(segments) == 1:
        joined, sizes = _digest_contiguous(segments[0], seed)
    else:
        joined, sizes = _digest_segments(segments, seed)
    hashes = pa.FixedSizeBinaryArray.from_buffers(RECORD_HASH_TYPE, n, [None, pa.py_buffer(joined)])
    return RecordDigests(hashes, sizes)


# A binary column whose values average this many bytes is hashed in place (no copy).
_DIRECT_FROM = 1024


def _segments(columns: list[pa.Array], n: int) -> list[tuple[np.ndarray, np.ndarray, memoryview]]:
    """Split the row encoding into spans ``(starts, ends, buffer)`` that concatenate to it.

    Small columns are encoded and joined into one buffer; large binary values are hashed
    where Arrow holds them, after their length prefix, which saves copying them twice.
    """
    segments = []
    group: list[pa.LargeBinaryArray] = []
    for column in columns:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        direct = _direct_span(column)
        if direct is None:
            group.append(_encode(column))
            continue
        valid, starts, ends, data = direct
        group.append(_prefixes(valid, ends - starts))
        segments.append(_joined_span(group, n))
        segments.append((starts, ends, data))
        group = []
    if group or not segments:
        segments.append(_joined_span(group, n))
    return segments


def _direct_span(column: pa.Array):
    t = column.type
    if not (
        pa.types.is_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_large_string(t)
    ):
        return None
    n = len(column)
    _, offsets_buf, data = column.buffers()
    if data is None or data.size < _DIRECT_FROM * n:
        return None
    dtype = np.int64 if pa.types.is_large_binary(t) or pa.types.is_large_string(t) else np.int32
    width = np.dtype(dtype).itemsize
    offsets = np.frombuffer(offsets_buf, dtype, count=n + 1, offset=width * column.offset).astype(np.int64)
    valid = _valid(column)
    starts, ends = offsets[:-1], offsets[1:]
    if not valid.all():
        ends = np.where(valid, ends, starts)
    if (ends - starts).sum() < _DIRECT_FROM * n:
        return None
    return valid, starts, ends, memoryview(data)


def _joined_span(group: list[pa.LargeBinaryArray], n: int) -> tuple[np.ndarray, np.ndarray, memoryview]:
    import pyarrow.compute as pc  # on first use: see the note at the imports

    if not group:
        rows = _from_parts(np.zeros(n + 1, np.int64), None)
    elif len(group) == 1:
        rows = group[0]
    else:
        rows = pc.binary_join_element_wise(*group, _EMPTY)
    offsets, data = _parts(rows)
    return offsets[:-1], offsets[1:], memoryview(data) if data is not None else memoryview(b"")


def _digest_contiguous(segment, seed: int) -> tuple[bytes, np.ndarray]:
    starts, ends, view = segment
    digest = xxhash.xxh3_128_digest
    joined = b"".join([digest(view[a:b], seed) for a, b in zip(starts.tolist(), ends.tolist())])
    return joined, (ends - starts).astype(np.int64)


def _digest_segments(segments, seed: int) -> tuple[bytes, np.ndarray]:
    spans = [(view, starts.tolist(), ends.tolist()) for starts, ends, view in segments]
    new = xxhash.xxh3_128
    out = []
    for i in range(len(spans[0][1])):
        h = new(seed=seed)
        for view, starts, ends in spans:
            h.update(view[starts[i] : ends[i]])
        out.append(h.digest())
    sizes = sum((ends - starts).astype(np.int64) for starts, ends, _ in segments)
    return b"".join(out), sizes


def digest_prefixes(hashes: pa.FixedSizeBinaryArray, *, tail: bool = False) -> np.ndarray:
    """Return the first 8 bytes of each digest (the last 8 with ``tail``) as little-endian
    ``uint64`` (the first decide shard boundaries; the last sketch a shard for deltas)."""
    n = len(hashes)
    if n == 0:
        return np.zeros(0, np.uint64)
    raw = np.frombuffer(hashes.buffers()[1], np.uint8, count=16 * n, offset=16 * hashes.offset)
    part = slice(8, 16) if tail else slice(0, 8)
    return raw.reshape(n, 16)[:, part].copy().view("<u8").ravel()


def schema_seed(schema: pa.Schema) -> int:
    """Return the 64-bit hash seed of a schema: its visible column names and canonical types."""
    parts = [_ENCODING_TAG]
    for field in schema:
        if not field.name.startswith("__"):
            parts.append(field.name.encode() + b"\x01" + _type_key(field.type).encode())
    return xxhash.xxh3_64_intdigest(b"\x00".join(parts))


def _type_key(t: pa.DataType) -> str:
    """A canonical spelling of a type that ignores list item names (``item`` vs ``element``)."""
    if pa.types.is_dictionary(t):
        return _type_key(t.value_type)
    if isinstance(t, pa.ExtensionType):
        return _type_key(t.storage_type)
    if pa.types.is_map(t):
        return f"map<{_type_key(t.key_type)},{_type_key(t.item_type)}>"
    if pa.types.is_fixed_size_list(t):
        return f"fixed_list<{_type_key(t.value_type)},{t.list_size}>"
    if _is_listlike(t):
        return f"list<{_type_key(t.value_type)}>"
    if pa.types.is_struct(t):
        inner = ",".join(f"{t.field(i).name}:{_type_key(t.field(i).type)}" for i in range(t.num_fields))
        return f"struct<{inner}>"
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    return str(t)


def _is_listlike(t: pa.DataType) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


# ---------------------------------------------------------------- encoders (array → large_binary)


def _encode(arr: pa.Array | pa.ChunkedArray) -> pa.LargeBinaryArray:
    """Encode every value of ``arr`` (validity byte + payload) as one large_binary element."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if pa.types.is_dictionary(t):
        return _encode(arr.dictionary_decode())
    if isinstance(t, pa.ExtensionType):
        return _encode(arr.storage)
    if pa.types.is_null(t):
        return _fixed_rows(np.zeros((len(arr), 1), np.uint8), np.zeros(len(arr), bool))
    if pa.types.is_boolean(t):
        values = np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), np.uint8)
        return _fixed_rows(values.reshape(-1, 1), _valid(arr))
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _encode(arr.cast(pa.large_binary()))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return _encode_binary(arr.cast(pa.large_binary()))
    if pa.types.is_large_binary(t):
        return _encode_binary(arr)
    if pa.types.is_list_view(t):
        return _encode(arr.cast(pa.list_(t.value_field)))
    if pa.types.is_large_list_view(t):
        return _encode(arr.cast(pa.large_list(t.value_field)))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        child = _encode(arr.values)
        return _encode_ranges(arr, child, arr.offsets.to_numpy().astype(np.int64), counted=True)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        child = _encode(arr.values.slice(arr.offset * size, len(arr) * size))
        starts = np.arange(len(arr) + 1, dtype=np.int64) * size
        return _encode_ranges(arr, child, starts, counted=False)
    if pa.types.is_struct(t):
        return _encode_struct(arr)
    width = _byte_width(t)
    if width:
        return _encode_fixed(arr, width)
    return _encode_fallback(arr)


def _byte_width(t: pa.DataType) -> int:
    try:
        bits = t.bit_width
    except ValueError:
        return 0
    return bits // 8 if bits % 8 == 0 else 0


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool)


def _encode_fixed(arr: pa.Array, width: int) -> pa.LargeBinaryArray:
    n = len(arr)
    buf = arr.buffers()[1]
    if n == 0 or buf is None:
        return pa.array([], pa.large_binary())
    values = np.frombuffer(buf, np.uint8, count=n * width, offset=arr.offset * width).reshape(n, width)
    return _fixed_rows(values, _valid(arr))


def _fixed_rows(values: np.ndarray, valid: np.ndarray) -> pa.LargeBinaryArray:
    """Rows of ``01`` + value bytes for valid entries, ``00`` for nulls."""
    n, width = values.shape
    out = np.empty((n, width + 1), np.uint8)
    out[:, 0] = valid
    out[:, 1:] = values
    if valid.all():
        offsets = np.arange(n + 1, dtype=np.int64) * (width + 1)
        data = out.ravel()
    else:
        keep = np.ones((n, width + 1), bool)
        keep[:, 1:] = valid[:, None]
        data = out[keep]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(1 + width * valid.astype(np.int64), out=offsets[1:])
    return _from_parts(offsets, data)


def _prefixes(valid: np.ndarray, counts: np.ndarray) -> pa.LargeBinaryArray:
    """``01`` + 8-byte little-endian count for valid entries, ``00`` for nulls."""
    counts = np.where(valid, counts, 0).astype("<i8")
    return _fixed_rows(counts.view(np.uint8).reshape(-1, 8), valid)


def _encode_binary(arr: pa.LargeBinaryArray) -> pa.LargeBinaryArray:
    import pyarrow.compute as pc  # on first use: see the note at the imports

    valid = _valid(arr)
    lengths = pc.binary_length(arr).fill_null(0).to_numpy().astype(np.int64)
    filled = arr.fill_null(b"") if arr.null_count else arr
    return pc.binary_join_element_wise(_prefixes(valid, lengths), filled, _EMPTY)


def _encode_ranges(arr: pa.Array, child: pa.LargeBinaryArray, starts: np.ndarray, *, counted: bool):
    """Concatenate the encodings of child elements ``[starts[i], starts[i+1])`` for each element."""
    import pyarrow.compute as pc  # on first use: see the note at the imports

    valid = _valid(arr)
    child_offsets, data = _parts(child)
    byte_offsets = child_offsets[starts]
    payload = _from_parts(byte_offsets, data, offset=0)
    counts = np.diff(starts)
    if not valid.all() and np.any(counts[~valid] > 0):
        payload = pc.if_else(pa.array(valid), payload, _EMPTY)
    prefix = _prefixes(valid, counts) if counted else _fixed_rows(np.zeros((len(arr), 0), np.uint8), valid)
    return pc.binary_join_element_wise(prefix, payload, _EMPTY)


def _encode_struct(arr: pa.StructArray) -> pa.LargeBinaryArray:
    import pyarrow.compute as pc  # on first use: see the note at the imports

    valid = _valid(arr)
    children = [_encode(child) for child in arr.flatten()]
    prefix = _fixed_rows(np.zeros((len(arr), 0), np.uint8), valid)
    if not children:
        return prefix
    payload = children[0] if len(children) == 1 else pc.binary_join_element_wise(*children, _EMPTY)
    if not valid.all():
        payload = pc.if_else(pa.array(valid), payload, _EMPTY)
    return pc.binary_join_element_wise(prefix, payload, _EMPTY)


def _encode_fallback(arr: pa.Array) -> pa.LargeBinaryArray:
    """Types without a columnar rule (unions, run-end encoded, ...): their Python repr."""
    texts = [None if v is None else repr(v).encode() for v in arr.to_pylist()]
    return _encode_binary(pa.array(texts, pa.large_binary()))


# ---------------------------------------------------------------- buffer helpers


def _parts(arr: pa.LargeBinaryArray) -> tuple[np.ndarray, pa.Buffer | None]:
    """Return the ``n + 1`` int64 offsets (into the data buffer) and the data buffer."""
    if arr.type != pa.large_binary():
        arr = arr.cast(pa.large_binary())
    n = len(arr)
    _, offsets_buf, data = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64, count=n + 1, offset=8 * arr.offset)
    return offsets, data


def _from_parts(offsets: np.ndarray, data, offset: int = 0) -> pa.LargeBinaryArray:
    if data is None:
        data_buf = pa.py_buffer(b"")
    elif isinstance(data, pa.Buffer):
        data_buf = data
    else:
        data_buf = pa.py_buffer(np.ascontiguousarray(data))
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), data_buf], offset=offset
    )


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)
