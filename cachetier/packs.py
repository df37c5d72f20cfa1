"""Pack objects: many small content-addressed objects stored in one store key.

Small shards make scattered edits cheap (an edit rewrites only the small shard holding
it) but one store key per shard makes S3 slow (one request per object). Packs decouple
the unit of dedup from the unit of storage, like git packfiles or restic packs: small
objects are appended to an open pack that is written as one key once it holds about
:data:`PACK_TARGET_BYTES`.

Layout (next to ``objects/``)::

    packs/<packid>.pack   the member objects' stored bytes, concatenated
    packs/<packid>.idx    the members: header + one fixed-width entry per member

``packid`` is the content hash of the ``.pack`` bytes, so packs are content-addressed
too. The pack is written first and its index second: an index present means a complete
pack; a pack without an index (a crash between the two writes) is garbage for gc.

Index format (little-endian): a 56-byte header ``b"TDPACKI1"``, member count (u64),
pack size (u64), BLAKE3 of the entry bytes (32 bytes); then ``count`` entries of 48
bytes: the member's object id as 32 raw bytes, its offset (u64) and length (u64) in
the pack. Read with numpy, an index of 10,000s of members loads in milliseconds.

A member keeps its own id (the hash of its bytes), and every read of it is verified
against that id exactly as a standalone object is. :class:`~cachetier.objects.ObjectStore`
makes packing transparent: readers ask for an object id and never see packs. The pack
id depends on which objects happened to share a pack (thread timing), so it never
enters a data hash. gc keeps a pack whole while any member is reachable (no repacking).
"""

from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import blake3
import numpy as np

from cachetier.errors import IntegrityError, NotFoundError, UsageError
from cachetier.hashing import content_hash, is_object_id
from cachetier.store import ObjectInfo, Store

__all__ = [
    "PACKS_PREFIX",
    "PACK_MEMBER_LIMIT",
    "PACK_TARGET_BYTES",
    "PackEntry",
    "PackMap",
    "PackMember",
    "PackWriter",
    "StoredPack",
    "decode_index",
    "encode_index",
    "index_key",
    "index_oids",
    "list_packs",
    "pack_key",
    "read_index",
]

PACKS_PREFIX = "packs/"
PACK_SUFFIX = ".pack"
INDEX_SUFFIX = ".idx"
#: A pack is written once it holds at least this many bytes.
PACK_TARGET_BYTES = 16 << 20
#: Objects smaller than this go into packs; larger ones stay standalone.
PACK_MEMBER_LIMIT = 256 << 10

_MAGIC = b"TDPACKI1"
_HEADER = struct.Struct("<8sQQ32s")
_ENTRY = np.dtype([("oid", "V32"), ("offset", "<u8"), ("length", "<u8")])


def pack_key(packid: str) -> str:
    """Return the store key of pack ``packid``'s bytes."""
    return f"{PACKS_PREFIX}{packid}{PACK_SUFFIX}"


def index_key(packid: str) -> str:
    """Return the store key of pack ``packid``'s index."""
    return f"{PACKS_PREFIX}{packid}{INDEX_SUFFIX}"


class PackMember(NamedTuple):
    """Where a packed object lives: its pack and its ``[offset, offset + length)`` there."""

    packid: str
    offset: int
    length: int


class PackEntry(NamedTuple):
    """One member as a pack writer records it: raw 32-byte id, offset, length."""

    raw: bytes
    offset: int
    length: int


def encode_index(entries: Iterable[PackEntry], pack_size: int) -> bytes:
    """Return the index bytes for ``entries`` of a pack of ``pack_size`` bytes."""
    rows = list(entries)
    table = np.zeros(len(rows), _ENTRY)
    if rows:
        table["oid"] = np.frombuffer(b"".join(r.raw for r in rows), "V32")
        table["offset"] = [r.offset for r in rows]
        table["length"] = [r.length for r in rows]
    body = table.tobytes()
    return _HEADER.pack(_MAGIC, len(rows), pack_size, blake3.blake3(body).digest()) + body


