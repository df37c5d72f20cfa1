"""Prefetch hints: readers announce the order they will read objects in.

A *plan* is one reader's future read order (a DataLoader worker's shards for an epoch,
say) and a position in it. From all plans on the node, :meth:`HintIndex.next_use` tells
how many reads from now an object will be needed (the minimum over plans; ``math.inf``
when no plan names it): the placement policy evicts the object needed furthest away and
protects those needed next, and :class:`Prefetcher` fetches the next few ahead.

:class:`HintIndex` is the pure in-memory part (used by the simulator too).
:class:`HintBoard` shares plans between processes through the ``hints`` database of the
node's LMDB environment: a plan is written once when announced, its position is written
with the statistics batches, and other processes re-read the board at most every
``refresh_interval`` seconds. Plans of processes that died, or not advanced for ``ttl``
seconds, are ignored and pruned.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cachetier._proc import process_alive

if TYPE_CHECKING:
    from cachetier.lmdbtier import SharedEnv

__all__ = ["HintBoard", "HintIndex", "Prefetcher"]

_PLAN = struct.Struct("<Id")  # pid, created (wall clock)
_POS = struct.Struct("<qd")  # position, updated (wall clock)
_PLAN_PREFIX = b"plan\0"
_POS_PREFIX = b"pos\0"
_ADVANCE_WINDOW = 256  # how far ahead of its position a read may be and still advance a plan


class _Plan:
    __slots__ = ("keys", "position", "where")

    def __init__(self, keys: Sequence[str], position: int = 0):
        self.keys = tuple(keys)
        self.position = position
        self.where: dict[str, list[int]] = {}
        for i, key in enumerate(self.keys):
            self.where.setdefault(key, []).append(i)

    def next_use(self, key: str, skip: int = 0) -> float:
        indices = self.where.get(key)
        if not indices:
            return math.inf
        k = bisect_left(indices, self.position) + skip
        return float(indices[k] - self.position) if k < len(indices) else math.inf

    def advance(self, key: str) -> bool:
        indices = self.where.get(key)
        if not indices:
            return False
        k = bisect_left(indices, self.position)
        if k < len(indices) and indices[k] - self.position < _ADVANCE_WINDOW:
            self.position = indices[k] + 1
            return True
        return False


class HintIndex:
    """Plans by reader id, and the next announced use of any key across them."""

    def __init__(self) -> None:
        self._plans: dict[str, _Plan] = {}

    def set_plan(self, reader: str, keys: Sequence[str], position: int = 0) -> None:
        """Replace ``reader``'s plan with ``keys``, positioned before ``keys[position]``."""
        self._plans[reader] = _Plan(keys, position)

    def drop(self, reader: str) -> None:
        """Forget ``reader``'s plan."""
        self._plans.pop(reader, None)

    def readers(self) -> list[str]:
        """Ids of the readers with a plan."""
        return list(self._plans)

    def position(self, reader: str) -> int:
        """How many keys of ``reader``'s plan were read."""
        return self._plans[reader].position

    def set_position(self, reader: str, position: int) -> None:
        """Move ``reader``'s plan to ``position`` (positions only move forward)."""
        plan = self._plans.get(reader)
        if plan is not None and position > plan.position:
            plan.position = position

    def advance(self, key: str, reader: str | None = None) -> list[str]:
        """Mark ``key`` read in ``reader``'s plan (None: every plan expecting it soon).

        Returns the readers whose plans moved.
        """
        if reader is not None:
            plan = self._plans.get(reader)
            return [reader] if plan is not None and plan.advance(key) else []
        return [r for r, plan in self._plans.items() if plan.advance(key)]

    def next_use(self, key: str, skip: int = 0) -> float:
        """Reads until some plan reads ``key`` (0: next), or ``math.inf`` when none will.

        With ``skip=1``, the use after the next one in each plan (what keeping an object
        is worth once the read it is prefetched for has happened).
        """
        return min((plan.next_use(key, skip) for plan in self._plans.values()), default=math.inf)

    def upcoming(self, count: int) -> list[str]:
        """The next ``count`` keys of every plan, nearest first, without duplicates."""
        seen: dict[str, None] = {}
        for step in range(count):
            for plan in self._plans.values():
                i = plan.position + step
                if i < len(plan.keys):
                    seen.setdefault(plan.keys[i])
        return list(seen)


