"""Content-addressed objects on top of a :class:`~cachetier.store.Store`.

An object's id is the hash of its stored bytes; it lives at ``objects/<id[:2]>/<id>``.
Every read is verified against the id (a mismatch raises IntegrityError naming the
object), so no tier can hand back wrong bytes unnoticed. Writes skip objects that
already exist, which is what makes re-ingesting unchanged data store nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from cachetier.errors import IntegrityError, NotFoundError
from cachetier.hashing import DEFAULT_HASH, BytesLike, content_hash, is_object_id
from cachetier.store import ObjectInfo, Store

__all__ = ["ObjectStore", "object_key"]

OBJECTS_PREFIX = "objects/"


def object_key(oid: str) -> str:
    """Return the store key of object ``oid``."""
    return f"{OBJECTS_PREFIX}{oid[:2]}/{oid}"


class ObjectStore:
    """Put bytes, get them back by hash, verified; parallel variants for many objects."""

    def __init__(self, store: Store, *, algorithm: str = DEFAULT_HASH, max_workers: int = 8):
        self.store = store
        self.algorithm = algorithm
        self.max_workers = max_workers

    def hash(self, data: BytesLike) -> str:
        """Return the id ``data`` would be stored under."""
        return content_hash(data, self.algorithm)

    def put(self, data: BytesLike, oid: str | None = None) -> str:
        """Store ``data`` (unless an object with its id exists) and return the id.

        An object that exists already is touched instead, so a gc running now counts
        its grace period from this reuse and cannot delete it under a pending commit.
        """
        oid = oid or self.hash(data)
        if not self.touch_if_exists(oid):
            self.store.put(object_key(oid), data)
        return oid

    def touch_if_exists(self, oid: str) -> bool:
        """Refresh the mtime of ``oid`` if it is stored; False when it is not.

        Reusing an object must go through here (not :meth:`exists`), so that gc's grace
        period protects it until the commit that references it lands.
        """
        key = object_key(oid)
        if not self.store.exists(key):
            return False
        try:
            self.store.touch(key)
        except NotFoundError:
            return False  # removed between the two calls
        return True

    def get(self, oid: str, *, verify: bool = True) -> bytes:
        """Return the bytes of ``oid``; raise NotFoundError or IntegrityError."""
        data = self.store.get(object_key(oid))
        if verify:
            self.check(oid, data)
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
        """True when the object is stored."""
        return self.store.exists(object_key(oid))

    def delete(self, oid: str) -> None:
        """Remove an object (used by gc only)."""
        self.store.delete(object_key(oid))

    def list(self) -> Iterator[tuple[str, ObjectInfo]]:
        """Yield ``(oid, info)`` for every stored object."""
        for info in self.store.list(OBJECTS_PREFIX):
            oid = info.key.rpartition("/")[2]
            if is_object_id(oid):
                yield oid, info

    def get_many(self, oids: Iterable[str], *, verify: bool = True) -> Iterator[tuple[str, bytes]]:
        """Yield ``(oid, bytes)`` in the given order, fetching up to ``max_workers`` at once."""
        with ThreadPoolExecutor(self.max_workers) as pool:
            yield from pool.map(lambda oid: (oid, self.get(oid, verify=verify)), oids)

    def put_many(self, blobs: Iterable[BytesLike]) -> list[str]:
        """Store many blobs concurrently; return their ids in order."""
        with ThreadPoolExecutor(self.max_workers) as pool:
            return list(pool.map(self.put, blobs))
