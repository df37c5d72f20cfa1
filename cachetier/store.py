"""The byte-store interface every tier implements.

A :class:`Store` maps ``/``-separated string keys to immutable byte values. The object
store (a local folder or an S3 bucket), the LMDB tier and the RAM tier are all stores;
a cache is a store in front of a store. Capabilities are properties, so callers ask
rather than guess (``supports_cas``, ``readonly``).

Compare-and-swap is the only mutation with a precondition: :meth:`Store.read_versioned`
returns the value with an opaque *token*, and :meth:`Store.compare_and_swap` writes only
while the key still carries that token (``None``: only while the key does not exist),
raising :class:`~cachetier.errors.ConflictError` otherwise. Refs move only this way.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

from cachetier.errors import NotFoundError
from cachetier.hashing import BytesLike

__all__ = ["BytesLike", "ObjectInfo", "Store", "Versioned"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing knows of one key: its size in bytes and last-modified time (epoch s)."""

    key: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class Versioned:
    """A value read together with the token that a compare-and-swap must present."""

    data: bytes
    token: str


class Store(ABC):
    """A flat key → bytes store. Values are written whole and never partially visible."""

    #: A URL that reopens this store (``file:///...``, ``s3://bucket/prefix``, ``lmdb:///...``).
    url: str

    @property
    def readonly(self) -> bool:
        """True when :meth:`put` and :meth:`delete` are refused."""
        return False

    @property
    def supports_cas(self) -> bool:
        """True when :meth:`compare_and_swap` is atomic against other processes and hosts."""
        return False

    @abstractmethod
    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        """Return the value (or ``[start, end)`` of it); raise NotFoundError if absent."""

    @abstractmethod
    def put(self, key: str, data: BytesLike) -> None:
        """Store ``data`` under ``key`` atomically: readers see the old value or the new one."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """True when ``key`` holds a value."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; deleting a missing key is not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Yield every key that starts with ``prefix``, with its size and mtime, in no set order."""

    def info(self, key: str) -> ObjectInfo:
        """Size and last-modified time of ``key``; NotFoundError if absent.

        The default scans a listing; backends override it with one request.
        """
        for found in self.list(key):
            if found.key == key:
                return found
        raise NotFoundError("no such key", subject=f"{self.url}/{key}")

    def touch(self, key: str) -> None:
        """Refresh the last-modified time of an existing ``key`` (gc's grace period counts from it).

        The default rewrites the value; backends override it with something cheaper.
        """
        self.put(key, self.get(key))

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Store the contents of a local file under ``key``."""
        with open(path, "rb") as f:
            self.put(key, f.read())

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Write the value of ``key`` to a local file (created or replaced)."""
        data = self.get(key)
        with open(path, "wb") as f:
            f.write(data)

    def read_versioned(self, key: str) -> Versioned:
        """Return the value with its CAS token; raise NotFoundError if absent."""
        raise NotImplementedError(f"{type(self).__name__} does not support compare-and-swap")

    def compare_and_swap(self, key: str, data: BytesLike, expected: str | None) -> str:
        """Write ``data`` only if ``key`` still has token ``expected`` (None: is absent).

        Returns the new token; raises ConflictError when the precondition fails.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support compare-and-swap")

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections and handles; the store may not be used afterwards."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
