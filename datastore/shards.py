"""Shards: deterministic Arrow IPC files with zstd buffers and content-defined boundaries.

A shard is an Arrow IPC *file* (random access, memory-mappable) whose buffers are
zstd-compressed at a fixed level; it holds the records' columns plus the hidden column
``__record_hash``. Writing the same records with the same options yields the same bytes
(columns are copied into fresh, offset-free arrays with zeros under their nulls; the
schema metadata is fixed; no timestamps), hence the same shard id.

**Boundaries.** A shard ends after a record whose hash meets a threshold, once the
shard holds at least ``min_size`` bytes (canonical record bytes, see
:mod:`datastore.recordhash`), or at the record that reaches ``max_size``. The threshold
makes the chance that a record ends a shard proportional to its size
(``size / (target - min)``): with a plain bit mask the expected shard would hold a fixed
*number* of records, whatever their size; this way a shard averages ``shard_size``
bytes for tiny and large records alike. Because the decision depends only on the record
itself and the bytes since the previous boundary, an edit moves at most the boundaries
of the shards around it, and a re-ingest after editing 1% of the records rewrites only
the shards holding them. (With edits scattered at random a shard of ``k`` records is
rewritten with chance ``1 - 0.99**k``: at most 10% new bytes needs ``k <= 10``, so pick
``shard_size`` to suit how the data changes.)

**Default size.** 16 MiB of canonical (uncompressed) bytes, the low end of "tens of MB":
text shards then store at about 4-8 MB after zstd, the object size at which S3 GETs
already run at full bandwidth (and at which the minio client was measured), a million
shards cover ~16 TB, a shuffle window of a few shards fits in RAM, and a clustered edit
rewrites ~16-50 MB. Scattered edits need smaller shards (see above).
``min_size`` is half the target and ``max_size`` three times it (a shard is cut at the
max with chance ``e**-5``, so forced cuts rarely break resynchronisation).
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import xxhash

from cachetier.errors import BadInputError, IntegrityError
from cachetier.hashing import DEFAULT_HASH, BytesLike, content_hash
from datastore.recordhash import HASH_COLUMN, RecordDigests, digest_prefixes, hash_records

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "FILES_SHARD_SIZE",
    "SHARD_FORMAT",
    "BoundaryCutter",
    "EncodedShard",
    "PendingShard",
    "ShardInfo",
    "ShardOptions",
    "ShardWriter",
    "batch_ends",
    "encode_rows",
    "encode_shard",
    "read_record_hashes",
    "read_shard",
    "read_shard_schema",
    "shard_batches",
    "shard_key",
    "shard_key_prefix",
    "write_shards",
]

DEFAULT_SHARD_SIZE = 16 << 20
#: Files datasets cut small shards, so 1% of files edited at random rewrites ~8% of the
#: bytes (4 MiB shards: ~97%); the object store packs them (cachetier.packs), so small
#: shards do not mean one store request each. 32 KiB: ~4% rewritten but +7% IPC overhead.
FILES_SHARD_SIZE = 64 << 10
SHARD_FORMAT = "1"
_MIN_SHARD_SIZE = 1024
_MAX_SHARD_SIZE = 2 << 30
_METADATA = {b"tierdata.shard": SHARD_FORMAT.encode()}
_READ_ALL_BELOW = 1 << 20  # read_shard opens a smaller shard once, with every column


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOptions:
    """How records become shards; equal options and records give equal shard bytes."""

    shard_size: int = DEFAULT_SHARD_SIZE
    compression_level: int = 3
    algorithm: str = DEFAULT_HASH

    def __post_init__(self) -> None:
        if not _MIN_SHARD_SIZE <= self.shard_size <= _MAX_SHARD_SIZE:
            raise BadInputError(
                f"shard size {self.shard_size} is out of range",
                subject="--shard-size",
                hint=f"use {_MIN_SHARD_SIZE} to {_MAX_SHARD_SIZE} bytes",
            )

    @property
    def min_size(self) -> int:
        """No content-defined cut before a shard holds this many canonical bytes."""
        return self.shard_size // 2

    @property
    def max_size(self) -> int:
        """A shard is cut at the record that reaches this many canonical bytes."""
        return self.shard_size * 3

    @property
    def batch_bytes(self) -> int:
        """A shard's record batches end at the record that reaches this many bytes
        (a quarter of the target, at least 1 MiB: small shards are one batch)."""
        return max(self.shard_size // 4, 1 << 20)

    def fingerprint(self) -> str:
        """A short string that changes whenever the shard bytes would change."""
        return (
            f"shard/{SHARD_FORMAT};size={self.shard_size};zstd={self.compression_level};"
            f"hash={self.algorithm};arrow={pa.__version__}"
        )


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """What a version's shard table needs to know of a stored shard."""

    hash: str
    records: int
    bytes: int
    uncompressed_bytes: int
    chunks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EncodedShard:
    """An encoded shard: its id (the content hash of ``data``), its bytes and counts."""

    hash: str
    data: bytes
    records: int
    bytes: int
    uncompressed_bytes: int
    chunks: tuple[str, ...] = ()

    @property
    def info(self) -> ShardInfo:
        """The same facts without the bytes."""
        return ShardInfo(self.hash, self.records, self.bytes, self.uncompressed_bytes, self.chunks)