def decode_index(data: bytes, subject: str = "pack index") -> np.ndarray:
    """Parse index bytes into a structured array (``oid``, ``offset``, ``length``).

    Raises IntegrityError when the header, the size or the checksum is wrong.
    """
    if len(data) < _HEADER.size:
        raise IntegrityError("pack index is truncated", subject=subject)
    magic, count, pack_size, digest = _HEADER.unpack_from(data)
    body = memoryview(data)[_HEADER.size :]
    if magic != _MAGIC or len(body) != count * _ENTRY.itemsize:
        raise IntegrityError("not a pack index, or truncated", subject=subject)
    if blake3.blake3(body).digest() != digest:
        raise IntegrityError("pack index is corrupt (checksum mismatch)", subject=subject)
    table = np.frombuffer(body, _ENTRY, count)
    if count and int((table["offset"] + table["length"]).max()) > pack_size:
        raise IntegrityError("pack index points past the end of its pack", subject=subject)
    return table


def index_oids(table: np.ndarray) -> list[str]:
    """The hex object ids of a decoded index, in index order."""
    raw = table["oid"].tobytes()
    return [raw[i : i + 32].hex() for i in range(0, len(raw), 32)]


def read_index(store: Store, packid: str) -> np.ndarray:
    """Read and decode the index of ``packid``; NotFoundError or IntegrityError."""
    return decode_index(store.get(index_key(packid)), subject=f"pack {packid}")


def _packid_of(key: str, suffix: str) -> str | None:
    name = key[len(PACKS_PREFIX) :]
    if not name.endswith(suffix):
        return None
    packid = name[: -len(suffix)]
    return packid if is_object_id(packid) else None


@dataclass(slots=True)
class StoredPack:
    """What a listing of ``packs/`` shows of one pack: its data key and its index key."""

    packid: str
    pack: ObjectInfo | None = None
    index: ObjectInfo | None = None

    @property
    def mtime(self) -> float:
        """The pack's age for gc: the later of its two keys (touching refreshes the index)."""
        return max(i.mtime for i in (self.pack, self.index) if i is not None)

    @property
    def size(self) -> int:
        """Bytes stored for the pack: data plus index."""
        return sum(i.size for i in (self.pack, self.index) if i is not None)


def list_packs(store: Store) -> list[StoredPack]:
    """List every pack under ``packs/`` (a pack without index or index without pack too)."""
    packs: dict[str, StoredPack] = {}
    for info in store.list(PACKS_PREFIX):
        for suffix, field in ((PACK_SUFFIX, "pack"), (INDEX_SUFFIX, "index")):
            packid = _packid_of(info.key, suffix)
            if packid is not None:
                setattr(packs.setdefault(packid, StoredPack(packid)), field, info)
    return sorted(packs.values(), key=lambda p: p.packid)


