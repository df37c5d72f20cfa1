"""Materialize a version into a folder: tabular data as part files, a ``files`` dataset as files.

Guarantees:

* every shard and chunk is verified against its hash before a byte of it is written,
  and each output file is written to a temp name and renamed into place, so a checkout
  that meets corruption fails loudly (IntegrityError) and never leaves a wrong file;
* a ``files`` checkout never writes outside the target folder, whatever the records'
  paths say (absolute paths, ``..``, symlinks planted in the target are refused);
* shards are fetched in parallel, in version order, and written by a small thread pool.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import os
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from cachetier.errors import BadInputError
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
        if fmt == "parquet":
            pq.write_table(table, tmp, compression="zstd")
        elif fmt == "csv":
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
    parent = path.rpartition("/")[0]
    if checked_dirs is None or parent not in checked_dirs:
        real_root = os.path.realpath(root)
        real_parent = os.path.realpath(parent)
        if os.path.commonpath([real_root, real_parent]) != real_root:
            raise BadInputError(f"refusing to write through a symlink: {relpath!r}", subject=relpath)
        if checked_dirs is not None:
            checked_dirs.add(parent)
    return path


_BATCH_FILES = 512


def _write_files(repo: Repo, info: VersionInfo, target: Path) -> dict[str, Any]:
    root = os.path.abspath(target)
    records = written = 0
    checked: set[str] = set()
    made: set[str] = set()
    with ThreadPoolExecutor(_WRITERS) as pool:
        futures: list[Future[int]] = []
        for table in iter_version_tables(repo, info, ["path", "size", "data", "chunks"]):
            paths = table.column("path").to_pylist()
            sizes = table.column("size").to_pylist()
            values = _binary_values(table.column("data").combine_chunks())
            chunks = table.column("chunks").combine_chunks()
            # Validate the whole shard's paths before writing any file of it.
            targets = [safe_target(root, p, checked) for p in paths]
            for folder in {t.rpartition("/")[0] for t in targets} - made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            inline: list[tuple[str, memoryview]] = []
            for i, path in enumerate(targets):
                value = values[i]
                if value is not None:
                    inline.append((path, value))
                    if len(inline) >= _BATCH_FILES:
                        futures.append(pool.submit(_write_inline_batch, inline))
                        inline = []
                else:
                    ids = chunks[i].as_py() or []
                    futures.append(pool.submit(_write_chunked, repo, Path(path), ids, sizes[i]))
            if inline:
                futures.append(pool.submit(_write_inline_batch, inline))
            records += table.num_rows
        for future in futures:
            written += future.result()
    return {"files": records, "records": records, "bytes": written}


def _binary_values(array: pa.Array) -> list[memoryview | None]:
    """Zero-copy views of each value of a (large) binary array; None for nulls."""
    import numpy as np

    _, offsets_buf, data_buf = array.buffers()
    dtype = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = np.frombuffer(
        offsets_buf, dtype, count=len(array) + 1, offset=array.offset * np.dtype(dtype).itemsize
    )
    view = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    bounds = offsets.tolist()
    return [view[bounds[i] : bounds[i + 1]] if valid[i] else None for i in range(len(array))]


def _write_inline_batch(items: list[tuple[str, memoryview]]) -> int:
    total = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for path, data in items:
        fd = os.open(path, flags, 0o644)
        try:
            view = data
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        total += len(data)
    return total


def _write_chunked(repo: Repo, path: Path, chunk_ids: list[str], size: int) -> int:
    with _replacing(path) as tmp, open(tmp, "wb") as f:
        return read_chunks_to(repo.objects, chunk_ids, f, expected_size=size, subject=str(path))
