"""Ingest of ``files`` sources: records known by hash before their bytes are read.

A file whose size and mtime the ingest index remembers contributes its record hash and
canonical size without being opened. Shard boundaries depend only on those two numbers,
so the shards of a re-ingest are cut before any data is read; a shard whose records are
all known and whose object is stored is reused as is, and only the shards that hold a
changed file are built, reading their unchanged neighbours then (and checking that their
hashes still match). Small files are read whole; files at or above the chunk threshold
are cut into content-defined chunks, each stored as its own object.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cachetier.errors import BadInputError
from cachetier.hashing import hasher
from datastore._pipeline import Uploader, read_ahead, store_pending_many
from datastore._sourcebase import SourceSpec, SourceStats
from datastore.chunking import ChunkOptions, iter_chunks, pack_chunk
from datastore.files import (
    FILES_SCHEMA,
    FileEntry,
    changed_while_read,
    files_batch,
    read_files_into,
    read_small_file,
    walk_files,
)
from datastore.ingestindex import IngestIndex
from datastore.recordhash import RECORD_HASH_TYPE, digest_prefixes, hash_records
from datastore.shards import (
    BoundaryCutter,
    PendingShard,
    ShardInfo,
    ShardOptions,
    shard_key,
    shard_key_prefix,
)

__all__ = ["FilesIngest", "FilesOutcome", "digest_part", "hash_array", "ingest_files"]

_GROUP_FILES = 1024
_GROUP_BYTES = 32 << 20
_READERS = 4
_JOB_BYTES = 1 << 20  # canonical bytes of the shards one worker job stores
_RECORD_SCOPE = "record/1"


@dataclass(slots=True)
class _Record:
    entry: FileEntry
    display: str
    chunks: tuple[str, ...] | None = None
    hash: bytes = b""
    size: int = 0
    known: bool = False  # from the index: data not read
    batch: pa.RecordBatch | None = None  # a read record: the batch it was hashed in ...
    row: int = 0  # ... and its row there


@dataclass(frozen=True, slots=True)
class FilesOutcome:
    """The shards of a files ingest, per-source stats and how many files were opened."""

    schema: pa.Schema
    shards: list[ShardInfo]
    stats: list[SourceStats]
    files_read: int


class FilesIngest:
    """One process's files ingest: records hashed a group at a time, cut into shards,
    stored through ``up``; the ingest index (when given) skips unchanged files and shards."""

    def __init__(self, up, options, chunk_options, index, progress, read_started_ns):
        self.up = up
        self.options = options
        self.chunk_options = chunk_options
        self.index = index
        self.progress = progress
        self.read_started_ns = read_started_ns
        self.scope = f"{_RECORD_SCOPE};{chunk_options.fingerprint()}"
        self.cutter = BoundaryCutter(options)
        self.key_prefix = shard_key_prefix(FILES_SCHEMA, options)
        self.pending: list[_Record] = []
        self.futures = []
        self.job: list[tuple[_Builder, str | None]] = []
        self.job_weight = 0
        self.files_read = 0
        self._lock = threading.Lock()
        self.readers = ThreadPoolExecutor(_READERS, thread_name_prefix="tierdata-read")

    # ------------------------------------------------------------ records

    def run_source(self, spec: SourceSpec, entries: list[FileEntry]) -> SourceStats:
        digest = hasher()
        for records in self.hashed(entries, spec.display):
            self.take(records, digest)
        return self.source_stats(spec, entries, digest)

    def hashed(self, entries: list[FileEntry], display: str) -> Iterator[list[_Record]]:
        """The records of ``entries`` a group at a time, each knowing its hash and size."""

        def loaded() -> Iterator[tuple[list[_Record], pa.LargeBinaryArray]]:
            for group in _groups(entries, self.chunk_options.threshold):
                records = self._lookup(group, display)
                yield records, self._load(records, display)

        # The next group's files are read while this one is hashed and cut.
        for records, data in read_ahead(loaded(), depth=2):
            self._hash_fresh(records, data)
            yield records

    def take(self, records: list[_Record], digest) -> None:
        """Cut hashed records into shards (queued to be stored) and add them to the source digest."""
        digest.update(digest_part(records))
        self._cut(records)
        self.up.check()

    def source_stats(self, spec: SourceSpec, entries: list[FileEntry], digest) -> SourceStats:
        """A source's stats once all its records are taken; the index forgets its deleted files."""
        if self.index is not None:
            self.index.forget_files_under(spec.path, {e.abspath for e in entries})
        stats = SourceStats()
        stats.records = len(entries)
        stats.hash = digest.hexdigest()
        stats.bytes = sum(e.size for e in entries)
        return stats

    def _lookup(self, entries: list[FileEntry], display: str) -> list[_Record]:
        """One record per file; those the index knows carry their hash and size (not read)."""
        if self.index is None:
            return [_Record(e, display) for e in entries]
        hits = self.index.files(entries, self.scope)
        return [
            _Record(e, display) if h is None else _Record(e, display, h.chunks, h.hash, h.size, True)
            for e, h in zip(entries, hits)
        ]

    def _load(self, records: list[_Record], display: str) -> pa.LargeBinaryArray:
        """Read the files the index did not know: small ones whole (in parallel), big ones chunked.

        Returns the ``data`` column of those records, in order (null for a chunked file):
        the small files are read straight into one buffer, which that column views.
        """
        fresh = [r.entry for r in records if not r.known]
        small = np.fromiter((e.size < self.chunk_options.threshold for e in fresh), bool, len(fresh))
        sizes = np.fromiter((e.size for e in fresh), np.int64, len(fresh)) * small
        offsets = np.zeros(len(fresh) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # Arrow's pool reuses freed memory: a fresh numpy buffer per group page-faulted in
        # (zero-filled by the kernel) cost ~3 ms per 32 MiB.
        buf = pa.allocate_buffer(int(offsets[-1]))
        out = memoryview(buf).cast("B")
        # Groups of files per task: one task per file costs more in the pool than the read.
        picked = np.flatnonzero(small).tolist()
        starts = offsets.tolist()
        jobs = [picked[i : i + _READ_GROUP] for i in range(0, len(picked), _READ_GROUP)]

        def read(job: list[int]) -> None:
            read_files_into([fresh[i] for i in job], display, out, [starts[i] for i in job])

        for _ in self.readers.map(read, jobs):
            pass
        for r in records:
            if not r.known and r.entry.size >= self.chunk_options.threshold:
                r.chunks = self._store_chunks(r.entry, r.display)
        self.count_reads(len(fresh))
        if self.progress is not None:
            self.progress(sum(r.entry.size for r in records))
        validity = None if small.all() else pa.py_buffer(np.packbits(small, bitorder="little"))
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(fresh), [validity, pa.py_buffer(offsets), buf]
        )

    def count_reads(self, n: int) -> None:
        with self._lock:
            self.files_read += n

    def _store_chunks(self, entry: FileEntry, display: str) -> tuple[str, ...]:
        """Chunk a big file and store its chunks; return their ids.

        The record's size is the listed one, so the file must still have it: fewer or
        more bytes read, or another size or mtime once read (a file being appended to
        or rewritten), is a BadInputError, and the ingest stages nothing.
        """
        level = self.chunk_options.compression_level
        subject = f"{display}/{entry.path}"
        futures = []
        read = 0
        try:
            with open(entry.abspath, "rb") as f:
                for raw in iter_chunks(f, self.chunk_options):
                    read += len(raw)
                    futures.append(self.up.submit(len(raw), _store_chunk, self.up, raw, level))
                st = os.fstat(f.fileno())
        except FileNotFoundError as e:
            raise BadInputError("file vanished while being ingested", subject=subject) from e
        except OSError as e:
            raise BadInputError(f"cannot read: {e.strerror or e}", subject=subject) from e
        if read != entry.size or st.st_size != entry.size or st.st_mtime_ns != entry.mtime_ns:
            for future in futures:
                future.cancel()
            raise changed_while_read(subject)
        return tuple(f.result() for f in futures)

    def _hash_fresh(self, records: list[_Record], data: pa.LargeBinaryArray) -> None:
        fresh = [r for r in records if not r.known]
        if not fresh:
            return
        batch = _batch(fresh, data)
        digests = hash_records(batch)
        hashes = digests.hashes.buffers()[1].to_pybytes()
        sizes = digests.sizes.tolist()
        for i, r in enumerate(fresh):
            r.hash, r.size, r.batch, r.row = hashes[16 * i : 16 * i + 16], sizes[i], batch, i
        if self.index is not None:
            self.index.remember_files(
                [(r.entry, r.hash, r.size, r.chunks) for r in fresh],
                self.scope,
                read_started_ns=self.read_started_ns,
            )

    # ------------------------------------------------------------ shards

    def _cut(self, records: list[_Record]) -> None:
        hashes = hash_array(records)
        sizes = np.fromiter((r.size for r in records), np.int64, len(records))
        start = 0
        for end in self.cutter.feed(digest_prefixes(hashes), sizes):
            self._emit(self.pending + records[start:end])
            self.pending = []
            start = end
        self.pending.extend(records[start:])

    def finish(self) -> list[ShardInfo]:
        if self.pending:
            self._emit(self.pending)
            self.pending = []
            self.cutter.reset()
        self._submit_job()
        return [info for f in self.futures for info in f.result()]

    def close(self) -> None:
        self.readers.shutdown(wait=True, cancel_futures=True)

    def _emit(self, records: list[_Record]) -> None:
        joined = b"".join([r.hash for r in records])
        key = shard_key(FILES_SCHEMA, joined, self.key_prefix) if self.index is not None else None
        self.job.append((_Builder(records, joined, self.up, self.chunk_options, self.count_reads), key))
        self.job_weight += sum([r.size for r in records])
        if self.job_weight >= _JOB_BYTES:
            self._submit_job()

    def _submit_job(self) -> None:
        """Hand the collected shards to one worker job (a future per shard costs more than encoding it)."""
        if self.job:
            job, weight, self.job, self.job_weight = self.job, self.job_weight, [], 0
            self.futures.append(
                self.up.submit(weight, store_pending_many, self.up, job, self.options, self.index)
            )