class PackMap:
    """Which pack holds which object: loaded lazily, refreshed on demand, thread-safe.

    The first lookup lists ``packs/`` and reads every index (in parallel). :meth:`refresh`
    reads the indexes of packs written since (by other processes) and forgets packs whose
    index is gone. A refresh is skipped when another one completed after the caller read
    :attr:`generation`, so a burst of misses costs one listing.
    """

    def __init__(self, store: Store, *, max_workers: int = 8):
        self._store = store
        self._max_workers = max_workers
        self._clear()
        _LIVE_MAPS.add(self)

    def _clear(self) -> None:
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._where: dict[bytes, PackMember] = {}
        self._members: dict[str, list[bytes]] = {}
        self._seen: dict[str, float] = {}
        self._loaded = False
        #: Incremented by every completed refresh.
        self.generation = 0
        #: Packs whose index could not be read at the last refresh: packid -> error.
        self.unreadable: dict[str, Exception] = {}

    def __getstate__(self) -> dict[str, object]:
        # A pickle carries the store, never locks or a possibly stale map.
        return {"store": self._store, "max_workers": self._max_workers}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["store"], max_workers=state["max_workers"])  # type: ignore[misc, arg-type]

    def seen_within(self, packid: str, seconds: float) -> bool:
        """True when :meth:`mark_seen` recorded ``packid`` less than ``seconds`` ago."""
        last = self._seen.get(packid)
        return last is not None and time.monotonic() - last < seconds

    def mark_seen(self, packid: str, when: float) -> None:
        """Record that ``packid`` was found stored (or touched) at ``when`` (monotonic)."""
        with self._lock:
            self._seen[packid] = when

    def locate(self, oid: str) -> PackMember | None:
        """Return where ``oid`` is packed, or None (loading the map on first use)."""
        if not self._loaded:
            self.refresh(0)
        raw = _raw(oid)
        return None if raw is None else self._where.get(raw)

    def contains(self, raw: bytes) -> bool:
        """True when the raw 32-byte id is a known member (no loading)."""
        return raw in self._where

    def refresh(self, seen_generation: int) -> bool:
        """Re-read ``packs/`` unless a refresh completed after ``seen_generation``.

        Returns True when the map is newer than ``seen_generation`` afterwards.
        """
        with self._refresh_lock:
            if self.generation != seen_generation:
                return True
            with self._lock:
                known = set(self._members)
            listed = {p.packid for p in list_packs(self._store) if p.index is not None}
            new = sorted(listed - known)
            tables = self._read_indexes(new)
            with self._lock:
                for packid in known - listed:
                    self._forget(packid)
                for packid, table in tables.items():
                    self._remember(packid, table["oid"].tobytes(), table["offset"], table["length"])
            self._loaded = True
            self.generation += 1
            return True

    def _read_indexes(self, packids: list[str]) -> dict[str, np.ndarray]:
        def read(packid: str) -> tuple[str, np.ndarray | Exception]:
            try:
                return packid, read_index(self._store, packid)
            except (NotFoundError, IntegrityError) as e:
                return packid, e

        if len(packids) > 1:
            with ThreadPoolExecutor(min(self._max_workers, len(packids))) as pool:
                results = list(pool.map(read, packids))
        else:
            results = [read(p) for p in packids]
        tables = {}
        for packid, result in results:
            if isinstance(result, Exception):
                if not isinstance(result, NotFoundError):  # removed since the listing: not an error
                    self.unreadable[packid] = result
            else:
                self.unreadable.pop(packid, None)
                tables[packid] = result
        return tables

    def add(self, packid: str, entries: list[PackEntry]) -> None:
        """Record a pack this process has just written (its index is stored)."""
        raws = b"".join(e.raw for e in entries)
        with self._lock:
            self._remember(packid, raws, [e.offset for e in entries], [e.length for e in entries])

    def drop(self, packid: str) -> None:
        """Forget a pack (found missing)."""
        with self._lock:
            self._forget(packid)

    def _remember(self, packid: str, raws: bytes, offsets, lengths) -> None:
        if packid in self._members:
            return
        offs = offsets.tolist() if isinstance(offsets, np.ndarray) else list(offsets)
        lens = lengths.tolist() if isinstance(lengths, np.ndarray) else list(lengths)
        keys = [raws[i : i + 32] for i in range(0, len(raws), 32)]
        self._members[packid] = keys
        self._where.update(zip(keys, map(PackMember._make, zip(repeat(packid), offs, lens))))

    def _forget(self, packid: str) -> None:
        self._seen.pop(packid, None)
        for key in self._members.pop(packid, ()):
            member = self._where.get(key)
            if member is not None and member.packid == packid:
                del self._where[key]

    def __len__(self) -> int:
        return len(self._where)


# A forked child starts with fresh maps: a lock held by a parent thread at fork time
# would otherwise stay locked in the child forever.
_LIVE_MAPS: weakref.WeakSet[PackMap] = weakref.WeakSet()


def _reset_maps_in_child() -> None:
    for packs in list(_LIVE_MAPS):
        packs._clear()