class HintBoard:
    """Plans shared by every process on the node (or kept local when ``env`` is None)."""

    def __init__(self, env: SharedEnv | None, *, refresh_interval: float = 0.5, ttl: float = 6 * 3600.0):
        self.env = env
        self.refresh_interval = refresh_interval
        self.ttl = ttl
        self.local = HintIndex()
        self._remote = HintIndex()
        self._remote_created: dict[str, float] = {}
        self._refreshed = -math.inf
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.errors = 0

    def _forked(self) -> None:
        """In a forked child, the parent's plans are the parent's: seen as remote from now on."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self.local, self._remote, self._remote_created = HintIndex(), HintIndex(), {}
            self._dirty, self._refreshed = set(), -math.inf

    def announce(self, keys: Sequence[str], *, reader: str | None = None) -> str:
        """Publish ``reader``'s future read order (replacing its previous one); return its id.

        Without ``reader`` the plan belongs to this process (one plan per process, as
        for a DataLoader worker); a process reading for several plans names them.
        """
        reader = reader or f"{socket.gethostname()}:{os.getpid()}"
        self._forked()
        with self._lock:
            self.local.set_plan(reader, keys)
        if self.env is not None:
            created = time.time()
            value = _PLAN.pack(os.getpid(), created) + "\n".join(keys).encode()
            self._write(
                {_PLAN_PREFIX + reader.encode(): value, _POS_PREFIX + reader.encode(): _POS.pack(0, created)}
            )
        return reader

    def advance(self, key: str, reader: str | None = None) -> None:
        """Record that this process read ``key`` for ``reader`` (None: for any plan expecting it)."""
        self._forked()
        with self._lock:
            self._dirty.update(self.local.advance(key, reader))

    def drop(self, reader: str) -> None:
        """Withdraw ``reader``'s plan."""
        self._forked()
        with self._lock:
            self.local.drop(reader)
            self._dirty.discard(reader)
        self._write({_PLAN_PREFIX + reader.encode(): None, _POS_PREFIX + reader.encode(): None})

    def next_use(self, keys: Iterable[str], *, skip: int = 0, refresh: bool = True) -> dict[str, float]:
        """Next announced use of each key over the plans of every process.

        ``refresh=False`` uses the board as last read, which is what a caller inside an
        LMDB transaction must do (a thread holds one transaction at a time).
        """
        self._forked()
        if refresh:
            self.refresh()
        with self._lock:
            return {k: min(self.local.next_use(k, skip), self._remote.next_use(k, skip)) for k in keys}

    def upcoming(self, count: int) -> list[str]:
        """The next ``count`` keys of this process's plans (what to prefetch)."""
        self._forked()
        with self._lock:
            return self.local.upcoming(count)

    def flush(self, txn: Any = None) -> None:
        """Publish the positions of this process's plans (in ``txn``, or a transaction of its own)."""
        self._forked()
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            now = time.time()
            updates = {
                _POS_PREFIX + r.encode(): _POS.pack(self.local.position(r), now)
                for r in dirty
                if r in self.local.readers()
            }
        self._write(updates, txn)

    def close(self) -> None:
        """Withdraw every plan of this process."""
        self._forked()
        for reader in self.local.readers():
            self.drop(reader)

    def _write(self, updates: dict[bytes, bytes | None], txn: Any = None) -> None:
        if self.env is None or not updates:
            return
        if txn is not None:
            self._put_all(txn, updates)
            return
        try:
            with self.env.write() as own:
                self._put_all(own, updates)
        except Exception:  # hints are advisory: never fail a read for them
            self.errors += 1

    def _put_all(self, txn: Any, updates: dict[bytes, bytes | None]) -> None:
        db = self.env.db("hints")
        for key, value in updates.items():
            if value is None:
                txn.delete(key, db=db)
            else:
                txn.put(key, value, db=db)

    def refresh(self, *, force: bool = False) -> None:
        """Re-read other processes' plans if the last read is older than ``refresh_interval``."""
        self._forked()
        if self.env is None or (not force and time.monotonic() - self._refreshed < self.refresh_interval):
            return
        self._refreshed = time.monotonic()
        try:
            plans, stale = self._read_board(self.env)
        except Exception:
            self.errors += 1
            return
        with self._lock:
            for reader in self._remote.readers():
                if reader not in plans:
                    self._remote.drop(reader)
                    self._remote_created.pop(reader, None)
            for reader, (created, keys, position) in plans.items():
                if self._remote_created.get(reader) != created and keys is not None:
                    self._remote.set_plan(reader, keys)
                    self._remote_created[reader] = created
                self._remote.set_position(reader, position)
        if stale:
            self._write({k: None for r in stale for k in (_PLAN_PREFIX + r, _POS_PREFIX + r)})

    def _read_board(
        self, env: SharedEnv
    ) -> tuple[dict[str, tuple[float, list[str] | None, int]], list[bytes]]:
        plans: dict[str, tuple[float, list[str] | None, int]] = {}
        stale: list[bytes] = []
        local = set(self.local.readers())
        now = time.time()
        with env.read(buffers=True) as txn:
            db = env.db("hints")
            cursor = txn.cursor(db)
            found = cursor.set_range(_PLAN_PREFIX)
            while found and bytes(cursor.key()).startswith(_PLAN_PREFIX):
                rid = bytes(cursor.key())[len(_PLAN_PREFIX) :]
                reader = rid.decode()
                value = cursor.value()
                pid, created = _PLAN.unpack(bytes(value[: _PLAN.size]))
                pos_raw = txn.get(_POS_PREFIX + rid, db=db)
                position, updated = _POS.unpack(bytes(pos_raw)) if pos_raw is not None else (0, created)
                if not process_alive(pid) or now - updated > self.ttl:
                    stale.append(rid)
                elif reader not in local:
                    known = self._remote_created.get(reader) == created
                    keys = None if known else bytes(value[_PLAN.size :]).decode().split("\n")
                    plans[reader] = (created, keys, position)
                found = cursor.next()
        return plans, stale


