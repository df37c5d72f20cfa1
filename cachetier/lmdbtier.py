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
  makes forked DataLoader workers work). Forking while another thread is inside a
  transaction breaks the child (reader slots live in shared memory): every transaction
  passes a gate that ``fork()`` closes (``os.register_at_fork``), so a fork waits for
  transactions in flight, which are short, and new ones wait for the fork.
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
import logging
import math
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lmdb

from cachetier._frame import HEADER_SIZE, frame_header, open_frame, payload_matches
from cachetier.errors import BadInputError, NotFoundError, StoreUnavailableError
from cachetier.hashing import BytesLike
from cachetier.metrics import TierCounters
from cachetier.pages import drop_range, drop_view, mapped_range
from cachetier.store import ObjectInfo, Store

__all__ = ["LmdbTier", "Resident", "SharedEnv"]

log = logging.getLogger(__name__)

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


@dataclass
class _Handle:
    """One process's open environment for one path, shared by every SharedEnv on that path."""

    env: lmdb.Environment
    dbs: dict[str, object]
    pid: int
    map_size: int
    budget_cap: int
    page_size: int
    users: int = 0
    #: where the data file is mapped (None: unknown), for letting go of its pages
    mapped: tuple[int, int] | None = None


# LMDB allows one open handle per path per process, so handles are shared by path. The
# registry is process state by nature: entries of another pid were inherited via fork.
_HANDLES: dict[Path, _Handle] = {}
_REGISTRY_LOCK = [threading.Lock(), os.getpid()]


class _ForkGate:
    """Transactions pass the gate shared; ``fork()`` waits for them to end and holds it.

    Forking while another thread is inside an LMDB transaction leaves the child with a
    reader slot and library state in mid-update (a child then hung reopening the
    environment, or found it "already open"). Registered with ``os.register_at_fork``
    on first use; a thread that forks from inside its own transaction is not waited for,
    and the wait is bounded by ``timeout`` seconds.
    """

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self._cond = threading.Condition()
        self._active = 0
        self._forking = False
        self._own = threading.local()

    def enter(self) -> None:
        depth = getattr(self._own, "depth", 0)
        with self._cond:
            while self._forking and not depth:
                self._cond.wait()
            self._active += 1
        self._own.depth = depth + 1

    def leave(self) -> None:
        self._own.depth -= 1
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()
        self._forking = True
        deadline = time.monotonic() + self.timeout
        while self._active > getattr(self._own, "depth", 0) and deadline > time.monotonic():
            self._cond.wait(deadline - time.monotonic())

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        self.__init__(self.timeout)  # the parent's other threads do not exist here


_GATE = _ForkGate()
_GATE_HOOKED = [False]


def _hook_fork_gate() -> None:
    if not _GATE_HOOKED[0]:
        _GATE_HOOKED[0] = True
        os.register_at_fork(
            before=_GATE.before_fork,
            after_in_parent=_GATE.after_fork_in_parent,
            after_in_child=_GATE.after_fork_in_child,
        )


def _registry_lock() -> threading.Lock:
    if _REGISTRY_LOCK[1] != os.getpid():  # copied by fork, maybe held by a vanished thread
        _REGISTRY_LOCK[:] = [threading.Lock(), os.getpid()]
    return _REGISTRY_LOCK[0]  # type: ignore[return-value]