@dataclass(frozen=True, slots=True)
class PendingShard:
    """The records of one shard, cut but not yet encoded (encoding can run in a thread)."""

    table: pa.Table  # visible columns only
    hashes: pa.FixedSizeBinaryArray
    sizes: np.ndarray = field(repr=False)

    @property
    def records(self) -> int:
        return self.table.num_rows

    def key(self, options: ShardOptions) -> str:
        """The ingest-index key of this shard (see :func:`shard_key`)."""
        return shard_key(self.table.schema, self.hashes, options)


def shard_key(
    schema: pa.Schema, hashes: pa.FixedSizeBinaryArray | bytes, options: ShardOptions | bytes
) -> str:
    """Equal keys mean equal shard bytes: same options, same schema, same records in order.

    ``hashes`` may be the concatenated 16-byte digests; ``options`` may be the bytes of
    :func:`shard_key_prefix` (computed once per stream).
    """
    prefix = options if isinstance(options, bytes) else shard_key_prefix(schema, options)
    if isinstance(hashes, pa.FixedSizeBinaryArray):
        n = len(hashes)
        hashes = memoryview(hashes.buffers()[1])[16 * hashes.offset : 16 * (hashes.offset + n)] if n else b""
    return xxhash.xxh3_128_hexdigest(prefix + bytes(hashes))


def shard_key_prefix(schema: pa.Schema, options: ShardOptions) -> bytes:
    """The part of :func:`shard_key` that does not depend on the records."""
    return options.fingerprint().encode() + b"\0" + schema.remove_metadata().serialize().to_pybytes() + b"\0"


class BoundaryCutter:
    """Stateful content-defined cutting over a stream of (record hash, size) pairs."""

    def __init__(self, options: ShardOptions):
        self.options = options
        self.pending_bytes = 0  # canonical bytes since the last cut
        self._gap = np.uint64(options.shard_size - options.min_size)

    def feed(self, prefixes: np.ndarray, sizes: np.ndarray) -> list[int]:
        """Return the cut positions in this slice: shards end *before* each returned index."""
        n = len(sizes)
        if n == 0:
            return []
        sizes = np.asarray(sizes, np.int64)
        # Python lists and bisect: small shards mean a cut every few records, and a numpy
        # call per search costs more than the search.
        cand_idx = self._candidates(prefixes, sizes)
        cum = (np.cumsum(sizes) + self.pending_bytes).tolist()
        base, start, cuts = 0, 0, []
        lo, hi = self.options.min_size, self.options.max_size
        while start < n:
            j_min = bisect.bisect_left(cum, base + lo)
            j_max = bisect.bisect_left(cum, base + hi)
            k = bisect.bisect_left(cand_idx, max(j_min, start))
            j_cand = cand_idx[k] if k < len(cand_idx) else n
            j = min(j_cand, j_max)
            if j >= n:
                break
            cuts.append(j + 1)
            base, start = cum[j], j + 1
        self.pending_bytes = cum[-1] - base
        return cuts

    def reset(self) -> None:
        """Forget the pending bytes (after the caller flushed the last shard)."""
        self.pending_bytes = 0

    def _candidates(self, prefixes: np.ndarray, sizes: np.ndarray) -> list[int]:
        """Records whose hash meets the mask (the chance grows with the record's size)."""
        gap = self._gap
        capped = np.minimum(sizes, int(gap)).astype(np.uint64)
        return np.flatnonzero((prefixes >> np.uint64(32)) * gap < (capped << np.uint64(32))).tolist()

    def sync_point(self, prefixes: np.ndarray, sizes: np.ndarray) -> int | None:
        """A position in this slice where a cut falls whatever came before it, or None.

        After a cut, the next one depends only on where that cut was. Whatever bytes are
        pending when the slice starts, the first cut falls in its first ``max_size`` bytes,
        so following every such start until the paths meet gives a cut that a cutter fed
        from any earlier point makes too: the records after it can be cut on their own,
        in another process, and give the same shards.
        """
        n = len(sizes)
        sizes = np.asarray(sizes, np.int64)
        cand_idx = self._candidates(prefixes, sizes)
        cum = np.cumsum(sizes).tolist()
        lo, hi = self.options.min_size, self.options.max_size

        def next_cut(start: int) -> int | None:
            base = cum[start - 1] if start else 0
            j_min = bisect.bisect_left(cum, base + lo)
            j_max = bisect.bisect_left(cum, base + hi)
            k = bisect.bisect_left(cand_idx, max(j_min, start))
            j = min(cand_idx[k] if k < len(cand_idx) else n, j_max)
            return j + 1 if j < n else None

        last_first = bisect.bisect_left(cum, hi)  # the latest record a first cut can follow
        if last_first >= n:
            return None
        # Where the first cut may fall: before record 0 (at the slice start) or after any of these.
        heads = set(range(last_first + 2))
        while len(heads) > 1:
            head = min(heads)
            heads.remove(head)
            following = next_cut(head)
            if following is None:
                return None
            heads.add(following)
        return heads.pop()


