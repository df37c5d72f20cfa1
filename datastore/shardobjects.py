"""The repository's object store: reads shards stored as deltas, loading the rebuild on demand.

A shard stored as a delta over a base (:mod:`datastore.shardpatch`) is rebuilt with
Arrow. Opening a repository, resolving refs and reading versions need no Arrow, and a
training process streaming a warm version never rebuilds a shard, so the rebuilder here
imports :mod:`datastore.shardpatch` (and with it pyarrow) only when a delta is read.
"""

from __future__ import annotations

from cachetier.hashing import DEFAULT_HASH
from cachetier.objects import ObjectStore
from cachetier.store import Store

__all__ = ["CODEC", "shard_objects"]

#: The delta codec of shards stored as record-level deltas (:mod:`datastore.shardpatch`).
CODEC = "shard-rows/1"


class _OnDemandRebuilder:
    """A :class:`cachetier.deltas.Rebuilder` that loads the shard rebuilder at its first use."""

    codec = CODEC

    def __call__(self, base: bytes, payload: bytes, subject: str) -> bytes:
        from datastore.shardpatch import ShardRebuilder

        return ShardRebuilder()(base, payload, subject)

    def describe(self, payload: bytes) -> str:
        from datastore.shardpatch import ShardRebuilder

        return ShardRebuilder().describe(payload)


def shard_objects(store: Store, *, algorithm: str = DEFAULT_HASH, max_workers: int = 8) -> ObjectStore:
    """An object store over ``store`` that reads shards stored as deltas."""
    return ObjectStore(store, algorithm=algorithm, max_workers=max_workers, rebuilder=_OnDemandRebuilder())
