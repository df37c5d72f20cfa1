"""The ``files`` dataset: a directory tree as records of path and bytes.

Columns: ``path`` (POSIX, relative to the ingested directory), ``size`` (int64),
``data`` (large_binary; null when chunked) and ``chunks`` (list<string> of chunk object
ids; null when inline). Files are listed recursively and sorted by path (code-point
order, which is also UTF-8 byte order), so the same tree gives the same records on any
machine. Regular files and symlinks to files are read; symlinks to directories are not
followed (no cycles); sockets, FIFOs and devices are left out.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from cachetier.errors import BadInputError, NotFoundError

log = logging.getLogger(__name__)

__all__ = [
    "FILES_SCHEMA",
    "FileEntry",
    "changed_while_read",
    "files_batch",
    "is_files_schema",
    "read_file_into",
    "read_files_into",
    "read_small_file",
    "walk_files",
]

FILES_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("data", pa.large_binary()),
        pa.field("chunks", pa.list_(pa.string())),
    ]
)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a tree: its record path, where it is on disk, its size and mtime."""

    path: str
    abspath: str
    size: int
    mtime_ns: int


def is_files_schema(schema: pa.Schema) -> bool:
    """True when ``schema`` is the ``files`` dataset layout (hidden columns ignored)."""
    visible = pa.schema([f for f in schema if not f.name.startswith("__")])
    return visible.names == FILES_SCHEMA.names and all(
        a.type.equals(b.type) for a, b in zip(visible, FILES_SCHEMA)
    )


def walk_files(root: str, display: str | None = None) -> list[FileEntry]:
    """List the files below ``root`` (or ``root`` itself if it is a file), sorted by path."""
    display = display or root
    try:
        st = os.stat(root)
    except FileNotFoundError as e:
        raise NotFoundError("no such file or directory", subject=display) from e
    if not os.path.isdir(root):
        return [FileEntry(_checked_name(os.path.basename(root), display), root, st.st_size, st.st_mtime_ns)]
    entries: list[FileEntry] = []
    _walk(root, "", display, entries)
    entries.sort(key=lambda e: e.path)
    return entries


def _walk(folder: str, prefix: str, display: str, out: list[FileEntry]) -> None:
    try:
        listing = list(os.scandir(folder))
    except PermissionError as e:
        raise BadInputError("permission denied", subject=os.path.join(display, prefix)) from e
    for entry in listing:
        rel = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            _walk(entry.path, rel + "/", display, out)
            continue
        try:
            if not entry.is_file():
                continue
            st = entry.stat()
        except FileNotFoundError:
            continue  # vanished while listing, or a dangling symlink
        except OSError as e:
            if e.errno == errno.ELOOP:  # a symlink that leads to itself: skipped like a dangling one
                log.warning("skipping %s: a symlink loop", os.path.join(display, rel))
                continue
            raise BadInputError(f"cannot read: {e.strerror or e}", subject=os.path.join(display, rel)) from e
        out.append(FileEntry(_checked_name(rel, display), entry.path, st.st_size, st.st_mtime_ns))


def _checked_name(rel: str, display: str) -> str:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise BadInputError(
            f"file name {shown!r} is not valid UTF-8", subject=display, hint="rename the file"
        ) from e
    return rel


def read_small_file(entry: FileEntry, display: str) -> bytes:
    """Read a whole file; a size different from the listing means it changed under us."""
    buf = bytearray(entry.size)
    read_file_into(entry, display, memoryview(buf))
    return bytes(buf)


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


def read_file_into(entry: FileEntry, display: str, out: memoryview) -> None:
    """Fill ``out`` (exactly ``entry.size`` bytes) with the file's bytes.

    Raises BadInputError when the file vanished, is unreadable, or no longer has the
    listed size. Plain ``os`` calls: three syscalls a file where ``open().read()`` makes eight.
    """
    subject = f"{display}/{entry.path}"
    try:
        fd = os.open(entry.abspath, _READ_FLAGS)
    except FileNotFoundError as e:
        raise BadInputError("file vanished while being ingested", subject=subject) from e
    except PermissionError as e:
        raise BadInputError("permission denied", subject=subject) from e
    # One readv asks for a byte past the listed size: getting it means the file grew.
    spare = bytearray(1)
    want, done = len(out), 0
    try:
        while True:
            n = os.readv(fd, [out[done:], spare])
            done += n
            if n == 0 or done >= want:
                break
    finally:
        os.close(fd)
    if done != want:
        raise changed_while_read(subject)


def changed_while_read(subject: str) -> BadInputError:
    """The error for a file whose size (or mtime) changed between its listing and the end
    of its read: what was read would not match the size recorded."""
    return BadInputError("file changed while it was being read", subject=subject, hint="ingest it again")


def read_files_into(
    entries: Sequence[FileEntry], display: str, out: memoryview, offsets: Sequence[int]
) -> None:
    """Read each of ``entries`` whole into ``out[offsets[i] : offsets[i] + size]``.

    Errors as :func:`read_file_into`.
    """
    for entry, start in zip(entries, offsets):
        read_file_into(entry, display, out[start : start + entry.size])


def files_batch(
    paths: list[str],
    sizes: list[int],
    data: list[bytes | None] | pa.LargeBinaryArray,
    chunks: list[list[str] | None],
) -> pa.RecordBatch:
    """Build a ``files`` record batch from columns of Python values (``data`` may be an array)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array(paths, pa.string()),
            pa.array(sizes, pa.int64()),
            data if isinstance(data, pa.Array) else pa.array(data, pa.large_binary()),
            pa.array(chunks, pa.list_(pa.string())),
        ],
        schema=FILES_SCHEMA,
    )
