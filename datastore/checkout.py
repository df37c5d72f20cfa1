"""Materialize a version into a folder: tabular data as part files, a ``files`` dataset as files.

Guarantees:

* every shard and chunk is verified against its hash before a byte of it is written,
  and each output file is written to a temp name and renamed into place, so a checkout
  that meets corruption fails loudly (IntegrityError) and never leaves a wrong file;
* a ``files`` checkout never writes outside the target folder, whatever the records'
  paths say (absolute paths, ``..``, symlinks planted in the target are refused);
* shards are fetched in parallel, in version order, and written by a small thread pool;
  a big ``files`` dataset in two processes, as if written by one (a path the version
  holds twice gets its later record).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import itertools
import json
import os
import re
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import xxhash

from cachetier.errors import BadInputError
from datastore._forklane import Lane, Send, can_fork
from datastore.chunking import read_chunks_to
from datastore.shards import read_shard

if TYPE_CHECKING:
    from datastore.repo import Repo, VersionInfo

__all__ = ["FORMATS", "iter_version_tables", "materialize", "safe_target"]

FORMATS = ("jsonl", "parquet", "csv", "text", "files")
_EXT = {"jsonl": "jsonl", "parquet": "parquet", "csv": "csv", "text": "txt"}
# File creation is kernel-bound (journal, inode locks): more writer threads than half the
# cores made a 20k-file checkout slower here (sys time doubled with 4 threads on 2 cores).
_WRITERS = max(1, min(4, (os.cpu_count() or 2) // 2))
_DECODERS = max(1, min(4, (os.cpu_count() or 2) // 2))
_DECODE_AHEAD = 16


def materialize(repo: Repo, info: VersionInfo, target: Path, *, format: str | None = None) -> dict[str, Any]:
    """Write the data of version ``info`` into ``target``; return counts (files, records, bytes)."""
    fmt = format or _default_format(info)
    if fmt not in FORMATS:
        raise BadInputError(
            f"unknown checkout format {fmt!r} (expected one of {', '.join(FORMATS)})", subject=fmt
        )
    names = [f["name"] for f in info.record.schema.get("fields", [])]
    is_files = {"path", "data", "chunks"} <= set(names)
    if fmt == "files" and not is_files:
        raise BadInputError(
            "`--format files` needs a files dataset (columns path, data, chunks)",
            subject=info.version[:12],
            hint="use --format jsonl or parquet",
        )
    if fmt == "text" and "text" not in names:
        raise BadInputError("`--format text` needs a 'text' column", subject=info.version[:12])
    target.mkdir(parents=True, exist_ok=True)
    if fmt == "files":
        return _write_files(repo, info, target)
    return _write_parts(repo, info, target, fmt)


def iter_version_tables(
    repo: Repo, info: VersionInfo, columns: list[str] | None = None
) -> Iterator[pa.Table]:
    """Yield each shard of the version as a verified, decoded table, in version order.

    Shards are decoded on a small thread pool (Arrow's IPC reader and zstd release the
    GIL), a bounded number ahead of the consumer, while the caller writes the previous ones.
    """
    table = repo.shard_table(info.version)
    blobs = repo.objects.get_many(table.hashes())
    with ThreadPoolExecutor(_DECODERS, thread_name_prefix="tierdata-decode") as pool:
        ahead: deque[Future[pa.Table]] = deque()
        try:
            for _oid, data in blobs:
                ahead.append(pool.submit(read_shard, data, columns))
                if len(ahead) >= _DECODE_AHEAD:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                future.cancel()


def _default_format(info: VersionInfo) -> str:
    fmt = info.record.operation.get("params", {}).get("format")
    return fmt if fmt in FORMATS else "parquet"


def _write_parts(repo: Repo, info: VersionInfo, target: Path, fmt: str) -> dict[str, Any]:
    records = written = 0
    with ThreadPoolExecutor(_WRITERS) as pool:
        futures: list[Future[int]] = []
        for i, table in enumerate(iter_version_tables(repo, info)):
            path = target / f"part-{i:05d}.{_EXT[fmt]}"
            futures.append(pool.submit(_write_part, table, path, fmt))
            records += table.num_rows
        for future in futures:
            written += future.result()
    return {"files": len(futures), "records": records, "bytes": written}


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success rename it over ``path``, else remove it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_part(table: pa.Table, path: Path, fmt: str) -> int:
    with _replacing(path) as tmp:
        # Imported here: a files checkout needs neither (Parquet and CSV writers, ~15 ms).
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp, compression="zstd")
        elif fmt == "csv":
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, tmp)
        elif fmt == "text":
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                for value in table.column("text").to_pylist():
                    f.write(("" if value is None else value) + "\n")
        else:
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                for row in table.to_pylist():
                    f.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    return path.stat().st_size


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def safe_target(root: str, relpath: str, checked_dirs: set[str] | None = None) -> str:
    """Return ``root/relpath`` if it stays inside ``root`` (an absolute path); BadInputError otherwise.

    The path is checked lexically (no absolute path, ``..``, empty or NUL part) and its
    folder by ``realpath`` (no symlink planted in ``root`` leads out); ``checked_dirs``
    caches folders already found safe. The final component is opened with
    ``O_NOFOLLOW`` or replaced by rename, so a symlink there is never followed.
    """
    bad = (
        not relpath
        or "\x00" in relpath
        or "\\" in relpath
        or relpath.startswith("/")
        or any(part in ("", ".", "..") for part in relpath.split("/"))
    )
    if bad:
        raise BadInputError(
            f"refusing to write outside the target folder: unsafe path {relpath!r}", subject=relpath
        )
    path = f"{root}/{relpath}"
    _check_folder(root, path.rpartition("/")[0], relpath, checked_dirs)
    return path


# What safe_target refuses lexically, as one search over many paths joined by newlines:
# each path's ends are line ends, so whatever matches in one path matches in the joined
# text. A path holding a newline may match where it is safe; safe_target then decides.
_UNSAFE_PATHS = re.compile(r"\\|\x00|(^|/)\.{0,2}(/|$)", re.MULTILINE)


def _safe_targets(root: str, paths: list[str | None], checked_dirs: set[str]) -> list[str]:
    """:func:`safe_target` for many paths: one regex search over them all, one check per folder."""
    if None in paths or _UNSAFE_PATHS.search("\n".join(paths)):
        return [safe_target(root, p, checked_dirs) for p in paths]  # raises for the first
    targets = []
    for relpath in paths:
        path = f"{root}/{relpath}"
        parent = path.rpartition("/")[0]
        if parent not in checked_dirs:
            _check_folder(root, parent, relpath, checked_dirs)
        targets.append(path)
    return targets


def _check_folder(root: str, parent: str, relpath: str, checked_dirs: set[str] | None) -> None:
    if checked_dirs is None or parent not in checked_dirs:
        real_root = os.path.realpath(root)
        real_parent = os.path.realpath(parent)
        if os.path.commonpath([real_root, real_parent]) != real_root:
            raise BadInputError(f"refusing to write through a symlink: {relpath!r}", subject=relpath)
        if checked_dirs is not None:
            checked_dirs.add(parent)


_JOB_BYTES = 1 << 20  # stored shard bytes one files-checkout job decodes and writes
# Below this, forking a second process costs more than the second core saves.
_LANE_MIN_SHARDS = 64
_LANE_MIN_BYTES = 32 << 20
_AHEAD_BYTES = 128 << 20  # stored shard bytes decoded and not yet written (see _Stages)
_FILE_COLUMNS = ["path", "size", "data", "chunks"]
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _write_files(repo: Repo, info: VersionInfo, target: Path) -> dict[str, Any]:
    """Write a files dataset; a big one in two processes (see :func:`_write_files_in_two_lanes`)."""
    table = repo.shard_table(info.version)
    root = os.path.abspath(target)
    sizes = table.uncompressed_bytes
    if len(table) >= _LANE_MIN_SHARDS and int(sizes.sum()) >= _LANE_MIN_BYTES and can_fork():
        half = int(np.searchsorted(np.cumsum(sizes), int(sizes.sum()) // 2)) + 1
        return _write_files_in_two_lanes(repo, table.hashes(), half, root)
    return _write_shards(repo, table.hashes(), _FilesWriter(repo, root))


def _write_files_in_two_lanes(repo: Repo, hashes: list[str], half: int, root: str) -> dict[str, Any]:
    """Write the files of the first ``half`` shards here and the rest in a forked child
    (:class:`~datastore._forklane.Lane`): decoding, path checks and file creation hold
    the GIL for much of their time, and one process used 1.3 of 2 cores.

    A path written by both (a version that holds it twice) is written again afterwards
    from the second half, so the later record wins, as in one process.
    """

    def second_half(send: Send) -> tuple[dict[str, Any], np.ndarray]:
        writer = _FilesWriter(repo, root)
        return _write_shards(repo, hashes[half:], writer), writer.path_hashes()

    child = Lane(second_half)
    try:
        writer = _FilesWriter(repo, root)
        ours = _write_shards(repo, hashes[:half], writer)
        theirs, their_paths = child.wait_for("done")
    except BaseException:
        child.kill()
        raise
    finally:
        child.reap()
    twice = np.intersect1d(writer.path_hashes(), their_paths)
    if len(twice):
        _rewrite(repo, hashes[half:], _FilesWriter(repo, root), set(twice.tolist()))
    return {key: ours[key] + theirs[key] for key in ours}


def _rewrite(repo: Repo, hashes: list[str], writer: _FilesWriter, path_hashes: set[int]) -> None:
    """Write again, in order and one at a time, the files of these shards whose path
    hashes (:func:`_path_hash`) are in ``path_hashes``: the last record of a path wins."""
    for _oid, data in repo.objects.get_many(hashes):
        job = writer.prepare([data])
        job.inline = [(path, value) for path, value in job.inline if _path_hash(path) in path_hashes]
        job.chunked = [item for item in job.chunked if _path_hash(item[0]) in path_hashes]
        writer.write(job)


def _path_hash(path: str) -> int:
    return xxhash.xxh3_64_intdigest(path.encode("utf-8", "surrogatepass"))


def _write_shards(repo: Repo, hashes: list[str], writer: _FilesWriter) -> dict[str, Any]:
    """Write the files of these shards. Shards are fetched in order and handed, a few at a
    time, to decoding jobs (decode, check paths, make folders) and then to writing jobs
    (create the files): one future per job and stage, not per shard or file, and the
    stages overlap. Jobs run side by side, so a path the shards hold twice is written
    again at the end, in order, and gets its later record."""
    blobs = repo.objects.get_many(hashes)
    with (
        ThreadPoolExecutor(_DECODERS, thread_name_prefix="tierdata-decode") as decoders,
        ThreadPoolExecutor(_WRITERS, thread_name_prefix="tierdata-files") as writers,
    ):
        stages = _Stages(writer, decoders, writers)
        try:
            for shards, size in _jobs(blobs):
                stages.submit(shards, size)
            stages.drain()
        finally:
            stages.cancel()
    seen, counts = np.unique(writer.path_hashes(), return_counts=True)
    if (counts > 1).any():
        _rewrite(repo, hashes, _FilesWriter(repo, writer.root), set(seen[counts > 1].tolist()))
    return {"files": stages.files, "records": stages.files, "bytes": stages.written}


class _Stages:
    """The two stages of a files checkout, with at most ``_AHEAD_BYTES`` decoded and not written.

    Decoding runs well ahead of writing on purpose, as it creates the folders: on ext4
    without a journal, creating a file soon after a big delete scans the recently deleted
    inodes of its block group, and folders made early, before their files, measured far
    cheaper (20k files right after deleting 20k: 3.5 s; a quarter of this run-ahead: 4.3 s;
    jobs of 1 MiB with 4 ahead: 6 s).
    """

    def __init__(self, writer: _FilesWriter, decoders: ThreadPoolExecutor, writers: ThreadPoolExecutor):
        self.writer, self.decoders, self.writers = writer, decoders, writers
        self.decoding: deque[tuple[Future[_FilesJob], int]] = deque()
        self.writing: deque[tuple[Future[int], int]] = deque()
        self.ahead = 0
        self.files = self.written = 0

    def submit(self, shards: list[bytes], size: int) -> None:
        """Queue a job; wait while too much is decoded and not yet written."""
        self.decoding.append((self.decoders.submit(self.writer.prepare, shards), size))
        self.ahead += size
        self._advance(wait=False)
        while self.ahead > _AHEAD_BYTES:
            self._advance(wait=True)

    def drain(self) -> None:
        """Wait until every job is written (raising the first error)."""
        while self.decoding or self.writing:
            self._advance(wait=True)

    def cancel(self) -> None:
        for future, _ in (*self.decoding, *self.writing):
            future.cancel()

    def _advance(self, *, wait: bool) -> None:
        """Hand decoded jobs to the writers and collect written ones (oldest first), waiting
        for the oldest unfinished one when ``wait``."""
        while self.decoding and (self.decoding[0][0].done() or (wait and not self.writing)):
            future, size = self.decoding.popleft()
            job = future.result()
            self.files += job.files
            self.writing.append((self.writers.submit(self.writer.write, job), size))
        while self.writing and (self.writing[0][0].done() or wait):
            future, size = self.writing.popleft()
            self.written += future.result()
            self.ahead -= size
            wait = False


def _jobs(blobs: Iterator[tuple[str, bytes]]) -> Iterator[tuple[list[bytes], int]]:
    """Group consecutive verified shards into jobs of about ``_JOB_BYTES``: (shards, their bytes)."""
    job: list[bytes] = []
    size = 0
    for _oid, data in blobs:
        job.append(data)
        size += len(data)
        if size >= _JOB_BYTES:
            yield job, size
            job, size = [], 0
    if job:
        yield job, size


@dataclass(slots=True)
class _FilesJob:
    """Decoded shards, paths checked and folders made: what is left is writing the files."""

    files: int = 0
    inline: list[tuple[str, memoryview]] = field(default_factory=list)
    chunked: list[tuple[str, list[str], int]] = field(default_factory=list)


class _FilesWriter:
    """Decodes files shards and writes their files below ``root``; safe in threads."""

    def __init__(self, repo: Repo, root: str):
        self.repo = repo
        self.root = root
        self._checked: set[str] = set()  # folders found safe (see safe_target)
        self._made: set[str] = set()  # folders created
        self._path_hashes: list[np.ndarray] = []  # 8 bytes a file prepared, not its path

    def prepare(self, shards: list[bytes]) -> _FilesJob:
        """Decode the shards, check every path and create the folders. Every path of the
        job is checked before any file of it is written."""
        job = _FilesJob()
        tables = [read_shard(data, _FILE_COLUMNS) for data in shards]
        paths = [p for table in tables for p in table.column("path").to_pylist()]
        targets = _safe_targets(self.root, paths, self._checked)
        self._path_hashes.append(np.fromiter(map(_path_hash, targets), np.uint64, len(targets)))
        for folder in {t.rpartition("/")[0] for t in targets} - self._made:
            os.makedirs(folder, exist_ok=True)
            self._made.add(folder)
        first = 0
        for table in tables:
            values = _binary_values(table.column("data").combine_chunks())
            for i, (path, value) in enumerate(zip(targets[first : first + len(values)], values)):
                if value is not None:
                    job.inline.append((path, value))
                else:
                    chunks = table.column("chunks")[i].as_py() or []
                    job.chunked.append((path, chunks, table.column("size")[i].as_py()))
            first += len(values)
        job.files = len(targets)
        return job

    def path_hashes(self) -> np.ndarray:
        """The :func:`_path_hash` of every file prepared so far (in no particular order)."""
        return np.concatenate(self._path_hashes) if self._path_hashes else np.zeros(0, np.uint64)

    def write(self, job: _FilesJob) -> int:
        """Write the files of a prepared job; return the bytes written."""
        written = 0
        for path, value in job.inline:
            written += _write_inline(path, value)
        for path, chunks, size in job.chunked:
            written += _write_chunked(self.repo, Path(path), chunks, size)
        return written


def _binary_values(array: pa.Array) -> list[memoryview | None]:
    """Zero-copy views of each value of a (large) binary array; None for nulls."""
    _, offsets_buf, data_buf = array.buffers()
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(
        offsets_buf, dtype, count=len(array) + 1, offset=array.offset * np.dtype(dtype).itemsize
    ).tolist()
    view = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    if array.null_count == 0:
        return [view[a:b] for a, b in itertools.pairwise(offsets)]
    valid = array.is_valid().to_numpy(zero_copy_only=False).tolist()
    return [view[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(array))]


def _write_inline(path: str, data: memoryview) -> int:
    """Create (or truncate) ``path`` and write ``data``; a symlink there is not followed."""
    fd = os.open(path, _WRITE_FLAGS, 0o644)
    try:
        view = data
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return len(data)


def _write_chunked(repo: Repo, path: Path, chunk_ids: list[str], size: int) -> int:
    with _replacing(path) as tmp, open(tmp, "wb") as f:
        return read_chunks_to(repo.objects, chunk_ids, f, expected_size=size, subject=str(path))
