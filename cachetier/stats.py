"""Access statistics: a decayed access frequency per object, shared by every process.

Time is *logical*: the clock is the number of accesses recorded so far on the node, so
a frequency means the same thing whether a job reads fast or slow, and the trace
simulator and the real cache compute identical numbers. A count decays exponentially
with a half-life of ``factor`` × (objects tracked) accesses (at least ``minimum``): one
pass over every object ages counts by 2^(-1/factor), small enough that objects read once
per epoch keep equal frequencies whatever their position in the epoch, large enough
that what stopped being read fades.

:class:`MemoryStats` keeps the table in a dict (one process, the simulator, or a cache
whose LMDB environment is unusable). :class:`SharedStats` keeps it in the ``stats``
database of the node's LMDB environment and the clock in ``meta``; reads are counted in
memory and written in one transaction every ``flush_every`` accesses or
``flush_interval`` seconds (``flush_every=None``: only on :meth:`SharedStats.flush`), so
recording a read costs a dict update.
"""

from __future__ import annotations

import math
import os
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cachetier.lmdbtier import SharedEnv

__all__ = ["AccessRecord", "AccessStats", "Decay", "MemoryStats", "SharedStats"]

_ENTRY = struct.Struct("<dd")  # decayed count at time t, t
_CLOCK_KEY = b"clock"
_PRUNE_EVERY = 256  # flushes between sweeps of entries that decayed to nothing
_NEGLIGIBLE = 1e-3


@dataclass(frozen=True, slots=True)
class Decay:
    """Exponential decay in logical time; the half-life scales with the objects tracked."""

    factor: float = 4.0
    minimum: float = 1024.0

    def half_life(self, tracked: int) -> float:
        """Accesses after which a count halves, with ``tracked`` objects in the table."""
        return max(self.minimum, self.factor * tracked)

    @staticmethod
    def apply(count: float, elapsed: float, half_life: float) -> float:
        """Return ``count`` aged by ``elapsed`` accesses."""
        return count * math.exp2(-max(elapsed, 0.0) / half_life)


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One object's decayed access frequency (now) and the logical time of its last access."""

    frequency: float = 0.0
    last_access: float = -math.inf


class AccessStats(ABC):
    """A table of decayed access frequencies."""

    @abstractmethod
    def record(self, key: str, count: int = 1) -> None:
        """Count ``count`` accesses to ``key`` now."""

    @abstractmethod
    def lookup(self, keys: Iterable[str], txn: Any = None) -> dict[str, AccessRecord]:
        """Return the record of every key (a zero record for keys never read)."""

    @property
    @abstractmethod
    def now(self) -> float:
        """The logical clock: accesses recorded so far."""

    def flush(self) -> None:  # noqa: B027 (a no-op by default: most tables buffer nothing)
        """Publish buffered accesses (no-op where nothing is buffered)."""

    def close(self) -> None:
        """Flush and release resources."""
        self.flush()


class MemoryStats(AccessStats):
    """Access statistics of this process only, updated on every access."""

    def __init__(self, decay: Decay = Decay()):
        self.decay = decay
        self._table: dict[str, tuple[float, float]] = {}
        self._clock = 0.0
        self._lock = threading.Lock()

    @property
    def now(self) -> float:
        return self._clock

    def record(self, key: str, count: int = 1) -> None:
        with self._lock:
            self._clock += count
            half_life = self.decay.half_life(len(self._table))
            old, at = self._table.get(key, (0.0, self._clock))
            self._table[key] = (self.decay.apply(old, self._clock - at, half_life) + count, self._clock)

    def lookup(self, keys: Iterable[str], txn: Any = None) -> dict[str, AccessRecord]:
        with self._lock:
            half_life = self.decay.half_life(len(self._table))
            out = {}
            for key in keys:
                entry = self._table.get(key)
                out[key] = (
                    AccessRecord(self.decay.apply(entry[0], self._clock - entry[1], half_life), entry[1])
                    if entry
                    else AccessRecord()
                )
            return out


