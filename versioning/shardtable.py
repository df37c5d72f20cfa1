"""Shard tables: the list of shards that makes up one version, stored as one Parquet object.

A :class:`ShardTable` is an immutable sequence of :class:`ShardEntry` kept as Arrow/NumPy
columns, not as a list of Python objects, so a table of a million shards opens in a
few tens of milliseconds: :meth:`ShardTable.decode` reads the Parquet bytes and wraps
the columns; entries are materialized only when indexed or iterated.

Invariants (checked on construction and on decode): every id is 32 bytes (64 hex
digits), counts are non-negative, and ``first_record`` of each shard is the number of
records in the shards before it, so :meth:`ShardTable.locate` is a binary search.

Encoding is deterministic: the same entries give the same bytes (and so the same data
hash) with the same pyarrow writer. Ids are stored as ``fixed_size_binary(32)``; the
``chunks`` column lists, per shard, the ids of other objects it references (chunks
of big files), so gc and verify need not open shards.
"""

from __future__ import annotations

import binascii
import builtins
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cachetier.errors import BadInputError, IntegrityError
from cachetier.hashing import is_object_id
from cachetier.objects import ObjectStore

__all__ = ["ShardEntry", "ShardTable", "load_shard_table", "save_shard_table"]

_ID_BYTES = 32
_ID_TYPE = pa.binary(_ID_BYTES)
_LIST_TYPE = pa.list_(_ID_TYPE)
_ITER_BATCH = 1 << 14
_COUNT_COLUMNS = ("records", "bytes", "uncompressed_bytes", "first_record")
_ENTRY_FIELDS = ("hash", *_COUNT_COLUMNS, "chunks")
#: Parquet schema of a stored shard table; ``format`` in the schema metadata versions it.
TABLE_FORMAT = b"1"
_SCHEMA = pa.schema(
    [
        pa.field("hash", _ID_TYPE, nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("uncompressed_bytes", pa.int64(), nullable=False),
        pa.field("first_record", pa.int64(), nullable=False),
        pa.field("chunks", _LIST_TYPE, nullable=False),
    ],
    metadata={b"tierdata.shard_table.format": TABLE_FORMAT},
)
# Fixed writer options: part of the determinism promise. Changing them changes data hashes.
# Ids are random bytes that do not compress: storing them plain halves the decode time.
_ZSTD_COLUMNS = ("records", "bytes", "uncompressed_bytes", "first_record", "chunks")
_WRITE_OPTIONS: dict[str, Any] = {
    "row_group_size": 1 << 17,
    "compression": {"hash": "none", **dict.fromkeys(_ZSTD_COLUMNS, "zstd")},
    "compression_level": dict.fromkeys(_ZSTD_COLUMNS, 3),
    "use_dictionary": False,
    "write_statistics": False,
    "version": "2.6",
    "data_page_version": "1.0",
}


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One shard of a version: its object id, counts, position and referenced chunk ids."""

    hash: str
    records: int
    bytes: int
    uncompressed_bytes: int = 0
    first_record: int = 0
    chunks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_hex_id(self.hash, "shard hash")
        for name in _COUNT_COLUMNS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise BadInputError(
                    f"shard {self.hash}: '{name}' must be a non-negative integer, got {value!r}"
                )
            object.__setattr__(self, name, int(value))
        if isinstance(self.chunks, str):
            raise BadInputError(f"shard {self.hash}: 'chunks' must be a list of ids, got {self.chunks!r}")
        chunks = tuple(self.chunks)
        for chunk in chunks:
            _check_hex_id(chunk, f"shard {self.hash}: chunk id")
        object.__setattr__(self, "chunks", chunks)


def _trusted_entry(
    hash: str, records: int, size: int, uncompressed_bytes: int, first_record: int, chunks: tuple[str, ...]
) -> ShardEntry:
    """Build an entry from a validated table without re-validating (fast iteration of 1M shards)."""
    entry = _new_entry(ShardEntry)
    # The slot descriptors write past the frozen __setattr__, as object.__setattr__ would.
    _SLOTS[0](entry, hash)
    _SLOTS[1](entry, records)
    _SLOTS[2](entry, size)
    _SLOTS[3](entry, uncompressed_bytes)
    _SLOTS[4](entry, first_record)
    _SLOTS[5](entry, chunks)
    return entry


_new_entry = object.__new__
_SLOTS = tuple(getattr(ShardEntry, name).__set__ for name in _ENTRY_FIELDS)


class ShardTable(Sequence[ShardEntry]):
    """An immutable, column-backed sequence of shard entries with cumulative record offsets."""

    __slots__ = ("_bytes", "_chunks", "_first", "_hashes", "_records", "_uncompressed")

    def __init__(
        self,
        hashes: builtins.bytes | memoryview | np.ndarray,
        records: Any,
        bytes: Any,
        uncompressed_bytes: Any,
        chunks: pa.ListArray | None = None,
        *,
        copy: bool = True,
    ):
        """Wrap columns: ``hashes`` is ``n * 32`` raw bytes; counts are int sequences of length n.

        ``first_record`` is always computed here (cumulative records), so it cannot be wrong.
        ``chunks`` is a ``list<fixed_size_binary(32)>`` array (None: no chunks anywhere).
        Prefer :meth:`from_entries`, :meth:`from_arrays` or :meth:`decode`. With ``copy=False``
        the columns are wrapped as they are (the caller promises never to change them).
        """
        raw = hashes.view(np.uint8) if isinstance(hashes, np.ndarray) else np.frombuffer(hashes, np.uint8)
        if copy and raw.flags.writeable:  # the caller could change it later: keep our own copy
            raw = raw.copy()
        raw = raw.reshape(-1)
        if raw.size % _ID_BYTES:
            raise BadInputError(f"shard hashes hold {raw.size} bytes, not a multiple of {_ID_BYTES}")
        n = raw.size // _ID_BYTES
        self._hashes = raw.reshape(n, _ID_BYTES)
        self._hashes.flags.writeable = False
        self._records = _count_column(records, "records", n, copy)
        self._bytes = _count_column(bytes, "bytes", n, copy)
        self._uncompressed = _count_column(uncompressed_bytes, "uncompressed_bytes", n, copy)
        first = np.zeros(n, dtype=np.int64)
        if n:
            np.cumsum(self._records[:-1], out=first[1:])
        first.flags.writeable = False
        self._first = first
        if chunks is None:
            zeros = pa.py_buffer(np.zeros(n + 1, np.int32))
            offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, zeros])
            chunks = pa.ListArray.from_arrays(offsets, pa.array([], _ID_TYPE))
        chunks = _as_list_array(chunks)
        if len(chunks) != n or chunks.null_count:
            raise BadInputError(f"'chunks' must hold one list per shard ({n}), got {len(chunks)}")
        if _list_values(chunks).null_count:
            raise BadInputError("'chunks' holds a null id")
        self._chunks = chunks

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_entries(cls, entries: Iterable[ShardEntry]) -> ShardTable:
        """Build a table from entries in order; their ``first_record`` is recomputed."""
        entries = list(entries)
        hashes = b"".join(builtins.bytes.fromhex(e.hash) for e in entries)
        chunks = pa.array([[builtins.bytes.fromhex(c) for c in e.chunks] for e in entries], _LIST_TYPE)
        return cls(
            hashes,
            [e.records for e in entries],
            [e.bytes for e in entries],
            [e.uncompressed_bytes for e in entries],
            chunks,
        )

    @classmethod
    def from_arrays(
        cls,
        hashes: Sequence[str] | builtins.bytes | np.ndarray,
        records: Any,
        bytes: Any,
        uncompressed_bytes: Any = None,
        chunks: Sequence[Sequence[str]] | pa.Array | None = None,
    ) -> ShardTable:
        """Build a table from columns: hashes as hex strings or raw ``n * 32`` bytes, counts as arrays."""
        if isinstance(hashes, (builtins.bytes, bytearray, memoryview, np.ndarray)):
            raw = hashes
        else:
            for h in hashes:
                _check_hex_id(h, "shard hash")
            raw = binascii.unhexlify("".join(hashes))
        if uncompressed_bytes is None:
            uncompressed_bytes = np.zeros(len(np.asarray(records)), np.int64)
        if chunks is not None and not isinstance(chunks, (pa.Array, pa.ChunkedArray)):
            for row in chunks:
                for c in row:
                    _check_hex_id(c, "chunk id")
            chunks = pa.array([[builtins.bytes.fromhex(c) for c in row] for row in chunks], _LIST_TYPE)
        return cls(raw, records, bytes, uncompressed_bytes, chunks)

    @classmethod
    def empty(cls) -> ShardTable:
        """Return a table with no shards."""
        return cls(b"", [], [], [])

    def concat(self, *others: ShardTable) -> ShardTable:
        """Return this table followed by ``others``, with ``first_record`` recomputed."""
        tables = (self, *others)
        return ShardTable(
            np.concatenate([t._hashes for t in tables]),
            np.concatenate([t._records for t in tables]),
            np.concatenate([t._bytes for t in tables]),
            np.concatenate([t._uncompressed for t in tables]),
            pa.concat_arrays([t._chunks for t in tables]),
        )

    # -- encoding -----------------------------------------------------------------------

    def to_arrow(self) -> pa.Table:
        """Return the table as Arrow columns (the Parquet layout; ``hash`` as fixed_size_binary(32))."""
        n = len(self)
        hashes = pa.FixedSizeBinaryArray.from_buffers(
            _ID_TYPE, n, [None, pa.py_buffer(np.ascontiguousarray(self._hashes))]
        )
        counts = [_int64_array(c) for c in (self._records, self._bytes, self._uncompressed, self._first)]
        return pa.Table.from_arrays([hashes, *counts, self._chunks], schema=_SCHEMA)

    def encode(self) -> builtins.bytes:
        """Return the deterministic Parquet bytes of this table."""
        sink = pa.BufferOutputStream()
        pq.write_table(self.to_arrow(), sink, **_WRITE_OPTIONS)
        return sink.getvalue().to_pybytes()

    @classmethod
    def decode(cls, data: builtins.bytes | memoryview, subject: str = "shard table") -> ShardTable:
        """Parse Parquet bytes written by :meth:`encode`; IntegrityError names ``subject`` if malformed."""
        try:
            # ParquetFile, not read_table: read_table imports pyarrow.dataset (~15 MB per process).
            table = pq.ParquetFile(pa.BufferReader(data)).read()
        except (pa.ArrowException, OSError) as e:
            raise IntegrityError(f"not a readable shard table: {e}", subject=subject) from e
        if [(f.name, f.type) for f in table.schema] != [(f.name, f.type) for f in _SCHEMA]:
            raise IntegrityError(f"unexpected shard table columns: {table.schema.names}", subject=subject)
        version = (table.schema.metadata or {}).get(b"tierdata.shard_table.format")
        if version != TABLE_FORMAT:
            raise IntegrityError(
                f"unsupported shard table format {version!r}", subject=subject, hint="upgrade tierdata"
            )
        hashes = table.column("hash").combine_chunks()
        if hashes.null_count:
            raise IntegrityError("null shard hash", subject=subject)
        try:
            result = cls(
                _fixed_binary_bytes(hashes),
                _column_numpy(table, "records"),
                _column_numpy(table, "bytes"),
                _column_numpy(table, "uncompressed_bytes"),
                table.column("chunks").combine_chunks(),
                copy=False,
            )
        except BadInputError as e:
            raise IntegrityError(e.message, subject=subject) from e
        if not np.array_equal(result._first, _column_numpy(table, "first_record")):
            raise IntegrityError("first_record is not the running total of records", subject=subject)
        return result

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._hashes.shape[0]

    @overload
    def __getitem__(self, index: int) -> ShardEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[ShardEntry]: ...

    def __getitem__(self, index: int | slice) -> ShardEntry | list[ShardEntry]:
        """Return entry ``index`` (negative counts from the end); a slice gives a list of entries."""
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = int(index)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"shard index {index} out of range for a table of {n} shards")
        return _trusted_entry(
            self._hashes[i].tobytes().hex(),
            int(self._records[i]),
            int(self._bytes[i]),
            int(self._uncompressed[i]),
            int(self._first[i]),
            tuple(c.hex() for c in self._chunks[i].as_py()),
        )

    def __iter__(self) -> Iterator[ShardEntry]:
        # Convert columns a batch at a time: per-element Arrow access would cost microseconds each.
        for start in range(0, len(self), _ITER_BATCH):
            stop = min(start + _ITER_BATCH, len(self))
            chunk_lists = self._chunks[start:stop]
            offsets = chunk_lists.offsets.to_numpy()
            chunk_ids = _hex_ids(_fixed_binary_bytes(_list_values(chunk_lists)))
            rows = zip(
                _hex_ids(self._hashes[start:stop]),
                self._records[start:stop].tolist(),
                self._bytes[start:stop].tolist(),
                self._uncompressed[start:stop].tolist(),
                self._first[start:stop].tolist(),
                range(stop - start),
            )
            base = int(offsets[0])
            for h, rec, size, raw_size, first, k in rows:
                lo, hi = int(offsets[k]) - base, int(offsets[k + 1]) - base
                yield _trusted_entry(h, rec, size, raw_size, first, tuple(chunk_ids[lo:hi]))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShardTable):
            return NotImplemented
        return (
            np.array_equal(self._hashes, other._hashes)
            and np.array_equal(self._records, other._records)
            and np.array_equal(self._bytes, other._bytes)
            and np.array_equal(self._uncompressed, other._uncompressed)
            and self._chunks.equals(other._chunks)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards, {self.records_total} records, {self.bytes_total} bytes)"

    def hashes(self) -> list[str]:
        """Return every shard id as hex, in table order (a list of ``len(self)`` strings)."""
        return _hex_ids(self._hashes)

    def raw_hashes(self) -> np.ndarray:
        """Return the ids as a read-only ``(n, 32)`` uint8 array (no copies, no hex)."""
        view = self._hashes.view()
        view.flags.writeable = False
        return view

    @property
    def records(self) -> np.ndarray:
        """Records per shard (read-only int64 array)."""
        return self._records

    @property
    def uncompressed_bytes(self) -> np.ndarray:
        """Decoded (uncompressed) bytes per shard (read-only int64 array)."""
        return self._uncompressed

    @property
    def first_records(self) -> np.ndarray:
        """Global index of each shard's first record (read-only int64 array)."""
        return self._first

    @property
    def records_total(self) -> int:
        """Number of records in all shards."""
        return int(self._first[-1] + self._records[-1]) if len(self) else 0

    @property
    def bytes_total(self) -> int:
        """Stored bytes of all shards (chunks not included)."""
        return int(self._bytes.sum())

    @property
    def uncompressed_bytes_total(self) -> int:
        """Uncompressed bytes of all shards."""
        return int(self._uncompressed.sum())

    def chunk_ids(self) -> set[str]:
        """Return the ids of every chunk object any shard references."""
        return set(_hex_ids(_fixed_binary_bytes(_list_values(self._chunks))))

    def locate(self, record_index: int) -> tuple[int, int]:
        """Return ``(shard_index, offset_in_shard)`` of global record ``record_index`` (binary search)."""
        total = self.records_total
        if not 0 <= record_index < total:
            raise IndexError(f"record index {record_index} out of range for a version of {total} records")
        shard = int(np.searchsorted(self._first, record_index, side="right")) - 1
        return shard, int(record_index - self._first[shard])


def save_shard_table(objects: ObjectStore, table: ShardTable) -> str:
    """Store ``table`` as one object; return its id (the version's data hash)."""
    return objects.put(table.encode())


def load_shard_table(objects: ObjectStore, data_hash: str) -> ShardTable:
    """Read, verify and decode the shard table object ``data_hash``."""
    return ShardTable.decode(objects.get(data_hash), subject=f"shard table {data_hash}")


def _check_hex_id(value: Any, what: str) -> None:
    if not isinstance(value, str) or not is_object_id(value):
        raise BadInputError(f"{what} must be a 64-digit lowercase hex id, got {value!r}")


def _count_column(values: Any, name: str, n: int, copy: bool = True) -> np.ndarray:
    array = np.asarray(values)
    if array.size == 0:
        array = array.astype(np.int64)
    if array.ndim != 1 or len(array) != n:
        raise BadInputError(f"'{name}' must hold one count per shard ({n}), got shape {array.shape}")
    if array.dtype.kind not in "iu":
        raise BadInputError(f"'{name}' must be integers, got {array.dtype} values")
    array = array.astype(np.int64, copy=copy)
    if array.flags.writeable and not copy:
        array = array.view()
    if n and array.min() < 0:
        bad = int(np.flatnonzero(array < 0)[0])
        raise BadInputError(f"'{name}' of shard {bad} is negative: {int(array[bad])}")
    array.flags.writeable = False
    return array


def _column_numpy(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def _as_list_array(chunks: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    if isinstance(chunks, pa.ChunkedArray):
        chunks = chunks.combine_chunks() if chunks.num_chunks else pa.array([], _LIST_TYPE)
    if chunks.type != _LIST_TYPE:
        try:
            chunks = chunks.cast(_LIST_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise BadInputError(f"'chunks' must be lists of 32-byte ids, got {chunks.type}") from e
    return chunks


def _list_values(lists: pa.ListArray) -> pa.Array:
    """The values held by ``lists`` (no nulls), in order: ``flatten()`` without importing
    pyarrow.compute, which costs ~9 MB in every process that opens a version."""
    offsets = lists.offsets
    start, end = (offsets[0].as_py(), offsets[-1].as_py()) if len(lists) else (0, 0)
    return lists.values.slice(start, end - start)


def _fixed_binary_bytes(array: pa.FixedSizeBinaryArray) -> np.ndarray:
    if not len(array):
        return np.zeros(0, np.uint8)
    start = array.offset * _ID_BYTES
    return np.frombuffer(array.buffers()[1], np.uint8)[start : start + len(array) * _ID_BYTES]


def _hex_ids(raw: np.ndarray) -> list[str]:
    text = binascii.hexlify(np.ascontiguousarray(raw).data).decode("ascii")
    width = 2 * _ID_BYTES
    return [text[i : i + width] for i in range(0, len(text), width)]


def _int64_array(values: np.ndarray) -> pa.Array:
    """An int64 Arrow array over ``values`` (no copy when they are int64 already).

    ``pa.array`` on a numpy array would import ``numpy.ma`` to look for a mask (~18 ms at
    the start of every command that writes a shard table).
    """
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])
