"""Default RAM tier folders know their cache, so the ones whose cache is gone are removed.

A cache whose ``ram_dir`` is not set keeps its RAM tier in a folder of ``/dev/shm`` named
after a hash of its cache folder (:attr:`cachetier.config.CacheConfig.resolved_ram_dir`).
Deleting the cache folder (``rm -rf ~/.cache/tierdata``, a test's temporary folder) left
that RAM tier behind, holding memory until the next reboot. So such a folder records its
cache folder in a file ``owner``, and opening any default RAM tier removes the sibling
folders of the same user whose recorded cache folder no longer exists.

A sibling is removed only while its ``.lock`` can be taken without waiting (no process is
admitting into it); a process that still maps one of its values keeps those pages, as
after an eviction. Folders without an ``owner`` record (made by an older version, or a
``ram_dir`` chosen by the user) are never touched.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["OWNER_FILE", "claim", "default_name_prefix", "remove_owned_under", "sweep_orphans"]

OWNER_FILE = "owner"


def default_name_prefix() -> str:
    """The name every default RAM tier folder of this user starts with."""
    return f"tierdata-{os.getuid()}-"


def claim(ram_dir: Path, cache_dir: Path) -> None:
    """Record ``cache_dir`` as the owner of ``ram_dir`` (once; atomic, so readers never
    see a half-written record)."""
    marker = ram_dir / OWNER_FILE
    if marker.exists():
        return
    cache_dir.mkdir(parents=True, exist_ok=True)  # a RAM-only cache still owns its folder
    tmp = ram_dir / f".{OWNER_FILE}.{os.getpid()}"
    tmp.write_text(str(cache_dir))
    os.replace(tmp, marker)


def sweep_orphans(parent: Path, *, keep: Path | None = None) -> list[Path]:
    """Remove this user's default RAM tier folders in ``parent`` (other than ``keep``)
    whose cache folder is gone.

    Returns the folders removed. Errors (a folder another user owns, one removed meanwhile)
    leave that folder as it is: this is housekeeping, never a reason to fail.
    """
    return _remove_where(parent, keep, lambda owner: not owner.exists())


def remove_owned_under(parent: Path, root: Path) -> list[Path]:
    """Remove this user's default RAM tier folders in ``parent`` whose cache folder lies
    inside ``root`` (e.g. a test session's temporary folder, which outlives the session)."""
    return _remove_where(parent, None, lambda owner: owner.is_relative_to(root))


def _remove_where(parent: Path, keep: Path | None, doomed: Callable[[Path], bool]) -> list[Path]:
    removed: list[Path] = []
    prefix = default_name_prefix()
    try:
        siblings = [p for p in parent.iterdir() if p.name.startswith(prefix) and p != keep]
    except OSError:
        return removed
    for folder in siblings:
        try:
            owner = (folder / OWNER_FILE).read_text()
            if not owner or not doomed(Path(owner)):
                continue
        except (OSError, UnicodeDecodeError):  # unreadable record, or an owner we may not stat
            continue
        if _remove_unless_busy(folder):
            removed.append(folder)
    return removed


def _remove_unless_busy(folder: Path) -> bool:
    try:
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except OSError:
        return False
    try:
        if fd is not None:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a process is admitting or evicting: its cache is in use
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()
    finally:
        if fd is not None:
            os.close(fd)
