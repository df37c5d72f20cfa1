"""Materialize a version into a folder: tabular data as part files, a ``files`` dataset as files.

Guarantees:

* every shard and chunk is verified against its hash before a byte of it is written,
  and each output file is written to a temp name and renamed into place, so a checkout
  that meets corruption fails loudly (IntegrityError) and never leaves a wrong file;
* a ``files`` checkout never writes outside the target folder, whatever the records'
  paths say (absolute paths, ``..``, symlinks planted in the target are refused);
* shards are fetched in parallel, in version order, and written by a small thread pool;
  a big ``files`` dataset in two processes, as if written by one (a path the version
  holds twice gets its later record);
* a ``files`` checkout refuses, before writing any file, a version where one path is both
  a file and a folder (``x`` and ``x/y``, as an appended ingest can make);
* a tabular checkout (jsonl, parquet, csv, text) leaves exactly the version in the target
  folder: it writes ``part-NNNNN.<ext>`` files into a new or empty folder, or into one
  that holds only such part files (an earlier checkout: they are removed first); a
  folder holding anything else is refused, so no file we did not write is deleted. A
  ``files`` checkout writes its files into the folder whatever is there, replacing files
  of the same paths and leaving the others (as ``cp -r`` does);
* a checkout that fails removes what it wrote: the folder it created, or the part files
  of a tabular checkout (a ``files`` checkout into an existing folder keeps the files it
  wrote before the failure).
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import functools
import io
import itertools
import json
import os
import re
import shutil
import threading
import time
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

from cachetier.errors import BadInputError, TierdataError
from datastore._forklane import Lane, Send, can_fork
from datastore._jsonl_writer import jsonl_bytes
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
    """Write the data of version ``info`` into ``target``; return counts (files, records, bytes).

    ``target`` is a folder, created if missing. A tabular format needs it new, empty, or
    holding only the part files of an earlier checkout (which are replaced); a ``files``
    checkout writes into it whatever is there. A problem with the folder (a file in the
    way, no permission, a full disk) is a BadInputError naming the path; on any failure
    what this checkout wrote is removed (see the module docstring).
    """
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
    created = _make_target(target)
    try:
        if fmt == "files":
            return _write_files(repo, info, target)
        return _write_parts(repo, info, target, fmt)
    except BaseException as e:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, TierdataError):
            error = _target_error(e, target)
            if error is not None:
                raise error from e
        raise


def _make_target(target: Path) -> Path | None:
    """Check that ``target`` is a folder this process may write, creating it if missing.

    Returns the topmost folder created (None when ``target`` existed), for clean-up.
    """
    if target.is_dir():
        if not os.access(target, os.W_OK | os.X_OK):
            raise BadInputError(
                f"cannot write into folder {str(target)!r}: permission denied", subject=str(target)
            )
        return None
    if target.exists() or target.is_symlink():
        raise BadInputError(
            f"{str(target)!r} exists and is not a folder",
            subject=str(target),
            hint="--to names a folder, new or existing",
        )
    top = target
    while not top.parent.exists() and not top.parent.is_symlink() and top.parent != top:
        top = top.parent
    try:
        target.mkdir(parents=True)
    except FileExistsError:
        if not target.is_dir():  # made by someone else meanwhile
            raise BadInputError(f"{str(target)!r} exists and is not a folder", subject=str(target)) from None
        return None
    except OSError as e:
        blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
        reason = f"{blocker} is a file" if blocker is not None else (e.strerror or str(e))
        raise BadInputError(f"cannot create folder {str(target)!r}: {reason}", subject=str(target)) from e
    return top


def _target_error(e: OSError, target: Path) -> BadInputError | None:
    """A one-line error for an OSError met writing below ``target``; None for other paths."""
    root = os.path.abspath(target)
    where = os.path.abspath(e.filename) if isinstance(e.filename, str) else None
    if where is None or os.path.commonpath([root, where]) != root:
        return None
    if isinstance(e, IsADirectoryError):
        return BadInputError(
            "a folder in the target is in the way of a file of the version",
            subject=where,
            hint="check out into a new folder, or remove it",
        )
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        blocker = next(
            (p for p in (where, *Path(where).parents) if os.path.lexists(p) and not os.path.isdir(p)), where
        )
        return BadInputError(
            "a file in the target is in the way of a folder of the version",
            subject=str(blocker),
            hint="check out into a new folder, or remove it",
        )
    return BadInputError(f"cannot write: {e.strerror or e}", subject=where)


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


# What a tabular checkout writes (see _write_parts), and its temp names (see _replacing).
_PART_NAME = re.compile(r"part-\d{5,}\.(?:jsonl|parquet|csv|txt)")
_PART_TEMP = re.compile(r"\.part-\d{5,}\.(?:jsonl|parquet|csv|txt)\.[0-9a-f]{8}\.tmp")
_FILE_TEMP = re.compile(r"\.(.+)\.[0-9a-f]{8}\.tmp", re.DOTALL)  # a big file's (see _replacing)


def _write_parts(repo: Repo, info: VersionInfo, target: Path, fmt: str) -> dict[str, Any]:
    """Write one part file per shard, once the first shard shows the format can hold the
    columns and the part files of an earlier checkout are removed; on failure, remove ours."""
    earlier = _earlier_parts(target)
    tables = iter_version_tables(repo, info)
    records = written = 0
    paths: list[Path] = []
    try:
        first = next(tables, None)
        if first is not None:
            _check_columns(first.schema, fmt)
        for path in earlier:
            path.unlink(missing_ok=True)
        with ThreadPoolExecutor(_WRITERS) as pool:
            futures: list[Future[int]] = []
            for i, table in enumerate(itertools.chain([first] if first is not None else [], tables)):
                paths.append(target / f"part-{i:05d}.{_EXT[fmt]}")
                futures.append(pool.submit(_write_part, table, paths[-1], fmt))
                records += table.num_rows
            for future in futures:
                written += future.result()
    except BaseException:
        for path in paths:
            path.unlink(missing_ok=True)
        raise
    finally:
        tables.close()
    return {"files": len(paths), "records": records, "bytes": written}


def _earlier_parts(target: Path) -> list[Path]:
    """The part files (and stray temp files) of an earlier checkout in ``target``;
    BadInputError if it holds anything else, which a checkout must neither delete nor mix with."""
    ours, others = [], []
    with os.scandir(target) as entries:
        for entry in entries:
            named_ours = _PART_NAME.fullmatch(entry.name) or _PART_TEMP.fullmatch(entry.name)
            (ours if named_ours and entry.is_file(follow_symlinks=False) else others).append(entry.name)
    if others:
        raise BadInputError(
            f"folder {str(target)!r} is not empty: it holds {min(others)!r}, "
            "not only part files of an earlier checkout",
            subject=str(target),
            hint="check out into a new or empty folder",
        )
    return [target / name for name in ours]


def _check_columns(schema: pa.Schema, fmt: str) -> None:
    """Refuse, before writing, columns the format cannot hold (naming the first one)."""
    if fmt == "text":
        t = schema.field("text").type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            raise BadInputError(
                f"`--format text` needs a string 'text' column, not {t}",
                subject="text",
                hint="use --format jsonl or parquet",
            )
    elif fmt == "csv":
        for column in schema:
            if not _csv_can_write(column.type):
                raise BadInputError(
                    f"column {column.name!r} ({column.type}) cannot be written as CSV",
                    subject=column.name,
                    hint="use --format jsonl or parquet",
                )


def _csv_can_write(type_: pa.DataType) -> bool:
    import pyarrow.csv as pacsv

    try:
        pacsv.write_csv(pa.table({"c": pa.nulls(1, type_)}), io.BytesIO())
    except (pa.ArrowException, TypeError, ValueError):
        return False
    return True


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
            _write_csv(table, tmp)
        elif fmt == "text":
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                for value in table.column("text").to_pylist():
                    f.write(("" if value is None else value) + "\n")
        elif (buffers := jsonl_bytes(table)) is not None:
            with open(tmp, "wb") as f:
                for buffer in buffers:
                    f.write(buffer)
        else:
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                for row in _json_rows(table):
                    f.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    return path.stat().st_size


def _write_csv(table: pa.Table, path: Path) -> None:
    """Write ``table`` as CSV; values it cannot hold (bytes that are not UTF-8) are a
    BadInputError naming their column."""
    import pyarrow.csv as pacsv

    try:
        pacsv.write_csv(table, path)
    except pa.ArrowException as e:
        for name, column in zip(table.column_names, table.columns):
            try:
                pacsv.write_csv(pa.table({name: column}), io.BytesIO())
            except pa.ArrowException as column_error:
                raise BadInputError(
                    f"column {name!r} cannot be written as CSV: {column_error}",
                    subject=name,
                    hint="use --format jsonl or parquet",
                ) from e
        raise


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


# JSON values of nanosecond time types. Arrow turns them into Python values only with
# pandas (which is not a dependency), so they are read as integers and written here,
# as pandas' values would be: a timestamp or time as ISO 8601 with 9 fractional digits
# when it has nanoseconds (else exactly as a microsecond one), a duration as seconds.


def _json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows of ``table`` as dicts of JSON-ready values (see :func:`_json_default`)."""
    as_ints = [_ns_as_int(f.type) for f in table.schema]
    if not any(as_ints):
        return table.to_pylist()
    columns = []
    for column_field, column, as_int in zip(table.schema, table.columns, as_ints):
        if as_int is None:
            columns.append(column.to_pylist())
        else:
            columns.append([_from_ns(v, column_field.type) for v in column.cast(as_int).to_pylist()])
    return [dict(zip(table.column_names, row)) for row in zip(*columns)]


