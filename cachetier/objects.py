"""Content-addressed objects on top of a :class:`~cachetier.store.Store`.

An object's id is the hash of its stored bytes. It lives either standalone at
``objects/<id[:2]>/<id>`` or as a member of a pack (``packs/<packid>.pack`` with its
``.idx``; see :mod:`cachetier.packs`), which readers never need to know: every method
here takes an object id. Every read is verified against the id (a mismatch raises
IntegrityError naming the object), so no tier can hand back wrong bytes unnoticed.
Writes skip objects that already exist, standalone or packed, which is what makes
re-ingesting unchanged data store nothing.

An object may also be stored as a delta against another object (``deltas/``, see
:mod:`cachetier.deltas`): :meth:`ObjectStore.get` rebuilds it with the store's
:class:`~cachetier.deltas.Rebuilder` and checks the result against the id like any read.

Which pack holds which object is loaded lazily (one listing of ``packs/`` plus the
indexes, in parallel) and re-read once when an object is found neither standalone nor
in a known pack, since another process may have written new packs. A packed object is
read with a range read of its pack; :meth:`ObjectStore.get_many` fetches the covering
range of neighbouring members once instead of one request per member.
"""

from __future__ import annotations

import io
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from cachetier.deltas import (
    DELTAS_PREFIX,
    HEADER_SIZE,
    MAX_DEPTH,
    Delta,
    Rebuilder,
    decode_delta,
    decode_delta_header,
    delta_key,
    oid_of_delta_key,
)
from cachetier.errors import IntegrityError, NotFoundError
from cachetier.hashing import DEFAULT_HASH, BytesLike, content_hash, is_object_id
from cachetier.packs import PackMap, PackMember, PackWriter, index_key, pack_key
from cachetier.store import ObjectInfo, Store

__all__ = ["ObjectStore", "object_key"]

OBJECTS_PREFIX = "objects/"
# A pack touched (or found stored) this recently is not touched (or asked) again: a burst
# of reused members of one pack costs one request. Safe for gc grace periods longer than this.
_TOUCH_INTERVAL = 2.0
# get_many: members of one pack closer than this are fetched in one range read ...
_MAX_GAP = 1 << 20
# ... of at most this many bytes (several ranges of one pack are fetched in parallel) ...
_MAX_SEGMENT = 4 << 20
# ... and requests are planned in windows of about this many bytes, two windows in memory;
# the first window is smaller and the next ones double, so the first objects come early.
_WINDOW_BYTES = 32 << 20
_FIRST_WINDOW_BYTES = 4 << 20


class RangedObject(io.RawIOBase):
    """A read-only, seekable file over one key of a store, read by byte ranges (see
    :meth:`ObjectStore.open_ranged`)."""

    def __init__(self, store: Store, key: str, size: int) -> None:
        super().__init__()
        self._store, self._key, self._size, self._pos = store, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        end = min(self._size, self._pos + len(buffer))
        if end <= self._pos:
            return 0
        data = self._store.get(self._key, (self._pos, end))
        memoryview(buffer)[: len(data)] = data
        self._pos += len(data)
        return len(data)


def object_key(oid: str) -> str:
    """Return the store key of standalone object ``oid``."""
    return f"{OBJECTS_PREFIX}{oid[:2]}/{oid}"


