"""Background reading: the shards a reader will need, decoded ahead on daemon threads.

A reader (one DataLoader worker, or the training process itself) knows its exact future:
the windows its chunks touch, in order (:func:`touched_windows`), hence the shards it
will need, in order (:func:`needed_shards`). The :class:`ShardPrefetcher` announces that
order to the source (the tiered cache fetches and protects those shards), reads and
decodes the next ``depth`` shards on a few threads (Arrow's decompression releases the
GIL), and releases a shard as soon as the reader's windows have moved past it.

Memory stays bounded: the shards of the window in use (``shuffle_window`` of them) plus
``depth`` shards ahead; a reader may swap a held shard for the part it still needs
(:meth:`ShardPrefetcher.replace`). Threads are daemons, made per iteration and stopped
(and waited for) when it ends; none exists while a dataset is idle, so forking DataLoader
workers never copies a running thread, and an idle thread holds no shard.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from loaders.decoded import DecodedShard
from loaders.partition import Partition
from loaders.plan import EpochPlan

__all__ = ["ShardPrefetcher", "needed_shards", "touched_windows"]

_ANNOUNCE_SHARDS = 1024
_JOIN_S = 30.0  # at most this long waiting for the reads in progress when a prefetcher closes


class _DaemonPool:
    """``threads`` daemon threads running submitted callables; ``close`` cancels the rest."""

    def __init__(self, threads: int, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)
        ]
        self._closed = False
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._tasks.put((future, fn))
        return future

    def _run(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            future, fn = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as e:
                    future.set_exception(e)
            # an idle thread must not keep its last shard alive (memory is bounded by the reader)
            del item, future, fn

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._tasks.put(None)
        # Wait for the reads in progress: a DataLoader may fork its workers next, and a
        # thread still reading could hold a lock the forked child would wait on forever.
        # Bounded, so a read stuck on a slow store delays the caller, never hangs it.
        deadline = time.monotonic() + _JOIN_S
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def touched_windows(plan: EpochPlan, part: Partition, chunks: range) -> Iterator[int]:
    """The windows that ``chunks`` of ``part`` touch, in order, each once.

    Skips ahead by bisection over chunks, so it costs O(windows x log chunks), not
    O(chunks), when a window holds many chunks of this reader.
    """
    last = -1
    i = 0
    while i < len(chunks):
        for pos, n in part.chunk(chunks[i]):
            for w, _, _ in plan.segments(pos, pos + n):
                if w > last:
                    last = w
                    yield w
        boundary = int(plan.window_starts[last + 1])
        lo, hi = i + 1, len(chunks)
        while lo < hi:
            mid = (lo + hi) // 2
            p, m = part.chunk(chunks[mid])[-1]
            if p + m <= boundary:
                lo = mid + 1
            else:
                hi = mid
        i = lo


def needed_shards(plan: EpochPlan, windows: Iterator[int]) -> Iterator[int]:
    """The plan indices of the shards that ``windows`` read, in order of first need, each once."""
    last = -1
    for w in windows:
        for i in plan.window_shards(w):
            if i > last:
                last = i
                yield i


class ShardPrefetcher:
    """Decoded shards of ``order`` (``load(i)`` on reader threads), read ``depth`` ahead
    of the ones in use (see module docstring)."""

    def __init__(
        self,
        load: Callable[[int], DecodedShard],
        order: Iterator[int],
        *,
        depth: int,
        threads: int,
        announce: Callable[[Sequence[int]], None] | None = None,
    ) -> None:
        self._load = load
        self._order = order
        self._depth = max(0, depth)
        self._pool = _DaemonPool(max(1, threads), "tierdata-read")
        self._futures: OrderedDict[int, Future[DecodedShard]] = OrderedDict()
        self._last = -1
        self._held: tuple[range, dict[int, DecodedShard]] | None = None
        if announce is not None:
            ahead = list(itertools.islice(self._order, _ANNOUNCE_SHARDS))
            announce(ahead)
            self._order = itertools.chain(ahead, self._order)

    def _schedule_through(self, index: int) -> None:
        while self._last < index:
            i = next(self._order, None)
            if i is None:
                return
            self._futures[i] = self._pool.submit(lambda i=i: self._load(i))
            self._last = i

    def schedule(self, needed: range) -> None:
        """Start reading ``needed`` (and what comes before it) without waiting."""
        self._schedule_through(needed.stop - 1)

    def acquire(self, needed: range, *, read_ahead: bool = True) -> dict[int, DecodedShard]:
        """The decoded shards ``needed`` (blocking until read); shards before them are released.

        The next ``depth`` shards are scheduled too, unless ``read_ahead`` is false (a
        later call for the same shards schedules them).
        """
        if self._held is None or self._held[0] != needed:
            self._held = None
            while self._futures and next(iter(self._futures)) < needed.start:
                self._futures.popitem(last=False)
            # what is needed now first, so the first batch does not wait behind read-ahead
            self._schedule_through(needed.stop - 1)
            self._held = (needed, {i: self._futures[i].result() for i in needed if i in self._futures})
        if read_ahead:
            self._schedule_through(needed.stop - 1 + self._depth)
        return self._held[1]

    def replace(self, index: int, shard: DecodedShard) -> None:
        """Hold ``shard`` instead of the decoded shard ``index`` (read already), from now on."""
        if index in self._futures:
            done: Future[DecodedShard] = Future()
            done.set_result(shard)
            self._futures[index] = done
        if self._held is not None and index in self._held[1]:
            self._held[1][index] = shard

    def close(self) -> None:
        """Stop the threads: reads in progress finish (waited for) and are dropped."""
        self._held = None
        self._futures.clear()
        self._pool.close()

    def __enter__(self) -> ShardPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
