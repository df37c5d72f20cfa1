"""Single-flight across the threads and processes of a node: one of them fills a cache miss.

When several DataLoader workers (or ranks on one node) miss on the same object at once,
each would fetch it from the object store and decode it. :class:`FlightLocks` lets the
first one do it while the others wait, then find the object in a tier.

A key maps to one of ``stripes`` byte-range locks (``lockf``) on one file, plus a
thread lock per stripe (``lockf`` locks belong to a process, not to a thread). Only one
stripe is held at a time, so there is no lock order to get wrong; two keys on one
stripe merely take turns. The kernel releases the locks of a process that dies (even by
``kill -9``), so a crash never leaves waiters stuck, and nothing is left to clean up.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["FlightLocks", "lock_record"]

_STRIPES = 4096


def lock_record(fd: int, length: int = 0, start: int = 0) -> None:
    """``lockf(fd, LOCK_EX, length, start)``, waiting out a false EDEADLK.

    Record locks belong to processes, so when threads of two processes each hold one
    lock and wait for the other's (a flight stripe and the RAM tier's ``.lock``, say),
    the kernel may see a cycle between the processes that no thread is in, and refuse
    at once. The holders let go soon: pause and try again.
    """
    pause = 0.001
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, length, start)
            return
        except OSError as e:
            if e.errno != errno.EDEADLK:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class FlightLocks:
    """Exclusive, crash-safe "I am filling ``key``" locks shared through the file ``path``."""

    def __init__(self, path: str | os.PathLike[str], *, stripes: int = _STRIPES):
        self.path = Path(path)
        self.stripes = stripes
        self._fd: int | None = None
        self._unusable = False
        self._pid = -1
        self._guard = threading.Lock()
        self._thread_locks: dict[int, threading.Lock] = {}

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold ``key``'s lock: no other thread or process on the node holds it meanwhile.

        Where the lock file cannot be made or locked (an unusable cache folder) this
        holds nothing: fills are then merely not shared, as without a cache.
        """
        stripe = zlib.crc32(key.encode()) % self.stripes
        opened = self._open(stripe)
        if opened is None:
            yield
            return
        fd, thread_lock = opened
        with thread_lock:
            try:
                lock_record(fd, 1, stripe)
                locked = True
            except OSError:
                locked = False
            try:
                yield
            finally:
                if locked:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, stripe)

    def _open(self, stripe: int) -> tuple[int, threading.Lock] | None:
        if self._pid != os.getpid():
            # a forked child: the parent's thread locks may be held by threads the child
            # lacks, and its lockf locks are not inherited; the descriptor stays usable
            self._guard, self._thread_locks, self._pid = threading.Lock(), {}, os.getpid()
        with self._guard:
            if self._fd is None:
                if self._unusable:
                    return None
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError:
                    self._unusable = True
                    return None
            lock = self._thread_locks.get(stripe)
            if lock is None:
                lock = self._thread_locks[stripe] = threading.Lock()
            return self._fd, lock

    def close(self) -> None:
        """Close the lock file (closing releases every lock this process holds on it)."""
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