class ObjectStore:
    """Put bytes, get them back by hash, verified; parallel variants for many objects."""

    def __init__(
        self,
        store: Store,
        *,
        algorithm: str = DEFAULT_HASH,
        max_workers: int = 8,
        rebuilder: Rebuilder | None = None,
    ):
        self.store = store
        self.algorithm = algorithm
        self.max_workers = max_workers
        self.rebuilder = rebuilder
        self.packs = PackMap(store, max_workers=max_workers)

    def sibling(self, store: Store | None = None) -> ObjectStore:
        """A new object store over ``store`` (default: the same one) with these settings."""
        return ObjectStore(
            store or self.store,
            algorithm=self.algorithm,
            max_workers=self.max_workers,
            rebuilder=self.rebuilder,
        )

    def hash(self, data: BytesLike) -> str:
        """Return the id ``data`` would be stored under."""
        return content_hash(data, self.algorithm)

    def put(self, data: BytesLike, oid: str | None = None) -> str:
        """Store ``data`` standalone (unless an object with its id exists) and return the id.

        An object that exists already is touched instead, so a gc running now counts
        its grace period from this reuse and cannot delete it under a pending commit.
        """
        oid = oid or self.hash(data)
        if not self.touch_if_exists(oid):
            self.store.put(object_key(oid), data)
        return oid

    def pack_writer(self) -> PackWriter:
        """Return a writer that stores small objects in packs this store then reads."""
        return PackWriter(self.store, self.packs, algorithm=self.algorithm)

    def touch_if_exists(self, oid: str, *, deltas: bool = True) -> bool:
        """Refresh the mtime of ``oid`` (of its pack, if packed) if stored; False when it is not.

        Reusing an object must go through here (not :meth:`exists`), so that gc's grace
        period protects it until the commit that references it lands. A miss does not
        re-read the pack listing (misses are the common case while ingesting new data):
        a pack written by another process meanwhile costs at most a duplicate.
        """
        if self.touch_if_packed(oid):
            return True
        if self._touch_stored(object_key(oid)):
            return True
        if not deltas:
            return False
        # A delta is stored only as much as its chain of bases is: one whose base gc
        # removed (a crash mid-gc) counts as not stored, so the object is stored whole.
        chain = self._readable_delta_of(oid)
        if chain is None or not self._exists(chain[0], chain[1] - 1):
            return False
        try:
            self.store.touch(delta_key(oid))
        except NotFoundError:
            return False  # removed since its header was read
        return True

    def _touch_stored(self, key: str) -> bool:
        if not self.store.exists(key):
            return False
        try:
            self.store.touch(key)
        except NotFoundError:
            return False  # removed between the two calls
        return True

    def touch_if_packed(self, oid: str) -> bool:
        """Like :meth:`touch_if_exists` for packed objects only: no request for a standalone one.

        Ingest checks its small objects this way: on S3 a HEAD per new shard would cost
        more than the shard's share of a pack PUT. A small object stored standalone (by a
        version of tierdata before packs) is then stored again, in a pack.
        """
        member = self.packs.locate(oid)
        return member is not None and self._touch_pack(member.packid)

    def _touch_pack(self, packid: str) -> bool:
        if self.packs.seen_within(packid, _TOUCH_INTERVAL):
            return True
        now = time.monotonic()
        try:
            self.store.touch(index_key(packid))  # gc ages a pack by its index (see packs.StoredPack)
        except NotFoundError:
            self.packs.drop(packid)
            return False
        self.packs.mark_seen(packid, now)
        return True

    def get(self, oid: str, *, verify: bool = True) -> bytes:
        """Return the bytes of ``oid``; raise NotFoundError or IntegrityError."""
        return self._get(oid, verify, MAX_DEPTH)

    def _get(self, oid: str, verify: bool, max_depth: int) -> bytes:
        """:meth:`get`, where a delta may be at most ``max_depth`` deep (0: stored whole)."""
        seen = self.packs.generation
        member = self.packs.locate(oid)
        if member is not None:
            data = self._read_member(oid, member)
        else:
            try:
                data = self.store.get(object_key(oid))
            except NotFoundError:
                try:
                    stored = self.store.get(delta_key(oid))
                except NotFoundError:
                    stored = None
                if stored is not None:
                    return self._rebuild(oid, decode_delta(stored, oid), verify, max_depth)
                # Maybe packed by another process since the pack map was read.
                if not self.packs.refresh(seen):
                    raise
                member = self.packs.locate(oid)
                if member is None:
                    raise
                data = self._read_member(oid, member)
        if verify:
            self.check(oid, data)
        return data

    def _rebuild(self, oid: str, delta: Delta, verify: bool, max_depth: int) -> bytes:
        subject = f"object {oid}"
        if delta.depth > max_depth:
            # A chain deeper than the delta that named this base says: damage, or a cycle.
            raise IntegrityError("delta chain is deeper than its header says", subject=subject)
        if self.rebuilder is None or self.rebuilder.codec != delta.codec:
            raise IntegrityError(
                f"object is stored as a {delta.codec!r} delta, which this reader cannot rebuild",
                subject=subject,
                hint="read it through a repository (datastore.Repo), whose object store knows shard deltas",
            )
        try:
            base = self._get(delta.base, True, delta.depth - 1)
        except NotFoundError as e:
            raise NotFoundError(
                f"object is stored as a delta of {delta.base}, which cannot be read: {e}",
                subject=subject,
                hint="run `dataset verify` to list every missing object",
            ) from e
        data = self.rebuilder(base, delta.payload, subject)
        if verify:
            actual = self.hash(data)
            if actual != oid:
                raise IntegrityError(
                    f"rebuilt from its delta, the object hashes to {actual[:16]}… "
                    f"({self.rebuilder.describe(delta.payload)})",
                    subject=subject,
                    hint=f"read it with the pyarrow that wrote it, or delete {delta_key(oid)} and ingest "
                    "its source again (it is then stored whole); `dataset verify` lists every such object",
                )
        return data

    def open_ranged(self, oid: str) -> RangedObject:
        """A read-only, seekable file over the standalone object ``oid`` whose reads fetch
        only the byte ranges asked for: what a reader wants of one column of a large object
        (an Arrow IPC file's footer and one column's buffers). Unverified, since the caller
        reads a part of the object; NotFoundError when it is not stored standalone (packed,
        stored as a delta, or missing)."""
        key = object_key(oid)
        return RangedObject(self.store, key, self.store.info(key).size)

    def delta_of(self, oid: str) -> tuple[str, int] | None:
        """``(base id, depth)`` when ``oid`` is stored as a delta, else None (one small read)."""
        try:
            head = self.store.get(delta_key(oid), (0, HEADER_SIZE))
        except NotFoundError:
            return None
        base, depth, _codec, _length, _digest = decode_delta_header(head, oid)
        return base, depth

    def _readable_delta_of(self, oid: str) -> tuple[str, int] | None:
        """:meth:`delta_of`, with a damaged header counted as no delta (verify names it;
        an ingest then stores the object whole)."""
        try:
            return self.delta_of(oid)
        except IntegrityError:
            return None

    def put_delta(self, oid: str, delta: bytes) -> None:
        """Store ``delta`` (see :func:`cachetier.deltas.encode_delta`) as the way ``oid`` is stored."""
        self.store.put(delta_key(oid), delta)

    def list_deltas(self) -> Iterator[tuple[str, ObjectInfo]]:
        """Yield ``(oid, info)`` for every object stored as a delta."""
        for info in self.store.list(DELTAS_PREFIX):
            oid = oid_of_delta_key(info.key)
            if oid is not None:
                yield oid, info

    def _read_member(self, oid: str, member: PackMember) -> bytes:
        try:
            data = self.store.get(pack_key(member.packid), (member.offset, member.offset + member.length))
        except NotFoundError as e:
            self.packs.drop(member.packid)
            try:
                return self.store.get(object_key(oid))
            except NotFoundError:
                raise NotFoundError(
                    f"object is in pack {member.packid}, which is missing",
                    subject=f"object {oid}",
                    hint="run `dataset verify` to list every missing object",
                ) from e
        if len(data) != member.length:
            raise IntegrityError(
                f"object is cut short in pack {member.packid} ({len(data)} of {member.length} bytes)",
                subject=f"object {oid}",
                hint="run `dataset verify` to list every damaged object",
            )
        return data

    def check(self, oid: str, data: BytesLike) -> None:
        """Raise IntegrityError unless ``data`` hashes to ``oid``."""
        actual = self.hash(data)
        if actual != oid:
            raise IntegrityError(
                f"object is corrupt: content hashes to {actual[:16]}…",
                subject=f"object {oid}",
                hint="run `dataset verify` to list every damaged object",
            )

    def exists(self, oid: str) -> bool:
        """True when the object is stored (standalone, in a pack whose index is stored, or
        as a delta whose chain of bases is stored).

        A pack found stored (or touched) in the last 2 s is not asked again, so checking
        the thousands of members of a few packs costs a few requests.
        """
        return self._exists(oid, MAX_DEPTH)

    def _exists(self, oid: str, max_depth: int) -> bool:
        seen = self.packs.generation
        member = self.packs.locate(oid)
        if member is not None and self._pack_stored(member.packid):
            return True
        if self.store.exists(object_key(oid)):
            return True
        chain = self._readable_delta_of(oid)
        if chain is not None:  # a delta is there only as much as its base is
            return chain[1] <= max_depth and self._exists(chain[0], chain[1] - 1)
        if self.packs.refresh(seen):
            member = self.packs.locate(oid)
            return member is not None and self._pack_stored(member.packid)
        return False

    def _pack_stored(self, packid: str) -> bool:
        if self.packs.seen_within(packid, _TOUCH_INTERVAL):
            return True
        now = time.monotonic()
        if self.store.exists(index_key(packid)):
            self.packs.mark_seen(packid, now)
            return True
        self.packs.drop(packid)
        return False

    def delete(self, oid: str) -> None:
        """Remove a standalone object (used by gc only; packs are removed whole by gc,
        deltas by their key)."""
        self.store.delete(object_key(oid))

    def list(self) -> Iterator[tuple[str, ObjectInfo]]:
        """Yield ``(oid, info)`` for every standalone object (packs: :func:`cachetier.packs.list_packs`)."""
        for info in self.store.list(OBJECTS_PREFIX):
            oid = info.key.rpartition("/")[2]
            if is_object_id(oid):
                yield oid, info

    def get_many(self, oids: Iterable[str], *, verify: bool = True) -> Iterator[tuple[str, bytes]]:
        """Yield ``(oid, bytes)`` in the given order, fetching up to ``max_workers`` at once.

        Requests are planned in windows of about 32 MiB of packed members or
        ``max_workers`` standalone objects: within a window, members of one pack that
        lie close together are fetched with one range read and sliced. At most two
        windows are held in memory (the one being yielded, the next being fetched). An
        object that cannot be read raises when its turn comes.
        """
        windows = _plan(list(oids), self.packs, max(1, self.max_workers))
        with ThreadPoolExecutor(self.max_workers) as pool:
            ahead: deque[tuple[_Window, list[Future]]] = deque()

            def submit_next() -> None:
                window = next(windows, None)
                if window is not None:
                    ahead.append((window, [pool.submit(self._fetch, u, verify) for u in window.units]))

            submit_next()
            try:
                while ahead:
                    window, futures = ahead.popleft()
                    submit_next()
                    got: dict[str, bytes | BaseException] = {}
                    for future in futures:
                        got.update(future.result())
                    for oid in window.oids:
                        value = got[oid]
                        if isinstance(value, BaseException):
                            raise value
                        yield oid, value
            finally:
                for _, futures in ahead:
                    for future in futures:
                        future.cancel()

    def _fetch(self, unit: _Unit, verify: bool) -> dict[str, bytes | BaseException]:
        """Fetch one planned unit; map each of its ids to bytes or to the error it met."""
        out: dict[str, bytes | BaseException] = {}
        if unit.packid is None:
            for oid in unit.oids:
                out[oid] = _attempt(lambda oid=oid: self.get(oid, verify=verify))
            return out
        try:
            blob = self.store.get(pack_key(unit.packid), (unit.start, unit.end))
        except NotFoundError:
            blob = None  # each member below then gets its own NotFoundError (or is found elsewhere)
        for oid, member in zip(unit.oids, unit.members):
            lo = member.offset - unit.start
            if blob is None or len(blob) < lo + member.length:
                out[oid] = _attempt(lambda oid=oid: self.get(oid, verify=verify))
                continue
            data = blob[lo : lo + member.length]
            out[oid] = _attempt(lambda oid=oid, data=data: self._checked(oid, data, verify))
        return out

    def _checked(self, oid: str, data: bytes, verify: bool) -> bytes:
        if verify:
            self.check(oid, data)
        return data

    def put_many(self, blobs: Iterable[BytesLike]) -> list[str]:
        """Store many blobs concurrently; return their ids in order."""
        with ThreadPoolExecutor(self.max_workers) as pool:
            return list(pool.map(self.put, blobs))


