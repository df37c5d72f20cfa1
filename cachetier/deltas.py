"""Delta objects: an object stored as a patch against another object (its *base*).

An object keeps its id (the hash of its full bytes) however it is stored, as in git's
packfiles: a shard rewritten by a scattered edit is stored as the few records that
changed plus a recipe over the shard it replaces, not as a new full copy, and its id,
the shard table and the data hash are those a full copy would have. Readers never see
deltas: :meth:`cachetier.objects.ObjectStore.get` rebuilds the bytes and checks them
against the id.

What the patch means is up to a :class:`Rebuilder` that the object store is given (for
shards, :mod:`datastore.shardpatch`); this module only stores the container::

    deltas/<id[:2]>/<id>    b"TDDELTA1" | id | base id (both 64 ASCII hex) | depth (u32) |
                            codec (16 bytes, NUL padded) | payload length (u64) |
                            BLAKE3 of the payload (32 bytes) | payload

``depth`` is 1 for a delta over a full object and one more than its base's for a delta
over a delta; writers keep chains within :data:`MAX_DEPTH`, so a read rebuilds at most
that many times. The checksum makes a damaged delta an IntegrityError naming the object.
gc keeps a delta while its object is reachable, and its base with it (see
:mod:`versioning.reachability`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

import blake3

from cachetier.errors import IntegrityError
from cachetier.hashing import HASH_HEX_LENGTH, BytesLike, is_object_id

__all__ = [
    "DELTAS_PREFIX",
    "HEADER_SIZE",
    "MAX_DEPTH",
    "Delta",
    "Rebuilder",
    "decode_delta",
    "decode_delta_header",
    "delta_key",
    "encode_delta",
    "oid_of_delta_key",
]

DELTAS_PREFIX = "deltas/"
#: A delta over a delta over ... at most this many levels (a read rebuilds once per level).
MAX_DEPTH = 3

_MAGIC = b"TDDELTA1"
_HEADER = struct.Struct(f"<8s{HASH_HEX_LENGTH}s{HASH_HEX_LENGTH}sI16sQ32s")
HEADER_SIZE = _HEADER.size


class Rebuilder(Protocol):
    """Turns a base object's bytes and a delta's payload back into the object's bytes."""

    codec: str

    def __call__(self, base: bytes, payload: bytes, subject: str) -> bytes:
        """Return the rebuilt bytes; raise IntegrityError when the payload does not apply."""
        ...

    def describe(self, payload: bytes) -> str:
        """A few words on what wrote ``payload`` (for an error when a rebuild differs)."""
        ...


@dataclass(frozen=True, slots=True)
class Delta:
    """A decoded delta: which object it is over, how deep the chain is, and the patch."""

    base: str
    depth: int
    codec: str
    payload: bytes


def delta_key(oid: str) -> str:
    """Return the store key of the delta that stores object ``oid``."""
    return f"{DELTAS_PREFIX}{oid[:2]}/{oid}"


def oid_of_delta_key(key: str) -> str | None:
    """The object id a ``deltas/`` key stores, or None for a key that is not a delta."""
    oid = key.rpartition("/")[2]
    return oid if key.startswith(DELTAS_PREFIX) and is_object_id(oid) else None


def encode_delta(oid: str, base: str, depth: int, codec: str, payload: BytesLike) -> bytes:
    """Return the stored bytes of a delta storing ``oid`` over ``base`` (see the module docstring)."""
    ids_ok = is_object_id(oid) and is_object_id(base)
    if not ids_ok or not 1 <= depth <= MAX_DEPTH or len(codec.encode()) > 16:
        raise ValueError(f"bad delta: base {base!r}, depth {depth}, codec {codec!r}")
    body = bytes(payload)
    digest = blake3.blake3(body).digest()
    return _HEADER.pack(_MAGIC, oid.encode(), base.encode(), depth, codec.encode(), len(body), digest) + body


def decode_delta_header(data: BytesLike, oid: str) -> tuple[str, int, str, int, bytes]:
    """Parse the header of the delta stored for ``oid``: (base, depth, codec, payload
    length, payload checksum); IntegrityError when it is damaged or stores another object."""
    subject = f"object {oid} (delta)"
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise IntegrityError("delta is truncated", subject=subject)
    magic, oid_raw, base_raw, depth, codec_raw, length, digest = _HEADER.unpack_from(view)
    base = base_raw.decode("ascii", "replace")
    if magic != _MAGIC or not is_object_id(base) or not 1 <= depth <= MAX_DEPTH:
        raise IntegrityError("not a delta (bad header)", subject=subject)
    if oid_raw != oid.encode():
        raise IntegrityError("the delta stored under this id is another object's", subject=subject)
    return base, depth, codec_raw.rstrip(b"\0").decode("ascii", "replace"), length, digest


def decode_delta(data: BytesLike, oid: str) -> Delta:
    """Parse and check the delta stored for ``oid``; IntegrityError when it is damaged."""
    subject = f"object {oid} (delta)"
    base, depth, codec, length, digest = decode_delta_header(data, oid)
    payload = bytes(memoryview(data)[HEADER_SIZE:])
    if len(payload) != length:
        raise IntegrityError(f"delta is cut short ({len(payload)} of {length} bytes)", subject=subject)
    if blake3.blake3(payload).digest() != digest:
        raise IntegrityError("delta is corrupt (checksum mismatch)", subject=subject)
    return Delta(base, depth, codec, payload)
