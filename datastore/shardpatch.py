"""Record-level deltas for shards: a rewritten shard stored as its new records plus a recipe.

Content-defined boundaries keep an edit inside the shards that hold it, but a scattered
edit (1% of the records, at random) still touches nearly every shard of default size,
and each touched shard would be stored whole again. Here such a shard is stored as a
delta (:mod:`cachetier.deltas`) over a similar shard already stored (its *base*): the
records the base does not hold, as a small Arrow IPC file with the shard schema, and
*runs* that say which rows of ``base + new records`` the shard holds, in order. A 1%
scattered edit then stores about 1% of the bytes. The shard keeps its id, so shard
tables, data hashes and every reader are unchanged.

**Rebuilding** takes the rows the runs name from the base and the new records (Arrow
``take``) and encodes them again with the shard's record-batch cuts and zstd level,
which gives the shard's bytes exactly; the writer proves that before it stores a delta,
and the object store checks the id on every read. The encoding is that of the pyarrow
(and its bundled zstd) that wrote the delta: should another one encode the same records
into other bytes, the read fails, naming both versions (the records are not served
under an id their bytes do not have).

**Finding a base** costs no read of the repository: the ingest index remembers a few
*anchors* of each stored shard (the record hashes with the smallest values, a bottom-k
sketch), and a new shard that shares at least two anchors with a remembered shard is
tried against the one it shares most with. A delta is kept only when it is at most half the shard's size.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import blake3
import numpy as np
import pyarrow as pa

from cachetier.deltas import MAX_DEPTH, decode_delta, delta_key, encode_delta
from cachetier.errors import IntegrityError
from cachetier.objects import ObjectStore
from datastore.recordhash import HASH_COLUMN, digest_prefixes
from datastore.shardobjects import CODEC, shard_objects
from datastore.shards import EncodedShard, PendingShard, ShardOptions, batch_ends, encode_rows, read_shard

__all__ = [
    "ANCHORS",
    "CODEC",
    "ShardRebuilder",
    "anchors",
    "delta_payload",
    "make_shard_delta",
    "shard_objects",
    "stored_record_hashes",
]

#: How many record hashes sketch a shard (its bottom-k anchors).
ANCHORS = 8
#: A delta is stored only when it is at most this fraction of the full shard.
_MAX_DELTA_FRACTION = 0.5
_LENGTH = struct.Struct("<I")


def anchors(hashes: pa.FixedSizeBinaryArray) -> list[str]:
    """A shard's sketch: the :data:`ANCHORS` smallest record hashes (their last 8 bytes,
    hex; the first 8 decide shard boundaries, so they are not used here)."""
    tails = _tails(hashes)
    if len(tails) > ANCHORS:
        tails = np.partition(tails, ANCHORS)[:ANCHORS]
    return [f"{int(t):016x}" for t in np.unique(tails)]


def _tails(hashes: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The last 8 bytes of each 16-byte record hash, as ``uint64``."""
    return digest_prefixes(_one_array(hashes), tail=True)


def _digest(hashes: pa.Array | pa.ChunkedArray) -> str:
    """BLAKE3 of a shard's record hashes in order: what its rows must be."""
    hashes = _one_array(hashes)
    n = len(hashes)
    raw = memoryview(hashes.buffers()[1])[16 * hashes.offset : 16 * (hashes.offset + n)] if n else b""
    return blake3.blake3(raw).hexdigest()


def _one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def make_shard_delta(
    shard: EncodedShard,
    pending: PendingShard,
    options: ShardOptions,
    base: str,
    base_data: bytes,
    base_depth: int,
) -> bytes | None:
    """The stored delta for ``shard`` over the shard ``base`` (whose bytes are ``base_data``
    and which is itself a delta ``base_depth`` deep, 0 when stored whole), or None when a
    delta would not pay: another schema, too few shared records, too deep a chain, more
    than half the size, or a rebuild that does not give the shard's very bytes (it can
    differ: a null slot's hidden value is written by Arrow but not kept by ``take``)."""
    if base_depth + 1 > MAX_DEPTH:
        return None
    base_table = read_shard(base_data, with_hidden=True)
    payload = _payload(shard, pending, options, base_table)
    if payload is None:
        return None
    delta = encode_delta(shard.hash, base, base_depth + 1, CODEC, payload)
    if len(delta) > _MAX_DELTA_FRACTION * len(shard.data):
        return None
    subject = f"shard {shard.hash}"
    header, new_data = _parse(payload)
    rebuilt = _rebuild_table(base_table, read_shard(new_data, with_hidden=True), header, subject)
    if encode_rows(rebuilt, header["batches"], header["level"]) != shard.data:
        return None
    return delta