_READ_GROUP = 128


class _Builder:
    """Builds a shard's table when it must be encoded, reading files the index knew.

    Records read by this ingest are slices of the batches they were hashed in; the
    encoder copies the slices into fresh arrays, so the shard bytes are those of one
    batch built from the same values.
    """

    def __init__(self, records, joined_hashes: bytes, up: Uploader, chunk_options: ChunkOptions, count_reads):
        self.records, self.joined = records, joined_hashes
        self.up, self.chunk_options, self.count_reads = up, chunk_options, count_reads

    def __call__(self) -> PendingShard:
        n = len(self.records)
        hashes = pa.FixedSizeBinaryArray.from_buffers(RECORD_HASH_TYPE, n, [None, pa.py_buffer(self.joined)])
        sizes = np.fromiter((r.size for r in self.records), np.int64, n)
        parts = [self._known(run) if run[0].known else _slice(run) for run in _runs(self.records)]
        return PendingShard(pa.Table.from_batches(parts, schema=FILES_SCHEMA), hashes, sizes)

    def _known(self, run: list[_Record]) -> pa.RecordBatch:
        """Read the files of records the index knew and check they still hash the same."""
        data = []
        for r in run:
            if r.chunks is None:
                data.append(read_small_file(r.entry, r.display))
                self.count_reads(1)
            else:
                self._restore_missing_chunks(r)
                data.append(None)
        batch = _batch(run, data)
        check = hash_records(batch).hashes
        expected = hash_array(run)
        if not check.equals(expected):
            bad = next(r for r, a, b in zip(run, check, expected) if a != b)
            raise BadInputError(
                "file changed while being ingested (same size and mtime, other bytes)",
                subject=f"{bad.display}/{bad.entry.path}",
                hint="run the ingest again",
            )
        return batch

    def _restore_missing_chunks(self, r: _Record) -> None:
        if all(self.up.objects.touch_if_exists(c) for c in r.chunks):
            return
        level = self.chunk_options.compression_level
        with open(r.entry.abspath, "rb") as f:
            ids = tuple(_store_chunk(self.up, raw, level) for raw in iter_chunks(f, self.chunk_options))
        if ids != r.chunks:
            raise changed_while_read(f"{r.display}/{r.entry.path}")