class SharedStats(AccessStats):
    """Access statistics in the node's LMDB environment, written in batches."""

    def __init__(
        self,
        env: SharedEnv,
        *,
        decay: Decay = Decay(),
        flush_every: int | None = 64,
        flush_interval: float = 1.0,
    ):
        self.env = env
        self.decay = decay
        self.flush_every = flush_every
        self.flush_interval = flush_interval
        self._pending: Counter[str] = Counter()
        self._pending_total = 0
        self._last_flush = time.monotonic()
        self._flushes = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.errors = 0

    def _forked(self) -> None:
        """In a forked child, the parent's buffered accesses are the parent's to publish."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._pending, self._pending_total = Counter(), 0

    @property
    def now(self) -> float:
        with self.env.read() as txn:
            return self._clock(txn) + self._pending_total

    def record(self, key: str, count: int = 1) -> None:
        self._forked()
        with self._lock:
            self._pending[key] += count
            self._pending_total += count
            due = self.flush_every is not None and (
                self._pending_total >= self.flush_every
                or time.monotonic() - self._last_flush >= self.flush_interval
            )
        if due:
            self.flush()

    def flush(self, txn: Any = None) -> None:
        """Write buffered accesses in one transaction (``txn``, or one of its own).

        On a write error the buffered accesses are dropped: statistics are advisory, and
        a full disk must not break reads. With ``txn`` the caller's commit decides.
        """
        self._forked()
        with self._lock:
            pending, total = self._pending, self._pending_total
            self._pending, self._pending_total = Counter(), 0
            self._last_flush = time.monotonic()
        if not pending:
            return
        if txn is not None:
            self._write_batch(txn, pending, total)
            return
        try:
            with self.env.write() as own:
                self._write_batch(own, pending, total)
        except Exception:
            self.errors += 1

    def _write_batch(self, txn: Any, pending: Counter[str], total: int) -> None:
        self._apply(txn, pending, total)
        self._flushes += 1
        if self._flushes % _PRUNE_EVERY == 0:
            self._prune(txn)

    def _apply(self, txn: Any, pending: Counter[str], total: int) -> None:
        stats_db, meta_db = self.env.db("stats"), self.env.db("meta")
        now = self._clock(txn) + total
        half_life = self.decay.half_life(txn.stat(stats_db)["entries"])
        for key, n in pending.items():
            raw = txn.get(key.encode(), db=stats_db)
            old, at = _ENTRY.unpack(raw) if raw is not None else (0.0, now)
            fresh = self.decay.apply(old, now - at, half_life) + n
            txn.put(key.encode(), _ENTRY.pack(fresh, now), db=stats_db)
        txn.put(_CLOCK_KEY, struct.pack("<d", now), db=meta_db)

    def _prune(self, txn: Any) -> None:
        stats_db = self.env.db("stats")
        now = self._clock(txn)
        half_life = self.decay.half_life(txn.stat(stats_db)["entries"])
        dead = [
            bytes(k)
            for k, v in txn.cursor(stats_db).iternext()
            if self.decay.apply(_ENTRY.unpack(v)[0], now - _ENTRY.unpack(v)[1], half_life) < _NEGLIGIBLE
        ]
        for key in dead:
            txn.delete(key, db=stats_db)

    def _clock(self, txn: Any) -> float:
        raw = txn.get(_CLOCK_KEY, db=self.env.db("meta"))
        return struct.unpack("<d", raw)[0] if raw is not None else 0.0

    def lookup(self, keys: Iterable[str], txn: Any = None) -> dict[str, AccessRecord]:
        if txn is None:
            with self.env.read() as own:
                return self.lookup(keys, own)
        stats_db = self.env.db("stats")
        self._forked()
        with self._lock:
            pending, pending_total = dict(self._pending), self._pending_total
        now = self._clock(txn) + pending_total
        half_life = self.decay.half_life(txn.stat(stats_db)["entries"])
        out = {}
        for key in keys:
            raw = txn.get(key.encode(), db=stats_db)
            count, at = _ENTRY.unpack(raw) if raw is not None else (0.0, -math.inf)
            frequency = self.decay.apply(count, now - at, half_life) if raw is not None else 0.0
            if key in pending:
                frequency, at = frequency + pending[key], now
            out[key] = AccessRecord(frequency, at)
        return out
