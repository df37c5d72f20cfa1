"""Reachability for garbage collection: what the refs keep alive, and what nothing does.

Everything reachable from a branch or a tag is kept: the versions along all parents,
their shard tables, every shard those list, the chunks the shards reference, and the
audit object of each version's operation. The walk fails closed: a version or shard
table it cannot read raises (NotFoundError/IntegrityError) instead of being skipped,
because skipping would make everything below it look like garbage.

:func:`unreachable` lists what ``dataset gc`` may delete: unreachable objects and
version records older than a grace period. The grace period protects work in flight:
a commit writes objects before it writes the ref that makes them reachable, so it must
finish within the grace period (choose it longer than your longest ingest). Objects
and refs are listed before the walk, so anything committed before the walk starts is
seen as reachable.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from cachetier.errors import BadInputError
from cachetier.hashing import is_object_id
from cachetier.objects import ObjectStore, object_key
from cachetier.store import Store
from versioning.history import VERSIONS_PREFIX, load_version, version_key
from versioning.refs import RefStore
from versioning.shardtable import load_shard_table

__all__ = ["Reachable", "UnreachableItem", "reachable", "reachable_objects", "unreachable"]


@dataclass(frozen=True)
class Reachable:
    """The ids of versions and of objects that some branch or tag keeps alive."""

    versions: frozenset[str]
    objects: frozenset[str]


@dataclass(frozen=True, slots=True)
class UnreachableItem:
    """A stored version record or object that nothing references, old enough to delete."""

    kind: Literal["object", "version"]
    oid: str
    key: str
    size: int
    mtime: float


def reachable(store: Store, objects: ObjectStore, *, keep: Iterable[str] = ()) -> Reachable:
    """Walk every branch and tag; return the reachable versions and objects (plus ``keep``)."""
    refs = RefStore(store, algorithm=objects.algorithm)
    roots = [*refs.list_branches().values(), *refs.list_tags().values()]
    versions: set[str] = set()
    live: set[str] = set(keep)
    tables_seen: set[str] = set()
    pending = list(roots)
    while pending:
        version_id = pending.pop()
        if version_id in versions:
            continue
        versions.add(version_id)
        record = load_version(store, version_id, algorithm=objects.algorithm)
        pending.extend(record.parents)
        audit = record.operation.get("audit")
        if audit:
            live.add(audit)
        if record.data_hash not in tables_seen:
            tables_seen.add(record.data_hash)
            live.add(record.data_hash)
            table = load_shard_table(objects, record.data_hash)
            live.update(table.hashes())
            live.update(table.chunk_ids())
    return Reachable(frozenset(versions), frozenset(live))


def reachable_objects(store: Store, objects: ObjectStore) -> set[str]:
    """Return the id of every object reachable from any branch or tag."""
    return set(reachable(store, objects).objects)


def unreachable(
    store: Store,
    objects: ObjectStore,
    grace_seconds: float,
    now: float | None = None,
    *,
    keep: Iterable[str] = (),
) -> list[UnreachableItem]:
    """List unreachable objects and version records last modified more than ``grace_seconds`` ago.

    ``now`` is the current epoch time (default: ``time.time()``); ``keep`` names extra
    object ids to treat as reachable (e.g. staged shards of a workspace). Sorted by key.
    """
    if grace_seconds < 0:
        raise BadInputError(f"gc grace period must be >= 0 seconds, got {grace_seconds!r}")
    now = time.time() if now is None else now
    cutoff = now - grace_seconds
    # List first, walk second: anything committed before the walk begins is then seen as live.
    stored_objects = [(oid, info) for oid, info in objects.list() if info.mtime < cutoff]
    stored_versions = [
        (info.key[len(VERSIONS_PREFIX) :], info)
        for info in store.list(VERSIONS_PREFIX)
        if info.mtime < cutoff and is_object_id(info.key[len(VERSIONS_PREFIX) :])
    ]
    live = reachable(store, objects, keep=keep)
    garbage = [
        UnreachableItem("object", oid, object_key(oid), info.size, info.mtime)
        for oid, info in stored_objects
        if oid not in live.objects
    ]
    garbage += [
        UnreachableItem("version", vid, version_key(vid), info.size, info.mtime)
        for vid, info in stored_versions
        if vid not in live.versions
    ]
    return sorted(garbage, key=lambda item: item.key)
