"""The write side of ingest: a bounded pool that encodes, hashes and stores objects.

zstd (inside Arrow's IPC writer and python-zstandard), BLAKE3 and file or socket writes
all release the GIL, so encoding and uploading in worker threads runs on the other
cores while the main thread reads and hashes records. Work in flight is bounded in bytes
(:class:`Uploader` blocks the producer), so memory stays bounded for any input size.
Only content-addressed objects are written; what they mean is decided by the caller.
Objects below :data:`~cachetier.packs.PACK_MEMBER_LIMIT` (shards of a files dataset,
small chunks) are collected into packs of about 16 MiB, so small shards keep edits cheap
without one store request per shard; larger objects are stored standalone, and a large
shard much like one stored before (an edited version of it) as a delta over it
(:mod:`datastore.shardpatch`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import pyarrow as pa

from cachetier.deltas import MAX_DEPTH
from cachetier.errors import IntegrityError, NotFoundError, TierdataError
from cachetier.objects import ObjectStore, object_key
from cachetier.packs import PACK_MEMBER_LIMIT
from datastore.ingestindex import IngestIndex
from datastore.shardpatch import anchors, make_shard_delta
from datastore.shards import EncodedShard, PendingShard, ShardInfo, ShardOptions, encode_shard

__all__ = ["Uploader", "read_ahead", "store_as_delta", "store_pending", "store_pending_many"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class Uploader:
    """Run store jobs on ``workers`` threads with at most ``budget`` bytes of work in flight.

    Objects smaller than ``pack_below`` bytes go into packs (0: never); the open pack is
    written by :meth:`close` and dropped unwritten when the ingest is cancelled or failed.
    """

    def __init__(
        self, objects: ObjectStore, *, workers: int, budget: int, pack_below: int = PACK_MEMBER_LIMIT
    ):
        self.objects = objects
        self.workers, self.budget = workers, budget
        self._pack_below = pack_below
        self._packer = objects.pack_writer()
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="tierdata-ingest")
        self._budget = budget
        self._inflight = 0
        self._cond = threading.Condition()
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self.new_objects = 0
        self.new_bytes = 0
        self.reused_shards = 0

    def submit(self, weight: int, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)``, first waiting until ``weight`` more bytes fit the budget."""
        with self._cond:
            while self._inflight and self._inflight + weight > self._budget and self._failure is None:
                self._cond.wait()
            self._raise_failure()
            self._inflight += weight
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda f: self._done(weight, f))
        return future

    def _done(self, weight: int, future: Future) -> None:
        with self._cond:
            self._inflight -= weight
            if not future.cancelled() and future.exception() is not None and self._failure is None:
                self._failure = future.exception()
            self._cond.notify_all()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def check(self) -> None:
        """Raise the first error a job raised, so the producer stops early."""
        with self._cond:
            self._raise_failure()

    def put(self, oid: str, data: bytes, *, shard: bool = False, checked: bool = False) -> bool:
        """Store an object unless it exists; True when it was new. Safe in any thread.

        A small object is new once it is in the open pack; it is stored when the pack is.
        Small objects are looked up among packs only (see
        :meth:`~cachetier.objects.ObjectStore.touch_if_packed`); large ones also among
        deltas when they are ``shard`` s (only shards are stored as deltas); ``checked``:
        the caller found a large object not stored a moment ago (no second request).
        """
        if len(data) < self._pack_below:
            if self.objects.touch_if_packed(oid) or not self._packer.add(oid, data):
                return False  # packed already, or queued by this ingest
        elif not checked and self.objects.touch_if_exists(oid, deltas=shard):
            return False
        else:
            self.objects.store.put(object_key(oid), data)
        with self._lock:
            self.new_objects += 1
            self.new_bytes += len(data)
        return True

    def put_delta(self, oid: str, delta: bytes) -> None:
        """Store ``oid`` as ``delta`` (the caller found it not stored). Safe in any thread."""
        self.objects.put_delta(oid, delta)
        with self._lock:
            self.new_objects += 1
            self.new_bytes += len(delta)

    @property
    def pack_below(self) -> int:
        """Objects smaller than this go into packs."""
        return self._pack_below

    def count_reused(self) -> None:
        with self._lock:
            self.reused_shards += 1

    def sibling(self, objects: ObjectStore) -> Uploader:
        """A new uploader like this one, storing into ``objects`` (in a forked process)."""
        return Uploader(objects, workers=self.workers, budget=self.budget, pack_below=self._pack_below)

    def add_counts(self, new_objects: int, new_bytes: int, reused_shards: int) -> None:
        """Count what a sibling uploader (in another process) stored and reused."""
        with self._lock:
            self.new_objects += new_objects
            self.new_bytes += new_bytes
            self.reused_shards += reused_shards

    @property
    def packs_written(self) -> int:
        """How many packs this uploader has stored so far."""
        return self._packer.packs_written

    def close(self, *, cancel: bool = False) -> None:
        """Wait for running jobs and store the open pack; with ``cancel``, drop both.

        After a failed job the open pack is dropped too: the ingest fails, and a pack
        is only ever stored whole (data, then index), so nothing looks complete that is not.
        """
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        if cancel or self._failure is not None:
            self._packer.abort()
        else:
            self._packer.flush()

    def __enter__(self) -> Uploader:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.close(cancel=exc_type is not None)