def _attempt(fn) -> bytes | BaseException:
    try:
        return fn()
    except (NotFoundError, IntegrityError) as e:
        return e


@dataclass(slots=True)
class _Unit:
    """One fetch: standalone ids (``packid`` None), or one range ``[start, end)`` of a pack."""

    packid: str | None
    oids: list[str] = field(default_factory=list)
    members: list[PackMember] = field(default_factory=list)
    start: int = 0
    end: int = 0


@dataclass(slots=True)
class _Window:
    oids: list[str]
    units: list[_Unit]


def _plan(oids: list[str], packs: PackMap, max_standalone: int) -> Iterator[_Window]:
    """Cut the requests into windows; group each window's packed members into range reads."""
    start, budget, standalone = 0, 0, 0
    window_bytes = _FIRST_WINDOW_BYTES
    located = [(oid, packs.locate(oid)) for oid in oids]
    for i, (_oid, member) in enumerate(located):
        if member is None:
            standalone += 1
        else:
            budget += member.length
        if budget >= window_bytes or standalone >= max_standalone:
            yield _window(located[start : i + 1])
            start, budget, standalone = i + 1, 0, 0
            window_bytes = min(2 * window_bytes, _WINDOW_BYTES)
    if start < len(located):
        yield _window(located[start:])


def _window(located: list[tuple[str, PackMember | None]]) -> _Window:
    units: list[_Unit] = []
    by_pack: dict[str, dict[str, PackMember]] = {}
    seen: set[str] = set()
    for oid, member in located:
        if oid in seen:
            continue
        seen.add(oid)
        if member is None:
            units.append(_Unit(None, [oid]))
        else:
            by_pack.setdefault(member.packid, {})[oid] = member
    for packid, members in by_pack.items():
        unit: _Unit | None = None
        for oid, member in sorted(members.items(), key=lambda kv: kv[1].offset):
            end = member.offset + member.length
            if unit is None or member.offset - unit.end > _MAX_GAP or end - unit.start > _MAX_SEGMENT:
                unit = _Unit(packid, start=member.offset, end=end)
                units.append(unit)
            unit.oids.append(oid)
            unit.members.append(member)
            unit.end = max(unit.end, end)
    return _Window([oid for oid, _ in located], units)
