"""Letting go of the pages of a shared file mapping that this process has read.

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
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from typing import Any

__all__ = ["drop_mapping", "drop_view"]

_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)


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
    start = array.ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (start + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _madvise()(first, last - first, _DONTNEED)


@functools.cache
def _madvise() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