def store_pending(
    up: Uploader,
    pending: PendingShard | Callable[[], PendingShard],
    key: str | None,
    options: ShardOptions,
    index: IngestIndex | None,
) -> ShardInfo:
    """Store one shard; reuse the index's shard id when it is known and stored.

    ``pending`` may be a function that builds the shard, called only when needed.
    """
    if index is not None and key is not None:
        known = index.shard(key)
        if known is not None and up.objects.touch_if_exists(known.hash):
            up.count_reused()
            return known
    if callable(pending):
        pending = pending()
    encoded = encode_shard(pending, options)
    large = len(encoded.data) >= max(up.pack_below, 1)
    sketch = anchors(pending.hashes) if index is not None and large else []
    base = index.similar_shard(sketch, exclude=encoded.hash) if index is not None and sketch else None
    stored = store_as_delta(up, encoded, pending, options, base) if base is not None else "whole"
    if stored == "no base":
        index.forget_anchors_of(base)  # gc removed it: ask no more
    if stored not in ("delta", "stored"):
        up.put(encoded.hash, encoded.data, shard=True, checked=stored != "whole")
    if index is not None:
        if key is not None:
            index.remember_shard(key, encoded.info)
        if sketch:
            index.remember_anchors(encoded.hash, sketch)
    return encoded.info


DeltaOutcome = Literal["delta", "stored", "whole", "no base", "not stored"]


def store_as_delta(
    up: Uploader,
    shard: EncodedShard,
    pending: PendingShard,
    options: ShardOptions,
    base: str,
    base_data: bytes | None = None,
) -> DeltaOutcome:
    """Store ``shard`` as a delta over the stored shard ``base`` (whose bytes the caller
    may have read already). Returns ``"delta"`` when it did, ``"stored"`` when the shard
    is stored already, and otherwise why the caller should store it whole: ``"no base"``
    (the base is gone) or ``"not stored"`` (no delta pays; neither is stored)."""
    if up.objects.touch_if_exists(shard.hash):
        return "stored"
    if not up.objects.touch_if_exists(base):  # touched: gc's grace period now covers it
        return "no base"
    try:
        root, depth = _base_within_depth(up.objects, base)
        if base_data is None or root != base:
            base_data = up.objects.get(root)
        delta = make_shard_delta(shard, pending, options, root, base_data, depth)
    except (TierdataError, pa.ArrowException) as e:
        # A damaged base is verify's to report; a type Arrow cannot `take`, a plain shard.
        log.debug("shard %s is stored whole: no delta over %s (%s)", shard.hash, base, e)
        return "not stored"
    if delta is None:
        return "not stored"
    up.put_delta(shard.hash, delta)
    return "delta"


def store_pending_many(
    up: Uploader,
    items: list[tuple[PendingShard | Callable[[], PendingShard], str | None]],
    options: ShardOptions,
    index: IngestIndex | None,
) -> list[ShardInfo]:
    """Store several shards in order (see :func:`store_pending`): one job for many small shards."""
    return [store_pending(up, pending, key, options, index) for pending, key in items]


def _base_within_depth(objects: ObjectStore, base: str) -> tuple[str, int]:
    """``base`` and its delta depth, or, when a delta over it would make too long a chain,
    the whole object at the root of its chain, touched (edits since then make a larger
    delta, but reads rebuild at most :data:`~cachetier.deltas.MAX_DEPTH` times).
    IntegrityError for a chain longer than its headers say (damage, or a cycle)."""
    found = objects.delta_of(base)
    if found is None or found[1] < MAX_DEPTH:
        return base, found[1] if found else 0
    for _ in range(MAX_DEPTH):
        base = found[0]
        found = objects.delta_of(base)
        if found is None:
            if not objects.touch_if_exists(base):
                raise NotFoundError("the root of a delta chain is missing", subject=f"object {base}")
            return base, 0
    raise IntegrityError("delta chain is deeper than its headers say", subject=f"object {base}")


def read_ahead(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, at most ``depth`` items ahead.

    Parsing in Arrow releases the GIL, so the next block is read and parsed while the
    caller hashes and cuts the current one. Errors are re-raised in the caller; when the
    caller stops early, the producer stops at its next item and closes ``items``.
    """
    slots: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def offer(entry: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(("item", item)):
                    return
            offer(("done", None))
        except BaseException as e:
            offer(("error", e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="tierdata-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = slots.get()
            if kind == "item":
                yield value
            elif kind == "done":
                return
            else:
                raise value
    finally:
        stop.set()
        thread.join()