class ShardWriter:
    """Cut a stream of record batches into :class:`PendingShard` s at content-defined boundaries."""

    def __init__(self, options: ShardOptions | None = None):
        self.options = options or ShardOptions()
        self._cutter = BoundaryCutter(self.options)
        self._batches: list[pa.RecordBatch] = []
        self._digests: list[RecordDigests] = []
        self._schema: pa.Schema | None = None

    def add(self, batch: pa.RecordBatch, digests: RecordDigests | None = None) -> list[PendingShard]:
        """Append records; return the shards this batch completed (maybe none)."""
        if self._schema is None:
            self._schema = batch.schema
        elif not batch.schema.equals(self._schema):
            raise BadInputError(
                "record batches of one shard stream must share one schema",
                subject=f"{batch.schema} vs {self._schema}",
            )
        if batch.num_rows == 0:
            return []
        digests = digests or hash_records(batch)
        cuts = self._cutter.feed(digest_prefixes(digests.hashes), digests.sizes)
        done, start = [], 0
        for end in cuts:
            self._append(batch.slice(start, end - start), _slice_digests(digests, start, end))
            done.append(self._take())
            start = end
        if start < batch.num_rows:
            self._append(batch.slice(start), _slice_digests(digests, start, batch.num_rows))
        return done

    def finish(self) -> list[PendingShard]:
        """Return the last, partial shard (if any records are pending)."""
        if not self._batches:
            return []
        self._cutter.reset()
        return [self._take()]

    def _append(self, batch: pa.RecordBatch, digests: RecordDigests) -> None:
        self._batches.append(batch)
        self._digests.append(digests)

    def _take(self) -> PendingShard:
        table = pa.Table.from_batches(self._batches, schema=self._schema)
        hashes = pa.concat_arrays([d.hashes for d in self._digests])
        sizes = np.concatenate([d.sizes for d in self._digests])
        self._batches, self._digests = [], []
        return PendingShard(table, hashes, sizes)


def _slice_digests(d: RecordDigests, start: int, end: int) -> RecordDigests:
    return RecordDigests(d.hashes.slice(start, end - start), d.sizes[start:end])


def encode_shard(pending: PendingShard, options: ShardOptions | None = None) -> EncodedShard:
    """Encode a shard as a deterministic Arrow IPC file with zstd buffers; safe in threads."""
    options = options or ShardOptions()
    table = pending.table
    if any(pa.types.is_dictionary(f.type) for f in table.schema):
        table = table.unify_dictionaries()
    schema = pa.schema(
        [*table.schema, pa.field(HASH_COLUMN, pending.hashes.type, nullable=False)], metadata=_METADATA
    )
    batches = []
    for start, end in _batch_ranges(pending.sizes, options.batch_bytes):
        columns = [_fresh(column.slice(start, end - start)) for column in table.columns]
        whole = start == 0 and end == pending.records
        columns.append(
            pending.hashes
            if whole and _is_exact(pending.hashes)
            else _fresh(pending.hashes.slice(start, end - start))
        )
        batches.append(pa.RecordBatch.from_arrays(columns, schema=schema))
    data = _write_file(schema, batches, options.compression_level)
    return EncodedShard(
        hash=content_hash(data, options.algorithm),
        data=data,
        records=table.num_rows,
        bytes=len(data),
        uncompressed_bytes=sum(b.get_total_buffer_size() for b in batches),
        chunks=_referenced_chunks(table),
    )