os.register_at_fork(after_in_child=_reset_maps_in_child)


def _raw(oid: str) -> bytes | None:
    if len(oid) != 64:
        return None
    try:
        return bytes.fromhex(oid)
    except ValueError:
        return None


class PackWriter:
    """Collects small objects into packs; thread-safe.

    :meth:`add` appends an object to the open pack; once it holds ``target_bytes`` the
    pack is written (data, then index) by a background thread, so the caller goes on
    encoding while the upload runs. At most ``max_writes`` packs are being written at
    once (:meth:`add` waits for a slot), so memory stays bounded. :meth:`flush` writes
    what is open and waits for every write, raising the first error; :meth:`abort`
    drops the open pack unwritten. Objects in the open pack or in a pack being written
    count as present for :meth:`add`, so the same object added twice is stored once.
    """

    def __init__(
        self,
        store: Store,
        packs: PackMap,
        *,
        algorithm: str,
        target_bytes: int = PACK_TARGET_BYTES,
        max_writes: int = 2,
    ):
        self._store = store
        self._packs = packs
        self._algorithm = algorithm
        self._target = target_bytes
        self._max_writes = max_writes
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(max_writes)
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[None]] = []
        self._error: BaseException | None = None
        self._buf = bytearray()
        self._entries: list[PackEntry] = []
        self._pending: set[bytes] = set()
        self._aborted = False
        self.packs_written = 0

    def add(self, oid: str, data: bytes | bytearray | memoryview) -> bool:
        """Queue ``data`` as object ``oid``; False when it is queued or packed already."""
        raw = _raw(oid)
        if raw is None:
            raise UsageError(f"not an object id: {oid!r}", subject=oid)
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._aborted:
                raise UsageError("this pack writer was aborted", subject=f"object {oid}")
            if raw in self._pending or self._packs.contains(raw):
                return False
            self._pending.add(raw)
            self._entries.append(PackEntry(raw, len(self._buf), len(data)))
            self._buf += data
            batch = self._take() if len(self._buf) >= self._target else None
        if batch is not None:
            self._submit(*batch)
        return True

    def flush(self) -> None:
        """Write the open pack, if it holds anything, and wait for every write."""
        with self._lock:
            batch = self._take() if self._entries and not self._aborted else None
        if batch is not None:
            self._submit(*batch)
        self._wait()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Drop the open pack without writing it; further adds are refused.

        Packs already handed to a writer thread are complete when they land (index
        last); unreferenced, gc removes them after the grace period.
        """
        with self._lock:
            self._aborted = True
            self._pending.difference_update(e.raw for e in self._entries)
            self._buf, self._entries = bytearray(), []
        self._wait()

    def _take(self) -> tuple[bytearray, list[PackEntry]]:
        batch = self._buf, self._entries
        self._buf, self._entries = bytearray(), []
        return batch

    def _submit(self, buf: bytearray, entries: list[PackEntry]) -> None:
        self._slots.acquire()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_writes, thread_name_prefix="tierdata-pack")
            self._futures.append(self._pool.submit(self._write, buf, entries))

    def _wait(self) -> None:
        with self._lock:
            pool, self._pool, futures, self._futures = self._pool, None, self._futures, []
        for future in futures:
            future.exception()  # an error is kept in self._error
        if pool is not None:
            pool.shutdown(wait=True)

    def _write(self, buf: bytearray, entries: list[PackEntry]) -> None:
        try:
            packid = content_hash(buf, self._algorithm)
            self._store.put(pack_key(packid), buf)
            # The index last: once it exists, the pack is complete.
            self._store.put(index_key(packid), encode_index(entries, len(buf)))
            self._packs.add(packid, entries)
            with self._lock:
                self.packs_written += 1
        except BaseException as e:
            with self._lock:
                if self._error is None:
                    self._error = e
            raise
        finally:
            with self._lock:
                self._pending.difference_update(e.raw for e in entries)
            self._slots.release()