class Prefetcher:
    """Run ``fetch(key)`` ahead of the readers in a small thread pool, once per key in flight."""

    def __init__(self, fetch: Callable[[str], Any], *, workers: int = 4):
        self._fetch = fetch
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1
        self._inflight: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self.errors = 0

    def schedule(self, keys: Iterable[str]) -> int:
        """Start fetching the keys not already in flight; return how many were started."""
        started: list[tuple[str, Future[None]]] = []
        with self._lock:
            if self._pid != os.getpid():  # a pool inherited through fork has no threads
                self._pool, self._inflight, self._pid = None, {}, os.getpid()
            for key in keys:
                if key in self._inflight:
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="tierdata-prefetch")
                future = self._pool.submit(self._run, key)
                self._inflight[key] = future
                started.append((key, future))
        for key, future in started:  # outside the lock: a finished future calls back at once
            future.add_done_callback(self._done_callback(key))
        return len(started)

    def join(self, key: str, timeout: float | None = None) -> bool:
        """Wait for an in-flight fetch of ``key``; True if there was one and it finished."""
        with self._lock:
            future = self._inflight.get(key) if self._pid == os.getpid() else None
        if future is None:
            return False
        try:
            future.result(timeout)
        except Exception:
            return False
        return True

    def _run(self, key: str) -> None:
        self._fetch(key)

    def _done_callback(self, key: str) -> Callable[[Future[None]], None]:
        def done(future: Future[None]) -> None:
            with self._lock:
                if self._inflight.get(key) is future:
                    del self._inflight[key]
            if future.exception() is not None:
                self.errors += 1

        return done

    def wait(self) -> None:
        """Block until every scheduled fetch finished (for tests and benchmarks)."""
        while True:
            with self._lock:
                if not self._inflight:
                    return
            time.sleep(0.005)

    def close(self) -> None:
        """Stop the pool (running fetches finish, queued ones are dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)
