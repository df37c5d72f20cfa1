"""The RAM tier: values as files on tmpfs, memory-mapped, shared by every process on a node.

Layout under ``root`` (by default a folder in ``/dev/shm``)::

    .lock                   locked (lockf) while admitting or evicting, never to read
    v/<quoted key>          one framed value (see cachetier._frame); keys are percent-quoted,
                            so ``<oid>`` and ``<oid>:decoded`` (a decoded shard) live side by side
    v/.tmp.<pid>.<random>   a value being written

Rules
-----
- **Reads take no lock and copy nothing**: open, ``mmap``, check the frame, return a
  ``memoryview`` of the map. The view stays valid after the value is evicted (the file
  is unlinked; its pages go when the last view is dropped).
- **Checks**: a file is written once and renamed into place, never modified, so a
  process verifies the checksum of a value the first time it maps it (unless it wrote
  it) and again whenever the file's identity (inode, mtime, size) changes; the frame's
  magic and length are checked on every hit. A hit then costs a stat and a map, whatever
  its size. The check unmaps the pages it read as it goes (:mod:`cachetier.pages`).
- **Writes** hold the lock: count the bytes really allocated (``st_blocks`` of every
  file, temp files included, i.e. what tmpfs holds), evict what the chooser names until
  the new value fits the budget, write a temp file and rename it into place. Readers
  see the whole value or nothing.
- **Written in place**: :meth:`RamTier.write_pending` lets a producer (a shard decoder)
  write a value straight into a temp file, hashed as it goes, so the value never sits
  in the producer's memory; :meth:`RamTier.admit_pending` then applies the budget as
  above and renames the file into place, or unlinks it. The producer reads the value
  from its mapping either way (a refused value lives until that mapping is dropped).
- **Crashes**: ``kill -9`` releases the lock (the kernel drops locks of dead processes)
  and can leave a temp file, which the next admission (or :meth:`RamTier.open`) deletes
  once its pid is gone. Nothing half-written is ever visible under a key.
- **Budget**: allocated bytes never exceed it after an admission. Views that readers
  still hold on evicted values are outside the count, like the kernel's page cache.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import xxhash

from cachetier._frame import HEADER_SIZE, frame_header, frame_header_of, open_frame
from cachetier._proc import process_alive
from cachetier.errors import BadInputError, NotFoundError, StoreUnavailableError
from cachetier.flight import lock_record
from cachetier.hashing import BytesLike
from cachetier.lmdbtier import Chooser, Resident
from cachetier.metrics import TierCounters
from cachetier.pages import FileMapping, drop_view
from cachetier.ramowner import claim, default_name_prefix, sweep_orphans
from cachetier.store import ObjectInfo, Store

__all__ = ["PendingValue", "RamTier"]

_BLOCK = 4096
_TEMP = ".tmp."
_VERIFIED_MAX = 4096


class RamTier(Store):
    """Framed values as memory-mapped files under ``root``, within ``budget`` allocated bytes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        budget: int,
        verify: bool = True,
        owner: str | os.PathLike[str] | None = None,
    ):
        """``owner``: the cache folder a default ``/dev/shm`` folder belongs to; opening
        records it there and removes the default folders whose cache folder is gone
        (:mod:`cachetier.ramowner`)."""
        self.root = Path(root).expanduser().absolute()
        self.owner = Path(owner) if owner is not None else None
        self.values = self.root / "v"
        self.budget = budget
        self.verify = verify
        self.counters = TierCounters()
        self.url = self.root.as_uri()
        self._opened = False
        self._verified: dict[str, tuple[int, int, int]] = {}
        self._pid = os.getpid()
        self._thread_lock = threading.Lock()

    def open(self) -> None:
        """Create the folders if needed and remove temp files of dead processes (and, with
        an ``owner``, the default folders of caches that no longer exist). Once opened, a
        call does nothing unless the folder has gone (deleted under a running job): then
        it is made again, so the tier heals at its next health check."""
        if self._opened and self.values.is_dir():
            return
        try:
            self.values.mkdir(parents=True, exist_ok=True)
            if self.owner is not None and self.root.name.startswith(default_name_prefix()):
                self._housekeep(self.owner)
            with self._locked():
                self._scan(clean=True)
        except OSError as e:
            raise _unavailable(e, self.root) from e
        self._opened = True

    def _housekeep(self, owner: Path) -> None:
        """Record ``owner`` and remove the default folders of deleted caches. Where the
        cache folder cannot be made (under a file, read-only), the RAM tier is not used
        either: its folder is removed (no process uses an unclaimed one) and OSError
        raised, since an unclaimed folder would hold tmpfs until the node restarts."""
        try:
            claim(self.root, owner)
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)
            raise
        sweep_orphans(self.root.parent, keep=self.root)

    # -- reads -------------------------------------------------------------------------

    def view(self, key: str) -> memoryview | None:
        """Return a zero-copy, read-only view of the value, or None if absent or damaged.

        A damaged value is deleted and counted as ``corrupt``; hits and misses are
        counted by the caller.
        """
        path = self.values / _name(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            st = os.fstat(fd)
            mapped = FileMapping.open(fd, st.st_size) if st.st_size else None
        finally:
            os.close(fd)
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._verified.get(path.name) == identity
        check = self.verify and not known
        # the check reads every page: each step is unmapped once hashed (see cachetier.pages)
        payload = open_frame(mapped, verify=check, release=drop_view) if mapped is not None else None
        if payload is None:
            self.counters.corrupt += 1
            self._drop_if_same(path, st.st_ino)
            return None
        if check:
            self._remember_checked(path.name, identity)
        return payload

    def _remember_checked(self, name: str, identity: tuple[int, int, int]) -> None:
        if len(self._verified) >= _VERIFIED_MAX:
            self._verified.clear()
        self._verified[name] = identity

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        view = self.view(key)
        if view is None:
            raise NotFoundError("no such key", subject=f"{self.url}/{key}")
        start, end = byte_range if byte_range is not None else (0, None)
        return bytes(view[start:end])

    def exists(self, key: str) -> bool:
        return (self.values / _name(key)).is_file()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        try:
            entries = list(os.scandir(self.values))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            key = unquote(entry.name)
            if key.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                yield ObjectInfo(key, max(st.st_size - HEADER_SIZE, 0), st.st_mtime)

    def residents(self) -> list[Resident]:
        """Every value held, with the bytes tmpfs allocated for it."""
        return [Resident(unquote(n), size) for n, size in self._scan(clean=False).items() if n[0] != "."]

    def usage(self) -> dict[str, int]:
        """Allocated bytes (temp files included), budget and entries."""
        sizes = self._scan(clean=False)
        return {
            "bytes_used": sum(sizes.values()),
            "budget": self.budget,
            "entries": sum(1 for n in sizes if n[0] != "."),
        }

    # -- writes ------------------------------------------------------------------------

    def put(self, key: str, data: BytesLike) -> None:
        """Store (or replace) ``data``, evicting residents in listing order if needed.

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
        """Store ``data`` if it fits the budget once ``choose``'s victims are gone.

        ``choose(missing_bytes, residents, None)`` returns keys to evict or None to give
        up; without it, residents are evicted in listing order. Returns True when the
        value is stored (or already was: values are immutable unless ``replace``);
        raises StoreUnavailableError when tmpfs is full or unwritable.
        """
        payload = memoryview(data).cast("B")
        need = _blocks(HEADER_SIZE + payload.nbytes)
        if need > self.budget:
            return False
        self.open()
        name = _name(key)
        try:
            with self._locked():
                sizes = self._scan(clean=True)
                if name in sizes and not replace:
                    return True  # (a replaced value counts until the rename frees it)
                missing = sum(sizes.values()) + need - self.budget
                if missing > 0 and not self._make_room(missing, sizes, choose):
                    self.counters.rejections += 1
                    return False
                self._write(name, frame_header(payload), payload)
        except OSError as e:
            raise self._failed(e) from e
        self.counters.admissions += 1
        self.counters.bytes_written += payload.nbytes
        return True

    def write_pending(self, write: Callable[[Any], None]) -> PendingValue:
        """Run ``write(sink)`` into a new temp file of this tier and return the value, pending.

        ``sink`` is a write-only file object (``write``, ``tell``, ``flush``), what Arrow's
        writers take; the value goes to tmpfs as it is written and is hashed on the way,
        so it never passes through this process's memory. The budget applies when the
        value is admitted (:meth:`admit_pending`); until then its temp file counts toward
        what other admissions see. An error of ``write`` propagates as it is; an error of
        tmpfs (full, unwritable) raises StoreUnavailableError. Nothing is left behind on
        failure.
        """
        self.open()
        tmp = self.values / f"{_TEMP}{os.getpid()}.{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._failed(e) from e
        try:
            sink = _FrameSink(fd)
            try:
                write(sink)
            except Exception:
                if sink.error is None:  # the producer's own error
                    raise
                raise self._failed(sink.error) from sink.error
            try:
                os.pwrite(fd, frame_header_of(sink.length, sink.digest()), 0)
                st = os.fstat(fd)
                mapped = FileMapping.open(fd, st.st_size)
            except OSError as e:
                raise self._failed(e) from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return PendingValue(tmp, memoryview(mapped)[HEADER_SIZE:], (st.st_ino, st.st_mtime_ns, st.st_size))

    def admit_pending(self, key: str, pending: PendingValue, choose: Chooser | None = None) -> bool:
        """Rename ``pending`` into place under ``key`` if it fits the budget once
        ``choose``'s victims are gone (as :meth:`admit`), else unlink it; True when the
        key holds the value (or already held one). ``pending.view`` stays valid either way."""
        name = _name(key)
        temp = pending.path
        if temp is None:
            raise BadInputError("the pending value was admitted or discarded already", subject=key)
        try:
            with self._locked():
                sizes = self._scan(clean=True)
                if name in sizes:
                    pending.discard()
                    return True
                if sizes.get(temp.name, 0) > self.budget:
                    pending.discard()
                    return False
                missing = sum(sizes.values()) - self.budget
                if missing > 0 and not self._make_room(missing, sizes, choose):
                    self.counters.rejections += 1
                    pending.discard()
                    return False
                os.rename(temp, self.values / name)
                pending.placed()
        except OSError as e:
            pending.discard()
            raise self._failed(e) from e
        if self.verify:  # hashed as it was written: this process need not check it again
            self._remember_checked(name, pending.identity)
        self.counters.admissions += 1
        self.counters.bytes_written += pending.view.nbytes
        return True

    def _failed(self, err: OSError) -> StoreUnavailableError:
        """Count a failed write of tmpfs; the error to raise for it."""
        self.counters.errors += 1
        return _unavailable(err, self.root)

    def _make_room(self, missing: int, sizes: dict[str, int], choose: Chooser | None) -> bool:
        residents = [Resident(unquote(n), size) for n, size in sizes.items() if n[0] != "."]
        if choose is None:
            victims, freed = [], 0
            for r in residents:
                if freed >= missing:
                    break
                victims.append(r.key)
                freed += r.size
        else:
            victims = choose(missing, residents, None)
            if victims is None:
                return False
        for victim in victims:
            missing -= sizes.get(_name(victim), 0)
            self._unlink(self.values / _name(victim))
        return missing <= 0

    def _write(self, name: str, header: bytes, payload: memoryview) -> None:
        tmp = self.values / f"{_TEMP}{os.getpid()}.{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.posix_fallocate(fd, 0, len(header) + payload.nbytes)
                os.pwrite(fd, header, 0)
                written = 0
                while written < payload.nbytes:
                    written += os.pwrite(fd, payload[written:], len(header) + written)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            os.rename(tmp, self.values / name)
            if self.verify:  # written from memory here: this process need not check it again
                self._remember_checked(name, (st.st_ino, st.st_mtime_ns, st.st_size))
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def delete(self, key: str) -> None:
        self._unlink(self.values / _name(key))

    def evict(self, keys: list[str]) -> int:
        """Delete ``keys``; return how many were present."""
        return sum(self._unlink(self.values / _name(k)) for k in keys)

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return False
        self.counters.evictions += 1
        return True

    def _drop_if_same(self, path: Path, inode: int) -> None:
        """Delete a damaged value unless a writer already replaced it."""
        try:
            if os.stat(path).st_ino == inode:
                self._unlink(path)
        except FileNotFoundError:
            pass

    def _scan(self, *, clean: bool) -> dict[str, int]:
        """Allocated bytes by file name; with ``clean``, delete temp files of dead processes."""
        sizes: dict[str, int] = {}
        try:
            entries = list(os.scandir(self.values))
        except FileNotFoundError:
            return sizes
        for entry in entries:
            if clean and entry.name.startswith(_TEMP) and not _owner_alive(entry.name):
                Path(entry.path).unlink(missing_ok=True)
                continue
            try:
                sizes[entry.name] = entry.stat().st_blocks * 512
            except FileNotFoundError:
                continue
        return sizes

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive against every thread and process on the node.

        A POSIX record lock (``lockf``), not ``flock``: a child forked while a thread
        holds the lock does not inherit it (an inherited ``flock`` descriptor would keep
        the lock held until the child exited). Record locks are per process, so a
        thread lock orders this process's threads.
        """
        if self._pid != os.getpid():  # a thread lock copied by fork may be held by a vanished thread
            self._pid, self._thread_lock = os.getpid(), threading.Lock()
        with self._thread_lock:
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                lock_record(fd)
                yield
            finally:
                os.close(fd)


class PendingValue:
    """A value written to a temp file of a :class:`RamTier` and not yet under a key.

    ``view`` is its payload, read-only, mapped from the file. :meth:`RamTier.admit_pending`
    renames the file into place or unlinks it; :meth:`discard` (or dropping the object)
    unlinks a file still pending, so no path leaves a temp file behind for long.
    """

    def __init__(self, path: Path, view: memoryview, identity: tuple[int, int, int]):
        self.path: Path | None = path
        self.view = view.toreadonly()
        self.identity = identity
        self._cleanup = weakref.finalize(self, _unlink_quietly, path, os.getpid())

    @property
    def nbytes(self) -> int:
        """The payload's size."""
        return self.view.nbytes

    def placed(self) -> None:
        """The file is under its key now: nothing to clean up."""
        self.path = None
        self._cleanup.detach()

    def discard(self) -> None:
        """Unlink the temp file if it is still pending (the view stays valid)."""
        self.path = None
        self._cleanup()


class _FrameSink:
    """A write-only file over ``fd`` that fills a frame's payload and hashes it on the way."""

    closed = False

    def __init__(self, fd: int):
        self._fd = fd
        self._hash = xxhash.xxh3_128()
        self.length = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        try:
            while done < view.nbytes:
                done += os.pwrite(self._fd, view[done:], HEADER_SIZE + self.length + done)
        except OSError as e:
            self.error = e
            raise
        self._hash.update(view)
        self.length += view.nbytes
        return view.nbytes

    def digest(self) -> bytes:
        return self._hash.digest()

    def tell(self) -> int:
        return self.length

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def _unlink_quietly(path: Path, owner: int) -> None:
    if os.getpid() != owner:  # a forked child exiting must not take its parent's pending file
        return
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _name(key: str) -> str:
    name = quote(key, safe="")
    return "%2E" + name[1:] if name.startswith(".") else name


def _blocks(nbytes: int) -> int:
    return -(-nbytes // _BLOCK) * _BLOCK


def _owner_alive(temp_name: str) -> bool:
    try:
        pid = int(temp_name[len(_TEMP) :].split(".")[0])
    except ValueError:
        return False
    return pid == os.getpid() or process_alive(pid)


def _unavailable(err: OSError, path: Path) -> StoreUnavailableError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "no space left on the RAM tier's filesystem"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied"
    else:
        why = f"cannot use the RAM tier: {err}"
    return StoreUnavailableError(why, subject=str(path), hint="set ram_bytes=0 or another ram_dir")
