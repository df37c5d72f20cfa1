"""Publishing a process's cache counters, statistics and plan positions to the node.

Each process counts reads in memory; :class:`CounterPublisher` adds what it counted
since the last publication to the node-wide totals in the LMDB environment, in one
commit with the buffered access statistics and plan positions. A commit happens every
``FLUSH_EVERY`` reads or ``FLUSH_INTERVAL`` seconds, from a short-lived thread so that
no read waits for the fsync, and when the process exits (DataLoader workers included),
so ``dataset cache stats`` in any process reports node-wide counters.
"""

from __future__ import annotations

import json
import multiprocessing.util
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from cachetier.health import TIER_ERRORS
from cachetier.lmdbtier import SharedEnv
from cachetier.metrics import CacheCounters

__all__ = ["FLUSH_EVERY", "FLUSH_INTERVAL", "CounterPublisher"]

FLUSH_EVERY = 64
FLUSH_INTERVAL = 1.0
_COUNTERS_KEY = b"counters"


class CounterPublisher:
    """Publish one process's counts to ``env`` (None: nothing is published).

    ``snapshot()`` returns the process's counters now; ``write_buffered(txn)`` adds the
    other buffered state (statistics, plan positions) to the same commit; ``usable()``
    says whether the environment may be used now; ``on_error()`` counts a failed commit.
    """

    def __init__(
        self,
        env: SharedEnv | None,
        *,
        snapshot: Callable[[], CacheCounters],
        write_buffered: Callable[[Any], None],
        usable: Callable[[], bool],
        on_error: Callable[[], None],
    ):
        self._env = env
        self._snapshot = snapshot
        self._write_buffered = write_buffered
        self._usable = usable
        self._on_error = on_error
        self.published = CacheCounters()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._flusher_pid = -1
        self._reads = 0
        self._last = time.monotonic()
        self.closed = False
        _flush_at_exit(self)

    def count_read(self) -> None:
        """Note one read; publish soon (in the background) when enough have gathered."""
        self._reads += 1
        if self._reads >= FLUSH_EVERY or time.monotonic() - self._last >= FLUSH_INTERVAL:
            self._flush_soon()

    def flush(self) -> None:
        """Publish what this process counted since the last time, in one commit."""
        with self._lock:
            self._reads = 0
            self._last = time.monotonic()
            if self.closed or self._env is None or not self._usable():
                return
            snapshot = self._snapshot()
            delta = snapshot - self.published
            if delta == CacheCounters():
                return  # no read since the last flush: nothing buffered either
            try:
                with self._env.write() as txn:
                    self._write_buffered(txn)
                    meta = self._env.db("meta")
                    raw = txn.get(_COUNTERS_KEY, db=meta)
                    total = CacheCounters.from_dict(json.loads(raw)) if raw else CacheCounters()
                    txn.put(_COUNTERS_KEY, json.dumps((total + delta).to_dict()).encode(), db=meta)
                self.published = snapshot
            except TIER_ERRORS:
                self._on_error()

    def node_counters(self) -> CacheCounters | None:
        """The node-wide totals plus this process's unpublished counts; None if unreadable."""
        if self._env is None or not self._usable():
            return None
        try:
            with self._env.read() as txn:
                raw = txn.get(_COUNTERS_KEY, db=self._env.db("meta"))
        except TIER_ERRORS:
            return None
        mine = self._snapshot() - self.published
        return CacheCounters.from_dict(json.loads(bytes(raw))) + mine if raw else self._snapshot()

    def after_fork(self) -> None:
        """In a forked child: the parent's unpublished counts are the parent's to publish."""
        self._pid = os.getpid()
        self.published = self._snapshot()
        self._lock = threading.Lock()
        _flush_at_exit(self)

    def close(self) -> None:
        """Publish what is buffered; publish nothing after."""
        self.flush()
        with self._lock:
            self.closed = True

    def _flush_soon(self) -> None:
        """Wake this process's flusher thread, so a read never waits for the commit's fsync."""
        if self._flusher_pid != os.getpid():
            self._flusher_pid = os.getpid()
            self._due = threading.Event()
            threading.Thread(
                target=_flusher, args=(weakref.ref(self), self._due), name="tierdata-flush", daemon=True
            ).start()
        self._due.set()


def _flusher(ref: weakref.ref[CounterPublisher], due: threading.Event) -> None:
    """Flush whenever ``due`` is set; end when the publisher is gone or closed."""
    while True:
        due.wait(FLUSH_INTERVAL * 5)
        due.clear()
        publisher = ref()
        if publisher is None or publisher.closed:
            return
        publisher.flush()
        del publisher


def _flush_at_exit(publisher: CounterPublisher) -> None:
    """Publish when this process exits, DataLoader workers included.

    multiprocessing runs these finalizers in the children it starts (which end with
    ``os._exit``, skipping ``atexit``) and, through ``atexit``, in the main process.
    """
    ref = weakref.ref(publisher)

    def flush() -> None:
        alive = ref()
        if alive is not None and alive._pid == os.getpid():
            try:
                alive.flush()
            except Exception:  # the process is exiting: counts are advisory
                pass

    multiprocessing.util.Finalize(publisher, flush, exitpriority=10)