def _is_ns(t: pa.DataType) -> bool:
    return (pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time64(t)) and t.unit == "ns"


def _ns_as_int(t: pa.DataType) -> pa.DataType | None:
    """``t`` with its nanosecond time types as int64 (and dictionaries decoded); None if it has none."""
    if _is_ns(t):
        return pa.int64()
    if pa.types.is_dictionary(t):
        return _ns_as_int(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = _ns_as_int(t.value_type)
        if inner is None:
            return None
        item = t.value_field.with_type(inner)
        if pa.types.is_fixed_size_list(t):
            return pa.list_(item, t.list_size)
        return pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
    if pa.types.is_map(t):
        key, item = _ns_as_int(t.key_type), _ns_as_int(t.item_type)
        if key is None and item is None:
            return None
        return pa.map_(t.key_field.with_type(key or t.key_type), t.item_field.with_type(item or t.item_type))
    if pa.types.is_struct(t):
        inner = [_ns_as_int(f.type) for f in t]
        if not any(inner):
            return None
        return pa.struct([f.with_type(i or f.type) for f, i in zip(t, inner)])
    return None


def _from_ns(value: Any, t: pa.DataType) -> Any:
    """The JSON-ready value of ``value``, a Python value of ``_ns_as_int(t)``."""
    if value is None:
        return None
    if pa.types.is_dictionary(t):
        return _from_ns(value, t.value_type)
    if _is_ns(t):
        if pa.types.is_duration(t):
            return value / 1_000_000_000
        micros, nanos = divmod(value, 1000)
        if pa.types.is_time64(t):
            return _iso_with_nanos((_dt.datetime.min + _dt.timedelta(microseconds=micros)).time(), nanos)
        stamp = _EPOCH + _dt.timedelta(microseconds=micros)
        if t.tz is not None:
            stamp = stamp.replace(tzinfo=_dt.UTC).astimezone(_tzinfo(t.tz))
        return _iso_with_nanos(stamp, nanos)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_from_ns(v, t.value_type) for v in value]
    if pa.types.is_map(t):
        return [(_from_ns(k, t.key_type), _from_ns(v, t.item_type)) for k, v in value]
    if pa.types.is_struct(t):
        for child in t:
            if _ns_as_int(child.type) is not None:
                value[child.name] = _from_ns(value[child.name], child.type)
    return value