def delta_payload(
    shard: EncodedShard, pending: PendingShard, options: ShardOptions, base_data: bytes
) -> bytes | None:
    """The :data:`CODEC` payload that rebuilds ``shard`` from the shard ``base_data``, or
    None when they differ in schema or share less than half of the shard's records."""
    return _payload(shard, pending, options, read_shard(base_data, with_hidden=True))


def _payload(
    shard: EncodedShard, pending: PendingShard, options: ShardOptions, base_table: pa.Table
) -> bytes | None:
    """:func:`delta_payload` over the base's decoded columns (hidden ones included)."""
    schema = pa.ipc.open_file(pa.py_buffer(shard.data)).schema
    if not base_table.schema.equals(schema, check_metadata=True):
        return None
    found, base_rows = _locate(_tails(base_table.column(HASH_COLUMN)), _tails(pending.hashes))
    if not found.any() or found.mean() < 1 - _MAX_DELTA_FRACTION:
        return None
    new_rows = np.flatnonzero(~found)
    rows = np.where(found, base_rows, base_table.num_rows + np.cumsum(~found) - 1)
    full = pa.Table.from_arrays([*pending.table.columns, pending.hashes], schema=schema)
    new_data = encode_rows(full.take(new_rows), [len(new_rows)], options.compression_level)
    header = {
        "records": pending.records,
        "level": options.compression_level,
        "batches": batch_ends(pending.sizes, options),
        "runs": _runs(rows),
        "digest": _digest(pending.hashes),
        "arrow": pa.__version__,
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTH.pack(len(head)) + head + new_data


def stored_record_hashes(objects: ObjectStore, shard_id: str) -> pa.Array:
    """The record hashes of a stored shard, in order, without rebuilding the shard: one
    stored as a delta takes them from its base's (down its chain) and its new records, as
    its runs say, checked against the digest the delta recorded. IntegrityError for a
    damaged delta or chain. Of the whole shard at the chain's root only the footer and the
    hash column are read (about 16 bytes a record), unverified: the hashes only guide the
    search for a delta base, and a delta made over it is checked in full."""
    subject = f"shard {shard_id}"
    chain, oid = [], shard_id
    for _ in range(MAX_DEPTH + 1):
        found = objects.delta_of(oid)
        if found is None:
            break
        chain.append(oid)
        oid = found[0]
    else:
        raise IntegrityError("delta chain is deeper than its headers say", subject=subject)
    with pa.PythonFile(objects.open_ranged(oid), mode="r") as root:  # footer + one column
        hashes = _one_array(read_shard(root, [HASH_COLUMN]).column(0))
    for delta_id in reversed(chain):
        delta = decode_delta(objects.store.get(delta_key(delta_id)), delta_id)
        header, new_data = _parse(delta.payload, f"shard {delta_id}")
        new = _one_array(read_shard(new_data, [HASH_COLUMN]).column(0))
        rows = _expand(header["runs"])
        if len(rows) and (rows.min() < 0 or rows.max() >= len(hashes) + len(new)):
            raise IntegrityError("delta names rows its base and records do not hold", subject=subject)
        hashes = pa.concat_arrays([hashes, new]).take(pa.array(rows))
        if _digest(hashes) != header["digest"]:
            raise IntegrityError("shard rebuilt from its delta holds other records", subject=subject)
    return hashes


def _locate(base: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each target hash: whether the base holds it, and at which row.

    64 bits of each hash are compared; a collision would only make a rebuild differ,
    which the writer's check catches (the delta is then not stored)."""
    if len(base) == 0:
        return np.zeros(len(target), bool), np.zeros(len(target), np.int64)
    order = np.argsort(base, kind="stable")
    ordered = base[order]
    at = np.minimum(np.searchsorted(ordered, target), len(ordered) - 1)
    return ordered[at] == target, order[at]


def _runs(rows: np.ndarray) -> list[int]:
    """``rows`` as consecutive runs, flattened: [first row, length, first row, length, ...]."""
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [len(rows)]]))
    return np.column_stack([rows[starts], lengths]).ravel().astype(int).tolist()


