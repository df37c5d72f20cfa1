"""Shared file mappings: letting go of the pages this process has read, and reading
ranges without mapping any.

Reading a value in place from a mapping (the LMDB map of the SSD tier, a RAM-tier file)
maps its pages into the process, and they count in its RSS for as long as the mapping
lives, even when they are never read again: a loader streaming a dataset through the
SSD tier would grow by every byte it read, and a DataLoader worker holding a decoded
shard by every page it has passed. ``MADV_DONTNEED`` on a *shared file* mapping only
unmaps the pages from this process: they stay in the kernel's page cache (or tmpfs) and
are mapped back, unchanged, on the next access (a minor fault).

On private or anonymous memory the same call throws the contents away, so these helpers
are for views of shared file mappings only, and do nothing where the platform has no
``MADV_DONTNEED``.

Unmapping has its own cost: about a microsecond per page here (page-table work and a
TLB flush on every core the process runs threads on), on top of the page faults that
mapped them. A :class:`FileMapping` also keeps its file open, so a reader that copies
ranges out anyway (rows into a batch) can ``pread`` them instead (:meth:`FileMapping.read_into`):
no page is mapped, faulted in or unmapped.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import weakref
from typing import Any

__all__ = ["FileMapping", "drop_mapping", "drop_range", "drop_view", "mapped_range"]

_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)


class FileMapping(mmap.mmap):
    """A read-only shared mapping of the start of a file that also keeps the file open,
    so its ranges can be copied out with ``pread`` (:meth:`read_into`) as well as read in
    place. Made by :meth:`open`; the file is closed with the mapping (or when collected)."""

    fd: int
    _closer: weakref.finalize

    @classmethod
    def open(cls, fd: int, size: int) -> FileMapping:
        """Map the first ``size`` (> 0) bytes of the open file ``fd``, read-only, keeping a
        duplicate of ``fd`` (the caller still owns and closes its own)."""
        mapping = cls(fd, size, access=mmap.ACCESS_READ)
        mapping.fd = os.dup(fd)
        mapping._closer = weakref.finalize(mapping, os.close, mapping.fd)
        return mapping

    def close(self) -> None:
        """Unmap, then close the file (BufferError, and both kept, while views are alive)."""
        super().close()
        self._closer()

    def read_into(self, offset: int, out: memoryview) -> None:
        """Copy the file's bytes ``[offset, offset + out.nbytes)`` into ``out`` (a writable
        byte view), without mapping them; OSError if the file is shorter (it was cut)."""
        done, size = 0, out.nbytes
        while done < size:
            got = os.preadv(self.fd, [out[done:]], offset + done)
            if got <= 0:
                raise OSError(errno.EIO, f"file ends {offset + done - len(self)} bytes into its mapping")
            done += got


def drop_mapping(mapping: mmap.mmap) -> None:
    """Unmap every resident page of ``mapping`` (a shared file mapping) from this process.

    The data stays readable; a closed mapping is left alone.
    """
    if _DONTNEED is None or mapping.closed:
        return
    try:
        mapping.madvise(_DONTNEED)
    except (ValueError, OSError):  # closed meanwhile, or refused: only memory is at stake
        pass


def drop_view(view: Any) -> None:
    """Unmap the whole pages inside buffer ``view`` from this process.

    ``view`` must lie in a shared file mapping (see the module docstring); the pages at
    its two ends that it shares with neighbouring data are kept.
    """
    if _DONTNEED is None:
        return
    import numpy as np  # only here: the CLI's start-up does not need numpy

    array = np.frombuffer(view, dtype=np.uint8)
    drop_range(array.ctypes.data, array.nbytes)


def drop_range(address: int, nbytes: int) -> None:
    """Unmap the whole pages inside ``nbytes`` bytes from ``address`` from this process.

    The range must lie in shared file mappings (see the module docstring); the pages at
    its two ends that it shares with neighbouring data are kept.
    """
    if _DONTNEED is None:
        return
    first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (address + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _madvise()(first, last - first, _DONTNEED)


def mapped_range(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """The addresses ``(start, end)`` of this process's one mapping of file ``path`` (from
    ``/proc/self/maps``), or None when it has none, several, or the platform says nothing."""
    target = os.fsdecode(os.path.abspath(path))
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    found.append((start, end))
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


@functools.cache
def _madvise() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