def encode_rows(table: pa.Table, batch_ends: Sequence[int], compression_level: int) -> bytes:
    """Encode ``table`` (a shard's columns, hidden ones included, with the shard schema)
    into record batches ending before each of ``batch_ends``, as :func:`encode_shard`
    does: equal columns, cuts and level give the bytes ``encode_shard`` gave."""
    batches, start = [], 0
    for end in batch_ends:
        columns = [_fresh(column.slice(start, end - start)) for column in table.columns]
        batches.append(pa.RecordBatch.from_arrays(columns, schema=table.schema))
        start = end
    return _write_file(table.schema, batches, compression_level)


def batch_ends(sizes: np.ndarray, options: ShardOptions) -> list[int]:
    """Where :func:`encode_shard` ends the record batches of a shard of records of ``sizes``."""
    return [end for _start, end in _batch_ranges(sizes, options.batch_bytes)]


def _write_file(schema: pa.Schema, batches: list[pa.RecordBatch], compression_level: int) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema, options=_write_options(compression_level)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@functools.lru_cache(maxsize=8)
def _write_options(level: int) -> pa.ipc.IpcWriteOptions:
    # One options object per level (they are immutable once made): building the codec for
    # every small shard cost more than a tenth of its encoding.
    return pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", level), use_threads=False)


def _is_exact(hashes: pa.Array | pa.ChunkedArray) -> bool:
    """True when the hashes need no copy: no nulls, no offset, a values buffer of exactly their bytes.

    Such a column is written (and counted in ``uncompressed_bytes``) exactly as its copy would be.
    """
    if not isinstance(hashes, pa.FixedSizeBinaryArray) or hashes.offset or hashes.null_count:
        return False
    values = hashes.buffers()[1]
    return values is not None and values.size == len(hashes) * hashes.type.byte_width


