"""Background reading: the windows a reader will visit, decoded ahead on daemon threads.

A reader (one DataLoader worker, or the training process itself) knows its exact future:
the windows its chunks touch, in order (:func:`touched_windows`). The
:class:`WindowPrefetcher` announces the shards of that order to the source (the tiered
cache fetches and protects them), reads the shards of the next ``depth`` windows on a
few threads (Arrow's decompression releases the GIL) and assembles each window on one
more thread, so the consumer finds the next window decoded when it gets there.

Memory stays bounded: the window in use plus ``depth`` windows ahead, nothing more.
Threads are daemons, made per iteration and stopped when it ends; none exists while a
dataset is idle, so forking DataLoader workers never copies a running thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from loaders.partition import Partition
from loaders.plan import EpochPlan
from loaders.window import LoadedWindow

__all__ = ["WindowPrefetcher", "touched_windows"]

_ANNOUNCE_WINDOWS = 256


class _DaemonPool:
    """``threads`` daemon threads running submitted callables; ``close`` cancels the rest."""

    def __init__(self, threads: int, name: str) -> None:
        self._tasks: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(threads)]
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
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

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


def touched_windows(plan: EpochPlan, part: Partition, chunks: range) -> Iterator[int]:
    """The windows that ``chunks`` of ``part`` touch, in order, each once.

    Skips ahead by bisection over chunks, so it costs O(windows x log chunks), not
    O(chunks), when a window holds many chunks of this reader.
    """
    last = -1
    i = 0
    while i < len(chunks):
        pos, n = part.chunk(chunks[i])
        for w, _, _ in plan.segments(pos, pos + n):
            if w > last:
                last = w
                yield w
        boundary = int(plan.window_starts[last + 1])
        lo, hi = i + 1, len(chunks)
        while lo < hi:
            mid = (lo + hi) // 2
            p, m = part.chunk(chunks[mid])
            if p + m <= boundary:
                lo = mid + 1
            else:
                hi = mid
        i = lo


class WindowPrefetcher:
    """Windows of ``order`` loaded ``depth`` ahead of the one in use (see module docstring)."""

    def __init__(self, read_shard: Callable[[str], pa.Table], plan: EpochPlan, order: Iterator[int], *,
                 depth: int, threads: int, announce: Callable[[Sequence[str]], None] | None = None) -> None:
        self._read_shard = read_shard
        self._plan = plan
        self._order = order
        self._depth = max(0, depth)
        self._readers = _DaemonPool(max(1, threads), "tierdata-read")
        self._assembler = _DaemonPool(1, "tierdata-window")
        self._queue: deque[tuple[int, Future[LoadedWindow]]] = deque()
        if announce is not None:
            ahead = list(itertools.islice(self._order, _ANNOUNCE_WINDOWS))
            announce([sid for w in ahead for sid in plan.window_shards(w)])
            self._order = itertools.chain(ahead, self._order)
        self._fill()

    def _fill(self) -> None:
        while len(self._queue) < self._depth + 1:
            w = next(self._order, None)
            if w is None:
                return
            self._queue.append((w, self._schedule(w)))

    def _schedule(self, w: int) -> Future[LoadedWindow]:
        reads = [self._readers.submit(lambda sid=sid: self._read_shard(sid)) for sid in self._plan.window_shards(w)]

        def assemble() -> LoadedWindow:
            return LoadedWindow(w, [f.result() for f in reads])

        return self._assembler.submit(assemble)

    def get(self, w: int) -> LoadedWindow:
        """Window ``w`` (blocking until it is decoded); windows before it are released."""
        while self._queue and self._queue[0][0] < w:
            self._queue.popleft()
            self._fill()
        if not self._queue or self._queue[0][0] != w:
            raise RuntimeError(f"window {w} requested out of the announced order")
        future = self._queue[0][1]
        self._fill()
        return future.result()

    def close(self) -> None:
        """Stop the threads; reads in progress finish and are dropped."""
        self._queue.clear()
        self._readers.close()
        self._assembler.close()

    def __enter__(self) -> WindowPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