def _store_chunk(up: Uploader, raw: bytes, level: int) -> str:
    stored = pack_chunk(raw, level)
    oid = up.objects.hash(stored)
    up.put(oid, stored)
    return oid


def _batch(records: list[_Record], data: list[bytes | None] | pa.LargeBinaryArray) -> pa.RecordBatch:
    return files_batch(
        [r.entry.path for r in records],
        [r.entry.size for r in records],
        data,
        [list(r.chunks) if r.chunks is not None else None for r in records],
    )


def _runs(records: list[_Record]) -> Iterator[list[_Record]]:
    """Split records into runs: consecutive rows of one hashed batch, or records the index knew."""
    start = 0
    for i in range(1, len(records) + 1):
        if i < len(records):
            a, b = records[i - 1], records[i]
            if a.known == b.known and (a.known or (a.batch is b.batch and a.row + 1 == b.row)):
                continue
        yield records[start:i]
        start = i


def _slice(run: list[_Record]) -> pa.RecordBatch:
    return run[0].batch.slice(run[0].row, len(run))


def digest_part(records: list[_Record]) -> bytes:
    """What records add to their source's digest: each path and record hash."""
    return b"".join([r.entry.path.encode() + b"\0" + r.hash for r in records])


def hash_array(records: list[_Record]) -> pa.FixedSizeBinaryArray:
    """The records' hashes as one ``fixed_size_binary(16)`` array."""
    buf = pa.py_buffer(b"".join(r.hash for r in records))
    return pa.FixedSizeBinaryArray.from_buffers(RECORD_HASH_TYPE, len(records), [None, buf])


