"""Repository maintenance: ``verify`` (re-hash what versions reference) and ``gc``.

``verify`` reads every object a version references (its record, shard table, shards,
big-file chunks, audit object), checks each against its id and names each one that
is missing or corrupt, without stopping at the first. ``gc`` deletes objects and
version records that no branch or tag reaches and that are older than a grace period,
so it never removes what a running ingest or commit is about to reference; objects
staged in this workspace are kept whatever their age. Packs are transparent to
``verify`` (a packed object is read and checked by its own id; a missing pack makes
each of its members missing) and removed whole by ``gc`` once no member is reachable.
So are deltas: ``verify`` rebuilds an object stored as one and checks it (a missing
base makes it missing), and ``gc`` keeps the base of every delta it keeps.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cachetier.errors import IntegrityError, NotFoundError, TierdataError
from cachetier.store import ObjectInfo
from versioning import UnreachableItem, VersionRecord, load_shard_table, load_version, unreachable

if TYPE_CHECKING:
    from datastore.repo import Repo

__all__ = ["gc", "verify"]


def verify(repo: Repo, version: str | None) -> dict[str, Any]:
    """Check ``version`` (None: every version some branch or tag reaches).

    Returns ``{"ok", "versions", "objects", "bytes", "problems"}``; each problem is
    ``{"object", "kind", "problem" (missing | corrupt), "message"}``. Every problem is
    listed: a ref, version record or shard table that cannot be read is one, and the
    walk goes on with the rest.
    """
    problems: list[dict[str, str]] = []
    records = _versions_to_verify(repo, version, problems)
    wanted: dict[str, str] = {}
    for record in records.values():
        wanted.setdefault(record.data_hash, "shard table")
        if record.operation.get("audit"):
            wanted.setdefault(record.operation["audit"], "audit")
        try:
            table = load_shard_table(repo.objects, record.data_hash)
        except (NotFoundError, IntegrityError) as e:
            if wanted.pop(record.data_hash, None) is not None:  # once per shard table
                problems.append(_problem(record.data_hash, "shard table", e))
            continue
        for oid in table.hashes():
            wanted.setdefault(oid, "shard")
        for oid in table.chunk_ids():
            wanted.setdefault(oid, "chunk")

    def check(item: tuple[str, str]) -> tuple[int, dict[str, str] | None]:
        oid, kind = item
        try:
            return len(repo.objects.get(oid)), None
        except (NotFoundError, IntegrityError) as e:
            return 0, _problem(oid, kind, e)

    total = 0
    with ThreadPoolExecutor(repo.objects.max_workers) as pool:
        for size, problem in pool.map(check, sorted(wanted.items())):
            total += size
            if problem:
                problems.append(problem)
    return {
        "ok": not problems,
        "versions": len(records),
        "objects": len(wanted),
        "bytes": total,
        "problems": problems,
    }


def _versions_to_verify(
    repo: Repo, version: str | None, problems: list[dict[str, str]]
) -> dict[str, VersionRecord]:
    """The records of ``version``, or of every version the refs reach (following parents);
    what cannot be read is added to ``problems`` and not followed."""
    if version is not None:
        pending = [version]
    else:
        roots, bad_refs = repo.refs.scan()
        problems.extend(_problem(key, "ref", e) for key, e in bad_refs)
        pending = sorted(set(roots.values()))
    records: dict[str, VersionRecord] = {}
    seen: set[str] = set()
    while pending:
        vid = pending.pop()
        if vid in seen:
            continue
        seen.add(vid)
        try:
            record = load_version(repo.store, vid, algorithm=repo.algorithm)
        except (NotFoundError, IntegrityError) as e:
            problems.append(_problem(vid, "version", e))
            continue
        records[vid] = record
        if version is None:
            pending.extend(record.parents)
    return dict(sorted(records.items()))


def _problem(oid: str, kind: str, error: TierdataError) -> dict[str, str]:
    state = "missing" if isinstance(error, NotFoundError) else "corrupt"
    return {"object": oid, "kind": kind, "problem": state, "message": str(error)}


def gc(repo: Repo, *, dry_run: bool, grace_seconds: float) -> dict[str, Any]:
    """Delete (or with ``dry_run`` only list) unreachable items older than ``grace_seconds``.

    An item reused since the listing (touched by an ingest) is kept, and so is one gone
    meanwhile; ``items`` lists what was removed.

    Each item is ``{"kind" (object | version | pack | delta | temp), "id", "key", "size"}``; a pack
    also lists its ``members`` (object ids) and counts as one item. ``temp`` is the temp
    file of a write that never finished (a process killed mid-write; local stores), with
    ``id`` null, removed once older than the grace period like everything else.
    """
    now = time.time()
    items = unreachable(repo.store, repo.objects, grace_seconds, now, keep=repo.staged_object_ids())
    leftovers = _unfinished_writes(repo, grace_seconds)
    if not dry_run:
        cutoff = now - grace_seconds

        def delete(item: UnreachableItem) -> UnreachableItem | None:
            # Asked again right before: an ingest that reused the item since the listing
            # touched it (a pack by its index), and its commit will reference it.
            try:
                if repo.store.info(item.keys[0]).mtime >= cutoff:
                    return None
            except NotFoundError:
                return None
            for key in item.keys:  # a pack's index before its data
                repo.store.delete(key)
            return item

        # Deltas first: a crash part-way then leaves no delta whose base is gone.
        deltas = [item for item in items if item.kind == "delta"]
        others = [item for item in items if item.kind != "delta"]
        with ThreadPoolExecutor(repo.objects.max_workers) as pool:
            items = [item for item in pool.map(delete, deltas) if item is not None]
            items += [item for item in pool.map(delete, others) if item is not None]
        for info in leftovers:
            repo.store.delete_temporary(info.key)  # type: ignore[attr-defined]
    temps = [{"kind": "temp", "id": None, "key": t.key, "size": t.size} for t in leftovers]
    return {
        "dry_run": dry_run,
        "removed": len(items) + len(leftovers),
        "bytes": sum(item.size for item in items) + sum(t.size for t in leftovers),
        "grace_seconds": grace_seconds,
        "items": [_item(i) for i in items] + temps,
    }


def _unfinished_writes(repo: Repo, grace_seconds: float) -> list[ObjectInfo]:
    """Temp files of writes that never finished, older than the grace period (a store that
    writes in place, such as S3, has none)."""
    temporaries = getattr(repo.store, "temporaries", None)
    if temporaries is None:
        return []
    cutoff = time.time() - grace_seconds
    return [info for info in temporaries() if info.mtime < cutoff]


def _item(item: UnreachableItem) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": item.kind, "id": item.oid, "key": item.key, "size": item.size}
    if item.kind == "pack":
        out["members"] = list(item.members)
    return out
