"""The SSD tier: one LMDB environment per cache directory, shared by every process on a node.

The environment holds four named databases: ``data`` (object id → framed value, see
:mod:`cachetier._frame`), ``stats`` (decayed access frequencies, :mod:`cachetier.stats`),
``hints`` (announced read plans, :mod:`cachetier.hints`) and ``meta`` (the logical clock
and node-wide counters).

Thread and fork rules
---------------------
- **One handle per process, opened lazily.** :class:`SharedEnv` opens the environment on
  first use, not in its constructor, so an object built before a fork costs nothing.
- **Fork.** A child must not use its parent's handle, and LMDB refuses to open a path
  that is still open in the process. On first use in a new process :class:`SharedEnv`
  sees the pid changed, closes the inherited handle and opens its own (this is what
  makes forked DataLoader workers work). Do not fork while another thread of the parent
  is inside a transaction: reader slots live in shared memory.
- **Threads.** Threads share the handle; a transaction belongs to the thread that began
  it and a thread holds at most one at a time (so budget decisions read statistics
  through the write transaction they run in).
- **Short read transactions.** Every read opens a transaction, looks at one value and
  ends it. A long-lived reader pins every page freed after it began, and under
  evict/refill churn the file grew to 11x the live data when one was held (measured).
- **Zero-copy reads** (``buffers=True``): the value is a view into the map, valid only
  inside its transaction; :meth:`LmdbTier.read` hands it to a callback and copies only
  what the callback keeps.
- **map_size is fixed** when the environment is created (budget × (1 + headroom)) and
  recorded in ``tier.json``; every later process opens with that exact size, because
  resizing a map that other processes have open is a known corruption source. A larger
  budget later is capped to what the map allows; a smaller one is honoured.
- **Budget.** At every commit the pages in use by all four databases (branch, leaf and
  overflow pages, from ``txn.stat``) stay within the budget; the map size caps the file
  (pages in use plus freed pages that LMDB reuses). Eviction is a delete.
- **Readahead stays on**: with it off, cold reads of MB-sized values were ~19x slower.
- **Crashes.** A killed writer leaves nothing half-written (LMDB commits atomically and
  its robust write mutex recovers); reader slots of dead processes are cleared on open.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from cachetier._frame import HEADER_SIZE, frame_header, open_frame
from cachetier.errors import BadInputError, NotFoundError, StoreUnavailableError
from cachetier.hashing import BytesLike
from cachetier.metrics import TierCounters
from cachetier.store import ObjectInfo, Store

__all__ = ["LmdbTier", "Resident", "SharedEnv"]

T = TypeVar("T")

_DATABASES = ("data", "stats", "hints", "meta")
_LAYOUT_FILE = "tier.json"
_LAYOUT_VERSION = 1
_PAGE_HEADER = 16  # bytes at the start of an LMDB overflow page (64-bit builds)
_ROOM_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class Resident:
    """One value held by a tier: its key and the bytes it really takes there."""

    key: str
    size: int


#: Called inside the admitting write transaction with the bytes still missing and the
#: residents; returns the keys to evict, or None to give up on the admission.
Chooser = Callable[[int, list[Resident], "lmdb.Transaction"], "list[str] | None"]


class SharedEnv:
    """The node's LMDB environment under ``path``, opened lazily in each process."""

    def __init__(self, path: str | os.PathLike[str], *, map_size: int, readers: int = 512):
        self.path = Path(path).expanduser().absolute()
        self._requested_map_size = map_size
        self._readers = readers
        self._env: lmdb.Environment | None = None
        self._dbs: dict[str, object] = {}
        self._pid = -1
        self._lock = threading.Lock()
        self.map_size = 0
        self.page_size = 4096

    def open(self) -> lmdb.Environment:
        """Return this process's handle, opening (or reopening after a fork) as needed."""
        env = self._env
        if env is not None and self._pid == os.getpid():
            return env
        if self._pid != os.getpid():
            self._lock = threading.Lock()  # a lock copied by fork may be held by a vanished thread
        with self._lock:
            if self._env is not None and self._pid != os.getpid():
                self._env.close()  # inherited from the parent: close it before reopening the path
                self._env = None
            if self._env is None:
                self._env = self._open_here()
                self._pid = os.getpid()
            return self._env

    def db(self, name: str) -> object:
        """Return the handle of named database ``name`` (one of data, stats, hints, meta)."""
        self.open()
        return self._dbs[name]

    @contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A short read transaction; keep the block small (see the module rules)."""
        with self.open().begin(buffers=buffers) as txn:
            yield txn

    @contextmanager
    def write(self) -> Iterator[lmdb.Transaction]:
        """A write transaction: committed at the end of the block, aborted on an exception."""
        with self.open().begin(write=True) as txn:
            yield txn

    def used_bytes(self, txn: lmdb.Transaction) -> int:
        """Bytes of pages in use by every database, as seen by ``txn`` (free pages excluded)."""
        pages = 2  # the two meta pages
        for handle in (*self._dbs.values(), self._dbs["_main"]):
            st = txn.stat(handle)
            pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages * self.page_size

    def file_bytes(self) -> int:
        """Bytes the data file really occupies on disk."""
        try:
            return os.stat(self.path / "data.mdb").st_blocks * 512
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        """Close this process's handle (an inherited one is left to the parent)."""
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = None
        self._dbs = {}

    def _open_here(self) -> lmdb.Environment:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.map_size = self._layout()
            env = lmdb.open(
                str(self.path),
                map_size=self.map_size,
                max_dbs=len(_DATABASES) + 1,
                max_readers=self._readers,
                readahead=True,
                metasync=False,
                meminit=False,
            )
        except (OSError, lmdb.Error) as e:
            raise _unavailable(e, self.path) from e
        env.reader_check()  # clear reader slots left by killed processes
        self.page_size = env.stat()["psize"]
        dbs: dict[str, object] = {name: env.open_db(name.encode()) for name in _DATABASES}
        dbs["_main"] = env.open_db(None)
        self._dbs = dbs
        return env

    def _layout(self) -> int:
        """Read the map size fixed at creation, or fix it now (under a lock, once per node)."""
        layout = self.path / _LAYOUT_FILE
        with open(self.path / ".layout.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return int(json.loads(layout.read_text())["map_size"])
            except (FileNotFoundError, ValueError, KeyError):
                pass
            map_size = max(self._requested_map_size, 1 << 20)
            tmp = layout.with_suffix(f".tmp.{os.getpid()}")
            tmp.write_text(json.dumps({"version": _LAYOUT_VERSION, "map_size": map_size}))
            os.replace(tmp, layout)
            return map_size


class LmdbTier(Store):
    """Framed values by key in the ``data`` database, within ``budget`` bytes of pages."""

    def __init__(self, env: SharedEnv, *, budget: int, verify: bool = True):
        self.env = env
        self.requested_budget = budget
        self.verify = verify
        self.counters = TierCounters()
        self.url = f"lmdb://{env.path}"

    @property
    def budget(self) -> int:
        """The byte budget in force: the requested one, capped by the fixed map size."""
        self.env.open()
        return min(self.requested_budget, int(self.env.map_size / 1.1))

    # -- reads -------------------------------------------------------------------------

    def read(self, key: str, use: Callable[[memoryview], T]) -> T | None:
        """Call ``use`` on a zero-copy view of the value inside a short read transaction.

        Returns what ``use`` returned, or None when the key is absent or its value is
        damaged (a damaged value is deleted and counted as ``corrupt``). The view is
        invalid after ``use`` returns: copy what must outlive it.
        """
        db = self.env.db("data")
        with self.env.read(buffers=True) as txn:
            frame = txn.get(key.encode(), db=db)
            if frame is None:
                self.counters.misses += 1
                return None
            payload = open_frame(frame, verify=self.verify)
            if payload is not None:
                self.counters.hits += 1
                self.counters.bytes_read += payload.nbytes
                return use(payload)
        self.counters.corrupt += 1
        self.delete(key)
        return None

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        start, end = byte_range if byte_range is not None else (0, None)
        data = self.read(key, lambda view: bytes(view[start:end]))
        if data is None:
            raise NotFoundError("no such key", subject=f"{self.url}/{key}")
        return data

    def exists(self, key: str) -> bool:
        with self.env.read(buffers=True) as txn:
            return txn.get(key.encode(), db=self.env.db("data")) is not None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        entries = []
        with self.env.read(buffers=True) as txn:
            cursor = txn.cursor(self.env.db("data"))
            found = cursor.set_range(prefix.encode())
            while found:
                key = bytes(cursor.key()).decode()
                if not key.startswith(prefix):
                    break
                entries.append(ObjectInfo(key, len(cursor.value()) - HEADER_SIZE, 0.0))
                found = cursor.next()
        yield from entries

    def residents(self, txn: lmdb.Transaction | None = None) -> list[Resident]:
        """Every value held, with the bytes of pages it occupies."""
        if txn is None:
            with self.env.read(buffers=True) as own:
                return self.residents(own)
        cursor = txn.cursor(self.env.db("data"))
        return [Resident(bytes(k).decode(), self.footprint(len(v))) for k, v in cursor.iternext()]

    def footprint(self, frame_bytes: int) -> int:
        """Bytes of pages a frame of ``frame_bytes`` takes (overflow pages, or a leaf share)."""
        psize = self.env.page_size
        if frame_bytes + 64 > psize // 2:
            return math.ceil((frame_bytes + _PAGE_HEADER) / psize) * psize
        return frame_bytes + 64

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: BytesLike) -> None:
        """Store ``data``, evicting residents in key order if needed (TieredStore uses :meth:`admit`)."""
        if not self.admit(key, data):
            raise BadInputError(
                f"value of {memoryview(data).nbytes} bytes does not fit the {self.budget}-byte budget",
                subject=f"{self.url}/{key}",
            )

    def admit(self, key: str, data: BytesLike, choose: Chooser | None = None) -> bool:
        """Store ``data`` under ``key`` if it fits the budget once ``choose``'s victims are gone.

        ``choose(missing_bytes, residents, txn)`` returns the keys to evict or None to
        give up; without it, residents are evicted in key order. Returns True when the
        value is stored (or already was). Raises StoreUnavailableError when the disk
        refuses the write; the caller degrades to reading through.
        """
        payload = memoryview(data).cast("B")
        frame_bytes = HEADER_SIZE + payload.nbytes
        need = self.footprint(frame_bytes) + self.env.page_size  # one page for tree growth
        if need > self.budget:
            return False
        header = frame_header(payload)
        extra = 0
        for _ in range(_ROOM_ATTEMPTS):
            try:
                return self._admit_once(key, header, payload, need + extra, choose or _key_order)
            except lmdb.MapFullError:
                # Freed pages become reusable only a commit later: free more, then retry.
                self.counters.map_full += 1
                extra += need
            except _OverBudget as over:
                extra += over.by
            except (OSError, lmdb.Error) as e:
                self.counters.errors += 1
                raise _unavailable(e, self.env.path) from e
        return False

    def _admit_once(self, key: str, header: bytes, payload: memoryview, need: int, choose: Chooser) -> bool:
        data_db = self.env.db("data")
        budget = self.budget
        with self.env.write() as txn:
            bkey = key.encode()
            if txn.get(bkey, db=data_db) is not None:
                return True
            missing = self.env.used_bytes(txn) + need - budget
            if missing > 0:
                residents = self.residents(txn)
                victims = choose(missing, residents, txn)
                if victims is None:
                    self.counters.rejections += 1
                    return False
                for victim in victims:
                    if txn.delete(victim.encode(), db=data_db):
                        self.counters.evictions += 1
            txn.put(bkey, header + payload, db=data_db)
            over = self.env.used_bytes(txn) - budget
            if over > 0:
                raise _OverBudget(over)
        self.counters.admissions += 1
        self.counters.bytes_written += payload.nbytes
        return True

    def delete(self, key: str) -> None:
        with self.env.write() as txn:
            if txn.delete(key.encode(), db=self.env.db("data")):
                self.counters.evictions += 1

    def evict(self, keys: list[str]) -> int:
        """Delete ``keys`` in one transaction; return how many were present."""
        data_db = self.env.db("data")
        with self.env.write() as txn:
            removed = sum(bool(txn.delete(k.encode(), db=data_db)) for k in keys)
        self.counters.evictions += removed
        return removed

    def usage(self) -> dict[str, int]:
        """Bytes of pages in use, budget, entries, file bytes on disk and the map size."""
        with self.env.read() as txn:
            used = self.env.used_bytes(txn)
            entries = txn.stat(self.env.db("data"))["entries"]
        return {
            "bytes_used": used,
            "budget": self.budget,
            "entries": entries,
            "file_bytes": self.env.file_bytes(),
            "map_size": self.env.map_size,
        }

    def close(self) -> None:
        self.env.close()


class _OverBudget(Exception):
    def __init__(self, by: int):
        self.by = by


def _key_order(missing: int, residents: list[Resident], txn: object) -> list[str]:
    victims, freed = [], 0
    for r in residents:
        if freed >= missing:
            break
        victims.append(r.key)
        freed += r.size
    return victims


def _unavailable(err: BaseException, path: Path) -> StoreUnavailableError:
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT) or isinstance(err, lmdb.DiskError):
        why = "no space left on device"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied"
    else:
        why = f"cannot use the cache: {err}"
    return StoreUnavailableError(
        why, subject=str(path), hint="set --cache-dir / TIERDATA_CACHE_DIR; reads go to the object store"
    )