def _expand(runs: Sequence[int]) -> np.ndarray:
    pairs = np.asarray(runs, np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        return np.zeros(0, np.int64)
    lengths = pairs[:, 1]
    offsets = np.repeat(pairs[:, 0] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(int(lengths.sum()), dtype=np.int64)


class ShardRebuilder:
    """Rebuilds a shard from its base's bytes and a :data:`CODEC` payload (a
    :class:`cachetier.deltas.Rebuilder`); checks every row against the recorded record hashes."""

    codec = CODEC

    def __call__(self, base: bytes, payload: bytes, subject: str) -> bytes:
        header, new_data = _parse(payload, subject)
        try:
            base_table = read_shard(base, with_hidden=True)
            new_table = read_shard(new_data, with_hidden=True)
        except IntegrityError as e:
            raise IntegrityError(f"delta cannot be applied: {e.message}", subject=subject) from e
        table = _rebuild_table(base_table, new_table, header, subject)
        try:
            return encode_rows(table, header["batches"], header["level"])
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise IntegrityError(f"delta cannot be applied: {e}", subject=subject) from e

    def describe(self, payload: bytes) -> str:
        """Which pyarrow wrote the delta, and which one rebuilt it."""
        try:
            written = _parse(payload)[0].get("arrow", "an unknown version")
        except IntegrityError:
            written = "an unknown version"
        if written == pa.__version__:
            return f"written and rebuilt with pyarrow {written}: the delta itself is wrong"
        return f"written with pyarrow {written}, rebuilt with pyarrow {pa.__version__}"


def _parse(payload: bytes, subject: str = "delta") -> tuple[dict, memoryview]:
    """A payload's header and its new records' bytes."""
    try:
        (length,) = _LENGTH.unpack_from(payload)
        header = json.loads(payload[_LENGTH.size : _LENGTH.size + length])
    except (struct.error, ValueError) as e:
        raise IntegrityError(f"delta cannot be applied: {e}", subject=subject) from e
    fields = ("records", "level", "batches", "runs", "digest")
    if not isinstance(header, dict) or any(k not in header for k in fields):
        raise IntegrityError(f"delta header lacks one of {', '.join(fields)}", subject=subject)
    return header, memoryview(payload)[_LENGTH.size + length :]


def _rebuild_table(base_table: pa.Table, new_table: pa.Table, header: dict, subject: str) -> pa.Table:
    """The shard's columns: the rows the runs name of ``base + new``, checked against the
    recorded record hashes."""
    if not new_table.schema.equals(base_table.schema, check_metadata=True):
        raise IntegrityError("delta's records have another schema than its base", subject=subject)
    try:
        rows = _expand(header["runs"])
    except (ValueError, TypeError) as e:
        raise IntegrityError(f"delta cannot be applied: {e}", subject=subject) from e
    available = base_table.num_rows + new_table.num_rows
    if len(rows) != header["records"] or (len(rows) and (rows.min() < 0 or rows.max() >= available)):
        raise IntegrityError("delta names rows its base and records do not hold", subject=subject)
    try:
        table = pa.concat_tables([base_table, new_table]).take(pa.array(rows))
    except pa.ArrowException as e:
        raise IntegrityError(f"delta cannot be applied: {e}", subject=subject) from e
    if _digest(table.column(HASH_COLUMN)) != header["digest"]:
        raise IntegrityError("shard rebuilt from its delta holds other records", subject=subject)
    return table
