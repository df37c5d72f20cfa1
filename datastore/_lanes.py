"""A files ingest in two processes: a forked child (:class:`~datastore._forklane.Lane`)
reads, hashes and stores the second half of a directory while this process does the first.

Most of the work per file and per small shard is Python that holds the GIL, so one
process uses about 1.3 of 2 cores (20,000 files: 2.0-2.2 s; 1.3-1.6 s in two lanes).

The shards are exactly those of one process. After a cut, the next cut depends only on
where that cut was; the child finds the first position in its half where a cut falls
whatever the first half ends with (:meth:`~datastore.shards.BoundaryCutter.sync_point`),
tells this process, and cuts from there. This process takes the records up to that
position, where its own cutter cuts too. Each process stores its shards through its own
uploader (into its own packs); the child sends back what it stored, its part of the
source digest and what it taught its copy of the ingest index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cachetier.hashing import hasher
from cachetier.objects import ObjectStore
from datastore._forklane import Lane, Send, can_fork
from datastore._ingestfiles import FilesIngest, FilesOutcome, hash_array
from datastore._pipeline import Uploader
from datastore._sourcebase import SourceSpec
from datastore.chunking import ChunkOptions
from datastore.files import FILES_SCHEMA, FileEntry
from datastore.ingestindex import IngestIndex
from datastore.recordhash import digest_prefixes
from datastore.shards import ShardInfo, ShardOptions

__all__ = ["ingest_in_two_lanes", "two_lanes_pay"]

log = logging.getLogger(__name__)

# Below this, forking and a second pipeline cost more than the second core saves.
_MIN_FILES = 1000
_MIN_BYTES = 32 << 20
_SYNC_STEP = 64  # files hashed at first when looking for the sync point (doubling)


def two_lanes_pay(entries: list[FileEntry]) -> bool:
    """True when two processes would ingest ``entries`` sooner than one, and may be forked."""
    return len(entries) >= _MIN_FILES and sum(e.size for e in entries) >= _MIN_BYTES and can_fork()


@dataclass(slots=True)
class _ChildResult:
    """What the child stored and learned, sent back when it is done."""

    shards: list[ShardInfo] = field(default_factory=list)
    digest: bytes = b""
    files_read: int = 0
    index_changes: list[tuple] = field(default_factory=list)
    new_objects: int = 0
    new_bytes: int = 0
    reused_shards: int = 0


def ingest_in_two_lanes(
    spec: SourceSpec,
    entries: list[FileEntry],
    up: Uploader,
    options: ShardOptions,
    chunk_options: ChunkOptions,
    index: IngestIndex | None,
    *,
    progress: Callable[[int], None] | None,
    read_started_ns: int,
) -> FilesOutcome:
    """Ingest one directory's ``entries`` in this process and a forked child (see the module
    docstring); the outcome is that of :func:`~datastore._ingestfiles.ingest_files`."""
    mid = _middle(entries)
    log.debug("ingest in two processes: files from %d of %d go to the second", mid, len(entries))

    def second_half(send: Send) -> _ChildResult:
        return _child_ingest(
            send, spec, entries[mid:], mid, up, options, chunk_options, index, read_started_ns
        )

    started = time.perf_counter()
    child = Lane(second_half, progress)
    run = FilesIngest(up, options, chunk_options, index, progress, read_started_ns)
    try:
        digest = hasher()
        for records in run.hashed(entries[:mid], spec.display):
            run.take(records, digest)
            child.poll()
        sync = child.wait_for("sync")
        for records in run.hashed(entries[mid:sync], spec.display):
            run.take(records, digest)
            child.poll()
        if sync < len(entries) and run.pending:
            raise RuntimeError(f"the ingest lanes disagree on the shard boundary at file {sync}")
        shards = run.finish()
        waited = time.perf_counter()
        done: _ChildResult = child.wait_for("done")
        log.debug(
            "first half done in %.2f s, then waited %.2f s for the second",
            waited - started,
            time.perf_counter() - waited,
        )
    except BaseException:
        child.kill()
        raise
    finally:
        run.close()
        child.reap()
    digest.update(done.digest)
    if index is not None:
        index.apply_changes(done.index_changes)
    up.add_counts(done.new_objects, done.new_bytes, done.reused_shards)
    stats = run.source_stats(spec, entries, digest)
    return FilesOutcome(FILES_SCHEMA, shards + done.shards, [stats], run.files_read + done.files_read)


def _middle(entries: list[FileEntry]) -> int:
    """The index that splits ``entries`` into halves of about equal bytes."""
    cum = np.cumsum(np.fromiter((e.size + 1 for e in entries), np.int64, len(entries)))
    return int(np.searchsorted(cum, cum[-1] // 2))


def _child_ingest(
    send: Send,
    spec: SourceSpec,
    entries: list[FileEntry],
    offset: int,
    parent_up: Uploader,
    options: ShardOptions,
    chunk_options: ChunkOptions,
    index: IngestIndex | None,
    read_started_ns: int,
) -> _ChildResult:
    """The child's work: ingest ``entries`` (the files from ``offset`` on) from the first
    position where a cut is sure, through an uploader and object store of its own."""
    objects = parent_up.objects.sibling()
    up = parent_up.sibling(objects)
    if index is not None:
        index.record_changes()
    sync = _sync_point(entries, spec.display, up.objects, options, chunk_options, read_started_ns)
    send("sync", offset + sync)
    result = _ChildResult()
    if sync == len(entries):  # no sure cut in this half: the parent takes it all
        up.close()
        return result
    run = FilesIngest(up, options, chunk_options, index, lambda n: send("progress", n), read_started_ns)
    digest = _DigestParts()
    try:
        for records in run.hashed(entries[sync:], spec.display):
            run.take(records, digest)
        result.shards = run.finish()
        up.close()
    except BaseException:
        up.close(cancel=True)
        raise
    finally:
        run.close()
    result.digest = b"".join(digest.parts)
    result.files_read = run.files_read
    result.index_changes = index.changes() if index is not None else []
    result.new_objects, result.new_bytes, result.reused_shards = (
        up.new_objects,
        up.new_bytes,
        up.reused_shards,
    )
    return result


def _sync_point(entries, display, objects, options, chunk_options, read_started_ns) -> int:
    """The first position in ``entries`` where a cut falls whatever precedes them
    (``len(entries)`` if there is none).

    The records are hashed in a dry run that stores nothing (big files' chunk ids are
    computed, not stored) and consults no index: the parent stores the records before
    this position, so storing any of them here would store them twice.
    """
    dry = FilesIngest(_DryUploader(objects), options, chunk_options, None, None, read_started_ns)
    held: list = []
    step = _SYNC_STEP
    try:
        while len(held) < len(entries):
            for records in dry.hashed(entries[len(held) : len(held) + step], display):
                held.extend(records)
            prefixes = digest_prefixes(hash_array(held))
            sync = dry.cutter.sync_point(prefixes, np.fromiter((r.size for r in held), np.int64, len(held)))
            if sync is not None:
                return sync
            step *= 2
    finally:
        dry.close()
    return len(entries)


class _DryUploader:
    """What :class:`FilesIngest` needs to hash records, storing nothing."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects

    def submit(self, weight: int, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args))
        return future

    def put(self, oid: str, data: bytes) -> bool:
        return False

    def check(self) -> None:
        pass


class _DigestParts:
    """The child's stand-in for the source digest: it keeps the bytes, which the parent
    hashes after its own."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def update(self, data: bytes) -> None:
        self.parts.append(data)