class SharedEnv:
    """The node's LMDB environment under ``path``, opened lazily in each process.

    Every SharedEnv on one path in one process uses the same LMDB handle. ``map_size``
    and ``budget`` apply only when this call creates the environment; later processes
    use the values recorded in ``tier.json``.
    """

    def __init__(self, path: str | os.PathLike[str], *, map_size: int, budget: int, readers: int = 512):
        self.path = Path(path).expanduser().absolute()
        self._requested_map_size = map_size
        self._requested_budget = budget
        self._readers = readers
        self._handle: _Handle | None = None

    def _current(self) -> _Handle:
        handle = self._handle
        if handle is not None and handle.pid == os.getpid() and _HANDLES.get(self.path) is handle:
            return handle
        _hook_fork_gate()
        with _registry_lock():
            handle = _HANDLES.get(self.path)
            if handle is not None and handle.pid != os.getpid():
                handle.env.close()  # inherited from the parent: LMDB cannot reopen the path until closed
                handle = None
            if handle is None:
                handle = self._open_here()
                _HANDLES[self.path] = handle
            if self._handle is not handle:
                handle.users += 1
                self._handle = handle
            return handle

    def open(self) -> lmdb.Environment:
        """Return this process's handle, opening (or reopening after a fork) as needed."""
        return self._current().env

    @property
    def map_size(self) -> int:
        """The map size fixed when the environment was created."""
        return self._current().map_size

    @property
    def budget_cap(self) -> int:
        """The SSD budget the map was sized for (a larger request is capped to it)."""
        return self._current().budget_cap

    @property
    def page_size(self) -> int:
        """LMDB's page size."""
        return self._current().page_size

    def db(self, name: str) -> object:
        """Return the handle of named database ``name`` (one of data, stats, hints, meta)."""
        return self._current().dbs[name]

    @contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A short read transaction; keep the block small (see the module rules)."""
        _GATE.enter()
        try:
            with self.open().begin(buffers=buffers) as txn:
                yield txn
        finally:
            _GATE.leave()

    @contextmanager
    def write(self) -> Iterator[lmdb.Transaction]:
        """A write transaction: committed at the end of the block, aborted on an exception.

        First frees the reader slots of processes that died inside a read transaction
        (``kill -9``): such a slot pins the pages it saw, so until it is freed no write
        on the node can reuse them and the map fills up.
        """
        _GATE.enter()
        try:
            handle = self._current()
            handle.env.reader_check()
            try:
                with handle.env.begin(write=True) as txn:
                    yield txn
            finally:
                # the pages the transaction looked at (the file is on disk: a fault maps a
                # whole large folio) stay in this process's RSS otherwise: a DataLoader
                # worker recording its reads held about 0.5 MB of them
                if handle.mapped is not None:
                    drop_range(handle.mapped[0], handle.mapped[1] - handle.mapped[0])
        finally:
            _GATE.leave()

    def used_bytes(self, txn: lmdb.Transaction) -> int:
        """Bytes of pages in use by every database, as seen by ``txn`` (free pages excluded)."""
        handle = self._current()
        pages = 2  # the two meta pages
        for db in handle.dbs.values():  # the four named databases and the main one
            st = txn.stat(db)
            pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages * handle.page_size

    def file_bytes(self) -> int:
        """Bytes the data file really occupies on disk."""
        try:
            return os.stat(self.path / "data.mdb").st_blocks * 512
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        """Release this object's use of the handle; the last user in the process closes it."""
        handle, self._handle = self._handle, None
        if handle is None or handle.pid != os.getpid():
            return
        with _registry_lock():
            handle.users -= 1
            if handle.users <= 0 and _HANDLES.get(self.path) is handle:
                del _HANDLES[self.path]
                handle.env.close()

    def _open_here(self) -> _Handle:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            map_size, budget_cap, fresh = self._layout()
            try:
                env = self._open_env(map_size)
            except lmdb.Error as e:
                if fresh and _out_of_memory(e):
                    self._forget_layout(map_size)  # a size this node cannot map is not kept
                raise
            cut = self._cut_short(env)
            if cut is not None:  # pages past the end of the file: reading one would SIGBUS
                env.close()
                self._discard_cut_file(cut)
                env = self._open_env(map_size)
            env.reader_check()  # clear reader slots left by killed processes
            dbs: dict[str, object] = {name: env.open_db(name.encode()) for name in _DATABASES}
            dbs["_main"] = env.open_db(None)
        except (OSError, lmdb.Error) as e:
            raise _unavailable(e, self.path) from e
        mapped = mapped_range(self.path / "data.mdb")
        return _Handle(env, dbs, os.getpid(), map_size, budget_cap, env.stat()["psize"], mapped=mapped)

    def _open_env(self, map_size: int) -> lmdb.Environment:
        return lmdb.open(
            str(self.path),
            map_size=map_size,
            max_dbs=len(_DATABASES) + 1,
            max_readers=self._readers,
            readahead=True,
            metasync=False,
            meminit=False,
        )

    def _cut_short(self, env: lmdb.Environment) -> int | None:
        """The data file's inode if it is shorter than the pages its last commit uses (a
        truncated file), else None. LMDB writes pages before the commit that counts them,
        so a whole file is never shorter."""
        data = os.stat(self.path / "data.mdb")
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        return data.st_ino if data.st_size < needed else None

    def _discard_cut_file(self, inode: int) -> None:
        """Delete the truncated data file (and its lock file), unless another process on
        the node replaced it already: the cache is a copy, refilled from the object store."""
        with self._layout_lock():
            data = self.path / "data.mdb"
            try:
                if os.stat(data).st_ino != inode:
                    return
            except FileNotFoundError:
                return
            log.warning("cache %s: data.mdb is truncated; starting it again empty", self.path)
            data.unlink()
            (self.path / "lock.mdb").unlink(missing_ok=True)

    @contextmanager
    def _layout_lock(self) -> Iterator[None]:
        with open(self.path / ".layout.lock", "a+b") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)  # a record lock: never inherited by a forked child
            yield

    def _layout(self) -> tuple[int, int, bool]:
        """The map size and budget fixed at creation, or fixed now (once per node); and
        whether this call fixed them."""
        layout = self.path / _LAYOUT_FILE
        with self._layout_lock():
            try:
                fixed = json.loads(layout.read_text())
                return int(fixed["map_size"]), int(fixed["budget_cap"]), False
            except (FileNotFoundError, ValueError, KeyError):
                pass
            map_size = max(self._requested_map_size, 1 << 20)
            budget_cap = self._requested_budget
            tmp = layout.with_suffix(f".tmp.{os.getpid()}")
            fixed = {"version": _LAYOUT_VERSION, "map_size": map_size, "budget_cap": budget_cap}
            tmp.write_text(json.dumps(fixed))
            os.replace(tmp, layout)
            return map_size, budget_cap, True

    def _forget_layout(self, map_size: int) -> None:
        """Remove the layout this process fixed, if it still says ``map_size``."""
        layout = self.path / _LAYOUT_FILE
        with self._layout_lock():
            try:
                if int(json.loads(layout.read_text())["map_size"]) == map_size:
                    layout.unlink()
            except (FileNotFoundError, ValueError, KeyError):
                pass


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
        """The byte budget in force: the requested one, capped by the budget the map was sized for."""
        self.env.open()
        return min(self.requested_budget, self.env.budget_cap)

    # -- reads -------------------------------------------------------------------------

    def read(self, key: str, use: Callable[[memoryview], T]) -> T | None:
        """Call ``use`` on a zero-copy view of the value inside a short read transaction.

        Returns what ``use`` returned, or None when the key is absent or its value is
        damaged (a damaged value is deleted and counted as ``corrupt``). The view is
        invalid after ``use`` returns: copy what must outlive it. Hits and misses are
        counted by the caller, which knows what a read means to it.
        """
        db = self.env.db("data")
        with self.env.read(buffers=True) as txn:
            frame = txn.get(key.encode(), db=db)
            if frame is None:
                return None
            payload = open_frame(frame, verify=self.verify)
            if payload is not None:
                try:
                    return use(payload)
                finally:
                    drop_view(frame)  # read once: the value's pages need not stay in our RSS
        self.counters.corrupt += 1
        self.delete(key)
        return None

    def read_bytes(self, key: str) -> bytes | None:
        """Return a copy of the value, or None when absent or damaged (then deleted).

        The copy is taken first and checked after the transaction ends: the read
        transaction is shorter, and checking the fresh copy is faster than checking
        the mapped pages and then copying them (measured ~15% on 4 MiB values).
        """
        with self.env.read(buffers=True) as txn:
            frame = txn.get(key.encode(), db=self.env.db("data"))
            if frame is None:
                return None
            header, payload = bytes(frame[:HEADER_SIZE]), bytes(frame[HEADER_SIZE:])
            drop_view(frame)
        if not self.verify or payload_matches(header, payload):
            return payload
        self.counters.corrupt += 1
        self.delete(key)
        return None

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        data = self.read_bytes(key)
        if data is None:
            raise NotFoundError("no such key", subject=f"{self.url}/{key}")
        return data if byte_range is None else data[byte_range[0] : byte_range[1]]

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
        """Store (or replace) ``data``, evicting residents in key order if needed.

        TieredStore uses :meth:`admit`, which lets its policy choose.
        """
        if not self.admit(key, data, replace=True):
            raise BadInputError(
                f"value of {memoryview(data).nbytes} bytes does not fit the {self.budget}-byte budget",
                subject=f"{self.url}/{key}",
            )

    def admit(
        self, key: str, data: BytesLike, choose: Chooser | None = None, *, replace: bool = False
    ) -> bool:
        """Store ``data`` under ``key`` if it fits the budget once ``choose``'s victims are gone.

        ``choose(missing_bytes, residents, txn)`` returns the keys to evict or None to
        give up; without it, residents are evicted in key order. Returns True when the
        value is stored (or already was: values are immutable unless ``replace``).
        Raises StoreUnavailableError when the disk refuses the write; the caller degrades
        to reading through.
        """
        payload = memoryview(data).cast("B")
        frame_bytes = HEADER_SIZE + payload.nbytes
        need = self.footprint(frame_bytes) + self.env.page_size  # one page for tree growth
        if need > self.budget:
            return False
        extra = 0
        choose = choose or _key_order
        for attempt in range(_ROOM_ATTEMPTS):
            try:
                return self._admit_once(key, payload, need + extra, choose, replace)
            except lmdb.MapFullError:
                # The map holds no free run of pages long enough: pages freed by the
                # admission's own evictions are reusable only two commits later (and never
                # while a reader still sees them), and freed runs fragment. So evict first,
                # in a commit of its own (more on each attempt), let one more commit pass,
                # and retry.
                self.counters.map_full += 1
                try:
                    if not self._evict_ahead(need, attempt * need, choose):
                        self.counters.rejections += 1
                        return False
                    self._tick()
                except (OSError, lmdb.Error) as e:
                    self.counters.errors += 1
                    raise _unavailable(e, self.env.path) from e
            except _OverBudget as over:
                extra += over.by
            except (OSError, lmdb.Error) as e:
                self.counters.errors += 1
                raise _unavailable(e, self.env.path) from e
        return False

    def _admit_once(self, key: str, payload: memoryview, need: int, choose: Chooser, replace: bool) -> bool:
        bkey = key.encode()
        # Decide in a read transaction first: a refusal then costs no write lock and no commit.
        with self.env.read(buffers=True) as txn:
            if not replace and txn.get(bkey, db=self.env.db("data")) is not None:
                return True
            if not replace and self._victims(txn, need, choose) is None:
                self.counters.rejections += 1
                return False
        with self.env.write() as txn:
            data_db = self.env.db("data")
            if txn.get(bkey, db=data_db) is not None:
                if not replace:
                    return True
                txn.delete(bkey, db=data_db)
            victims = self._victims(txn, need, choose)
            if victims is None:
                self.counters.rejections += 1
                return False
            for victim in victims:
                if txn.delete(victim.encode(), db=data_db):
                    self.counters.evictions += 1
            txn.put(bkey, frame_header(payload) + payload, db=data_db)  # checksum only once admitted
            over = self.env.used_bytes(txn) - self.budget
            if over > 0:
                raise _OverBudget(over)
        self.counters.admissions += 1
        self.counters.bytes_written += payload.nbytes
        return True

    def _evict_ahead(self, need: int, spare: int, choose: Chooser) -> bool:
        """Evict, in a commit of its own, so ``need`` + ``spare`` bytes fit; False if refused."""
        data_db = self.env.db("data")
        with self.env.write() as txn:
            missing = self.env.used_bytes(txn) + need + spare - self.budget
            victims = choose(missing, self.residents(txn), txn) if missing > 0 else []
            if victims is None:
                return False
            for victim in victims:
                if txn.delete(victim.encode(), db=data_db):
                    self.counters.evictions += 1
        return True

    def _tick(self) -> None:
        """Commit a one-page transaction, so pages freed by the last commit become reusable."""
        with self.env.write() as txn:
            txn.put(b"tick", struct.pack("<d", time.time()), db=self.env.db("meta"))

    def _victims(self, txn: lmdb.Transaction, need: int, choose: Chooser) -> list[str] | None:
        missing = self.env.used_bytes(txn) + need - self.budget
        if missing <= 0:
            return []
        return choose(missing, self.residents(txn), txn)

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


def _out_of_memory(err: BaseException) -> bool:
    """Whether opening failed because the map could not be reserved (a size too big here)."""
    return isinstance(err, lmdb.MemoryError) or getattr(err, "errno", None) == errno.ENOMEM


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