def _fresh(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A copy without slice offsets or stray bytes, so equal values give equal IPC bytes.

    Arrow writes whatever a null slot happens to hold (a reader's leftover value, the
    child values behind a null list); ``take`` writes zeros there. A column with nulls
    is taken whole, so the same records give the same bytes however they were put
    together (a delta's rebuild takes its rows from two shards: see datastore.shardpatch).
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not chunks:
        return pa.array([], column.type)
    array = pa.concat_arrays(chunks)
    if array.null_count and not (array.null_count == len(array) and _all_zero(array)):
        array = array.take(_identity(len(array)))
    return array


def _all_zero(array: pa.Array) -> bool:
    """True when every buffer of ``array`` (children included) is absent or zeros: nothing
    hides under its nulls. A files dataset's all-null ``chunks`` column is such, and
    checking is cheaper than a ``take`` per small shard."""
    return all(b is None or not b.to_pybytes().strip(b"\0") for b in array.buffers())


@functools.lru_cache(maxsize=16)
def _identity(n: int) -> pa.Array:
    # Cached: a files dataset's shards (a few records each, an all-null column) need the
    # same few lengths over and over.
    return pa.array(np.arange(n, dtype=np.int64))


def _batch_ranges(sizes: np.ndarray, batch_bytes: int) -> Iterator[tuple[int, int]]:
    """Split a shard's records into record batches of about ``batch_bytes`` each."""
    n = len(sizes)
    if n == 0:
        yield 0, 0
        return
    if int(sizes.sum()) <= batch_bytes:  # the common case for small shards: one batch
        yield 0, n
        return
    cum = np.cumsum(sizes)
    start, base = 0, 0
    while start < n:
        end = int(np.searchsorted(cum, base + batch_bytes, "left")) + 1
        end = min(max(end, start + 1), n)
        yield start, end
        base, start = int(cum[end - 1]), end


def _referenced_chunks(table: pa.Table) -> tuple[str, ...]:
    """Object ids listed in a ``chunks`` column of strings (big-file chunks), in first-use order."""
    where = table.schema.get_field_index("chunks")
    if where < 0:
        return ()
    column = table.column(where)
    if column.null_count == len(column):
        return ()
    t = column.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not (
        pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)
    ):
        return ()
    ids = column.combine_chunks().flatten().to_pylist() if column.num_chunks else []
    return tuple(dict.fromkeys(i for i in ids if i))


def write_shards(
    batches: Iterable[pa.RecordBatch], options: ShardOptions | None = None
) -> Iterator[EncodedShard]:
    """Cut and encode a stream of record batches into shards, in order (one thread)."""
    writer = ShardWriter(options)
    for batch in batches:
        for pending in writer.add(batch):
            yield encode_shard(pending, writer.options)
    for pending in writer.finish():
        yield encode_shard(pending, writer.options)


#: What Arrow raises on bytes that are not a shard it can read.
_UNREADABLE = (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError)


def _unreadable(e: BaseException) -> IntegrityError:
    return IntegrityError(f"not a readable shard: {e}", subject="shard")


def read_shard(
    data: BytesLike | pa.Buffer | pa.NativeFile,
    columns: Sequence[str] | None = None,
    *,
    with_hidden: bool = False,
    plain: bool = False,
) -> pa.Table:
    """Decode a shard into a table (the one shard reader; buffers that were stored
    uncompressed are used in place). ``columns`` selects and orders columns; hidden
    columns (``__*``) are dropped unless ``with_hidden`` or named in ``columns``.
    ``plain``: no buffer is compressed (a decoded copy), so every column is mapped in
    place and the wanted ones selected; Arrow's column filter would copy them all.
    ``data`` may be a random-access file (:meth:`~cachetier.objects.ObjectStore.open_ranged`
    wrapped in ``pa.PythonFile``): only the footer and the wanted columns are read.
    """
    buf = data if isinstance(data, (pa.Buffer, pa.NativeFile)) else pa.py_buffer(data)
    try:
        reader = pa.ipc.open_file(buf)
        names = reader.schema.names
        if columns is None:
            wanted = [n for n in names if with_hidden or not n.startswith("__")]
        else:
            missing = [c for c in columns if c not in names]
            if missing:
                visible = ", ".join(n for n in names if not n.startswith("__"))
                raise BadInputError(
                    f"no column {missing[0]!r} in the shard", subject=missing[0], hint=f"columns: {visible}"
                )
            wanted = list(columns)
        indices = sorted(names.index(c) for c in wanted)
        size = buf.size() if isinstance(buf, pa.NativeFile) else buf.size
        if plain or (size <= _READ_ALL_BELOW and all(n.startswith("__") or n in wanted for n in names)):
            table = reader.read_all()  # in place, or cheaper than reopening to skip hidden columns
        else:
            reader = pa.ipc.open_file(buf, options=pa.ipc.IpcReadOptions(included_fields=indices))
            table = reader.read_all()
    except _UNREADABLE as e:
        raise _unreadable(e) from e
    if list(table.column_names) != wanted:
        table = table.select(wanted)
    return table


def shard_batches(data: BytesLike | pa.Buffer) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A shard's schema and its record batches, hidden columns included, decoded one at a
    time as the iterator is advanced (so a consumer holds one batch, not the table)."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    try:
        reader = pa.ipc.open_file(buf)
    except _UNREADABLE as e:
        raise _unreadable(e) from e

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(reader.num_record_batches):
            try:
                batch = reader.get_batch(i)
            except _UNREADABLE as e:
                raise _unreadable(e) from e
            yield batch
            del batch  # before decoding the next one: one batch held at a time

    return reader.schema, batches()


def read_record_hashes(data: BytesLike | pa.Buffer) -> list[bytes]:
    """The 16-byte record hashes of a shard's records, in order (reads one column)."""
    column = read_shard(data, [HASH_COLUMN]).column(0)
    return [] if len(column) == 0 else column.to_pylist()


def read_shard_schema(data: BytesLike | pa.Buffer, *, with_hidden: bool = False) -> pa.Schema:
    """Return a shard's schema without decoding any record."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    try:
        schema = pa.ipc.open_file(buf).schema
    except _UNREADABLE as e:
        raise _unreadable(e) from e
    if with_hidden:
        return schema
    return pa.schema([f for f in schema if not f.name.startswith("__")], metadata=schema.metadata)
