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

Packs (``packs/<id>.pack`` + ``.idx``, see :mod:`cachetier.packs`) are kept whole while
any member is reachable, and deleted whole (index first) once none is and the pack is
older than the grace period; a pack's age is that of its newer key (reusing a member
touches the index). A pack without an index (a crash between the two writes) is garbage
once old enough. A mostly dead pack is kept whole: nothing is repacked.

An object stored as a delta (``deltas/``, see :mod:`cachetier.deltas`) needs its base:
the base of every delta whose object is reachable, or that is younger than the grace
period (an ingest in flight may be about to commit it), is kept, and so on down the
chain. A delta whose object nothing reaches is deleted like an object.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from cachetier.deltas import delta_key
from cachetier.errors import BadInputError, NotFoundError
from cachetier.hashing import is_object_id
from cachetier.objects import ObjectStore, object_key
from cachetier.packs import StoredPack, index_key, index_oids, list_packs, pack_key, read_index
from cachetier.store import ObjectInfo, Store
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
    """A stored version record, object or pack that nothing references, old enough to delete.

    For a pack, ``oid`` is the pack id, ``key`` its data key, ``index_key`` its index key
    (delete the index first, so a pack is never left with an index and no data) and
    ``members`` the object ids it holds; ``size`` counts both keys.
    """

    kind: Literal["object", "version", "pack", "delta"]
    oid: str
    key: str
    size: int
    mtime: float
    index_key: str | None = None
    members: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The store keys to delete, in order."""
        return (self.key,) if self.index_key is None else (self.index_key, self.key)


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
    """List unreachable objects, packs and version records last modified more than ``grace_seconds`` ago.

    ``now`` is the current epoch time (default: ``time.time()``); ``keep`` names extra
    object ids to treat as reachable (e.g. staged shards of a workspace). Sorted by key.
    """
    if grace_seconds < 0:
        raise BadInputError(f"gc grace period must be >= 0 seconds, got {grace_seconds!r}")
    now = time.time() if now is None else now
    cutoff = now - grace_seconds
    # List first, walk second: anything committed before the walk begins is then seen as live.
    stored_objects = [(oid, info) for oid, info in objects.list() if info.mtime < cutoff]
    stored_packs = [p for p in list_packs(store) if p.mtime < cutoff]
    stored_versions = [
        (info.key[len(VERSIONS_PREFIX) :], info)
        for info in store.list(VERSIONS_PREFIX)
        if info.mtime < cutoff and is_object_id(info.key[len(VERSIONS_PREFIX) :])
    ]
    all_deltas = list(objects.list_deltas())
    reached = reachable(store, objects, keep=keep)
    young = {oid for oid, info in all_deltas if info.mtime >= cutoff}
    live = Reachable(reached.versions, _with_delta_bases(objects, reached.objects, young, all_deltas))
    garbage = [
        UnreachableItem("object", oid, object_key(oid), info.size, info.mtime)
        for oid, info in stored_objects
        if oid not in live.objects
    ]
    garbage += [
        UnreachableItem("delta", oid, delta_key(oid), info.size, info.mtime)
        for oid, info in all_deltas
        if oid not in live.objects and oid not in young
    ]
    garbage += [
        UnreachableItem("version", vid, version_key(vid), info.size, info.mtime)
        for vid, info in stored_versions
        if vid not in live.versions
    ]
    garbage += _dead_packs(store, stored_packs, live.objects, objects.max_workers)
    return sorted(garbage, key=lambda item: item.key)


def _with_delta_bases(
    objects: ObjectStore, live: frozenset[str], young: set[str], deltas: list[tuple[str, ObjectInfo]]
) -> frozenset[str]:
    """``live`` plus the bases that live or young deltas rebuild from, down every chain.
    A delta header that cannot be read raises (fail closed: its base might be live)."""
    stored = {oid for oid, _info in deltas}
    keep = set(live)
    pending = [oid for oid in stored if oid in live or oid in young]
    with ThreadPoolExecutor(max(1, objects.max_workers)) as pool:
        while pending:  # one round per level of the chains
            bases = [found[0] for found in pool.map(objects.delta_of, pending) if found is not None]
            pending = [base for base in set(bases) - keep if base in stored]
            keep.update(bases)
    return frozenset(keep)


def _dead_packs(
    store: Store, packs: list[StoredPack], live: frozenset[str], workers: int
) -> list[UnreachableItem]:
    """The packs none of whose members is live. An unreadable index raises (fail closed)."""

    def judge(pack: StoredPack) -> UnreachableItem | None:
        members: tuple[str, ...] = ()
        if pack.index is not None:
            try:
                members = tuple(index_oids(read_index(store, pack.packid)))
            except NotFoundError:
                return None  # removed since the listing
            if any(m in live for m in members):
                return None
        key = pack_key(pack.packid)
        return UnreachableItem(
            "pack",
            pack.packid,
            key,
            pack.size,
            pack.mtime,
            index_key=index_key(pack.packid) if pack.index is not None else None,
            members=members,
        )

    with ThreadPoolExecutor(max(1, workers)) as pool:
        return [item for item in pool.map(judge, packs) if item is not None]