def ingest_files(
    specs: list[SourceSpec],
    up: Uploader,
    options: ShardOptions,
    chunk_options: ChunkOptions,
    index: IngestIndex | None,
    *,
    progress: Callable[[int], None] | None,
    read_started_ns: int,
    lanes: int = 1,
) -> FilesOutcome:
    """Walk the directories (or single files) of ``specs`` and store their records as shards.

    With ``lanes=2``, one big directory is ingested by this process and a forked child
    (see :mod:`datastore._lanes`): the same shards, on two cores.
    """
    listings = [(spec, walk_files(spec.path, spec.display)) for spec in specs]
    _check_unique(listings)
    if lanes > 1 and len(listings) == 1:
        from datastore._lanes import ingest_in_two_lanes, two_lanes_pay

        spec, entries = listings[0]
        if two_lanes_pay(entries):
            return ingest_in_two_lanes(
                spec,
                entries,
                up,
                options,
                chunk_options,
                index,
                progress=progress,
                read_started_ns=read_started_ns,
            )
    run = FilesIngest(up, options, chunk_options, index, progress, read_started_ns)
    try:
        stats = [run.run_source(spec, entries) for spec, entries in listings]
        shards = run.finish()
    finally:
        run.close()
    return FilesOutcome(FILES_SCHEMA, shards, stats, run.files_read)


def _groups(entries: list[FileEntry], threshold: int):
    """Consecutive entries: at most ``_GROUP_FILES`` files or about ``_GROUP_BYTES`` of files
    read whole (big files are chunked as a stream and do not count)."""
    group, size = [], 0
    for e in entries:
        group.append(e)
        size += e.size if e.size < threshold else 0
        if len(group) >= _GROUP_FILES or size >= _GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


def _check_unique(listings) -> None:
    if len(listings) < 2:
        return
    seen: dict[str, str] = {}
    for spec, entries in listings:
        for e in entries:
            other = seen.setdefault(e.path, spec.display)
            if other != spec.display:
                raise BadInputError(
                    f"path {e.path!r} is in both {other} and {spec.display}",
                    subject=spec.display,
                    hint="ingest the directories separately",
                )