_EPOCH = _dt.datetime(1970, 1, 1)


def _iso_with_nanos(value: _dt.datetime | _dt.time, nanos: int) -> str:
    """ISO 8601 of ``value`` plus ``nanos`` (0-999) nanoseconds: 9 fractional digits, or
    ``value.isoformat()`` when ``nanos`` is 0."""
    if not nanos:
        return value.isoformat()
    text = value.isoformat(timespec="microseconds")
    cut = text.index(".") + 7
    return f"{text[:cut]}{nanos:03d}{text[cut:]}"


@functools.lru_cache(maxsize=64)
def _tzinfo(tz: str) -> _dt.tzinfo:
    """The tzinfo Arrow gives timestamps of time zone ``tz`` (so both units agree)."""
    return pa.scalar(0, pa.timestamp("us", tz=tz)).as_py().tzinfo


def safe_target(root: str, relpath: str, checked_dirs: set[str] | None = None) -> str:
    """Return ``root/relpath`` if it stays inside ``root`` (an absolute path); BadInputError otherwise.

    The path is checked lexically (no absolute path, ``..``, empty or NUL part; a
    backslash is an ordinary character of a POSIX name) and its folder by ``realpath``
    (no symlink planted in ``root`` leads out); ``checked_dirs``
    caches folders already found safe. The final component is opened with
    ``O_NOFOLLOW`` or replaced by rename, so a symlink there is never followed.
    """
    bad = (
        not relpath
        or "\x00" in relpath
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
_UNSAFE_PATHS = re.compile(r"\x00|(^|/)\.{0,2}(/|$)", re.MULTILINE)


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
    if not _from_one_tree(info):
        _check_paths(repo, table.hashes(), root, info.version)
    sizes = table.uncompressed_bytes
    if len(table) >= _LANE_MIN_SHARDS and int(sizes.sum()) >= _LANE_MIN_BYTES and can_fork():
        half = int(np.searchsorted(np.cumsum(sizes), int(sizes.sum()) // 2)) + 1
        return _write_files_in_two_lanes(repo, table.hashes(), half, root)
    return _write_shards(repo, table.hashes(), _FilesWriter(repo, root))


def _from_one_tree(info: VersionInfo) -> bool:
    """True when the version's files are those of one directory (a ``files`` ingest of
    one source, not appended to a parent): no path there can be a file and a folder."""
    operation = info.record.operation
    sources = operation.get("sources") or []
    return (
        operation.get("op") in ("ingest", "replace")
        and len(sources) == 1
        and sources[0].get("format") == "files"
    )


def _check_paths(repo: Repo, hashes: list[str], root: str, version: str) -> None:
    """Refuse, before any file is written, a version with an unsafe path (as
    :func:`safe_target`) or a path that is both a file and a folder (``x`` and ``x/y``).

    Reads only the path column. Keeps an 8-byte hash per file and the set of folders, so memory
    grows with the folders, not with the files.
    """
    folders: set[str] = set()
    file_hashes: list[np.ndarray] = []
    for _oid, data in repo.objects.get_many(hashes):
        paths = read_shard(data, ["path"]).column("path").to_pylist()
        if None in paths or _UNSAFE_PATHS.search("\n".join(paths)):
            _safe_targets(root, paths, set())  # raises for the first unsafe path
        file_hashes.append(np.fromiter(map(_path_hash, paths), np.uint64, len(paths)))
        for parent in {p.rpartition("/")[0] for p in paths} - folders:
            while parent and parent not in folders:  # a folder's ancestors are in the set too
                folders.add(parent)
                parent = parent.rpartition("/")[0]
    if not folders or not file_hashes:
        return
    folder_list = list(folders)
    folder_hashes = np.fromiter(map(_path_hash, folder_list), np.uint64, len(folder_list))
    suspects = np.isin(folder_hashes, np.concatenate(file_hashes))
    if suspects.any():  # a file's path hashes as a folder's: find the path itself
        _refuse_file_and_folder(repo, hashes, {folder_list[i] for i in np.flatnonzero(suspects)}, version)


def _refuse_file_and_folder(repo: Repo, hashes: list[str], suspects: set[str], version: str) -> None:
    """Raise for the first file (in version order) whose path is in ``suspects``, folders
    of the version (none, if their hashes only collided)."""
    for _oid, data in repo.objects.get_many(hashes):
        for path in read_shard(data, ["path"]).column("path").to_pylist():
            if path in suspects:
                raise BadInputError(
                    f"{path!r} is both a file and a folder in version {version[:12]}: "
                    "it cannot be checked out as files",
                    subject=path,
                    hint="rename the file or the folder and ingest again, or use --format parquet",
                )


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
    writer.remove_leftovers()
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
        self._started = time.time()
        self._chunked: dict[str, set[str]] = {}  # folder -> names of big files written there
        self._lock = threading.Lock()

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
            folder, _, name = path.rpartition("/")
            with self._lock:
                self._chunked.setdefault(folder, set()).add(name)
        return written

    def remove_leftovers(self) -> None:
        """Remove the temp files that an earlier checkout, killed while writing a big file
        (see :func:`_replacing`), left beside the big files this one wrote; only temp files
        older than this checkout, so another writer's are never touched."""
        for folder, names in self._chunked.items():
            with os.scandir(folder) as entries:
                for entry in entries:
                    match = _FILE_TEMP.fullmatch(entry.name)
                    if match and match.group(1) in names and entry.stat().st_mtime < self._started - 1:
                        os.unlink(entry.path)


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
