"""Ingest: sources in, shards (and big-file chunks) stored as content-addressed objects.

The pipeline streams: read a block of input → hash its records → cut shards at
content-defined boundaries → encode, hash and store each shard on a bounded pool of
threads (see :mod:`datastore._pipeline`), so memory stays bounded for any input size
and both cores work. Nothing but content-addressed objects is written: a failed ingest
leaves only unreferenced objects (``dataset gc`` removes them), and the caller stages
the returned :class:`IngestResult` only on success.

With an ingest index (:mod:`datastore.ingestindex`), a re-ingest does not read files
that kept their size and mtime and does not re-encode shards whose records are
unchanged, so its cost follows the change, not the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from cachetier.errors import BadInputError
from cachetier.objects import ObjectStore
from datastore._ingestfiles import ingest_files
from datastore._pipeline import Uploader, read_ahead, store_pending
from datastore._schema import conform, fits_schema, same_types
from datastore.chunking import ChunkOptions
from datastore.ingestindex import IngestIndex
from datastore.shards import DEFAULT_SHARD_SIZE, FILES_SHARD_SIZE, ShardInfo, ShardOptions, ShardWriter
from datastore.sources import (
    ReadContext,
    SchemaWidened,
    SourceSpec,
    SourceStats,
    read_source,
    resolve_sources,
    scan_schema,
)

__all__ = ["DEFAULT_BLOCK_BYTES", "IngestResult", "SourceInfo", "ingest"]

DEFAULT_BLOCK_BYTES = 16 << 20
INDEX_FILE_NAME = "index.json"
_MAX_RESTARTS = 16


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Provenance of one source: where it was, how big, its content hash, what it gave."""

    path: str
    format: str
    size: int
    mtime_ns: int
    hash: str | None
    records: int
    skipped: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for the version record's ``operation.sources``)."""
        return {
            "path": self.path,
            "format": self.format,
            "size": self.size,
            "mtime": self.mtime_ns / 1e9,
            "mtime_ns": self.mtime_ns,
            "hash": self.hash,
            "records": self.records,
            "skipped": self.skipped,
        }


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What an ingest produced: the schema, the stored shards in order, counts, provenance.

    ``bytes`` counts stored shard bytes; ``new_bytes``/``new_objects`` what this ingest
    actually had to write (shards and chunks that were not stored yet);
    ``reused_shards`` the shards taken from the ingest index without encoding;
    ``files_read`` the files of a ``files`` source that were opened.
    """

    schema: pa.Schema
    shards: tuple[ShardInfo, ...]
    records: int
    bytes: int
    uncompressed_bytes: int
    skipped: int
    sources: tuple[dict[str, Any], ...]
    format: str
    options: dict[str, Any] = field(default_factory=dict)
    text_column: str | None = None
    new_bytes: int = 0
    new_objects: int = 0
    reused_shards: int = 0
    files_read: int = 0

    @property
    def shard_size(self) -> int:
        """The target shard size the shards were cut with."""
        return int(self.options["shard_size"])

    @property
    def chunks(self) -> tuple[str, ...]:
        """Every big-file chunk id the shards reference, in first-use order."""
        return tuple(dict.fromkeys(c for s in self.shards for c in s.chunks))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    on_error: str
    text_column: str | None
    block_bytes: int
    progress: Callable[[int], None] | None
    chunk_options: ChunkOptions
    lanes: int = 1


def ingest(
    sources: Sequence[str | os.PathLike[str]],
    objects: ObjectStore,
    *,
    format: str = "auto",
    shard_size: int | None = None,
    text_column: str | None = None,
    on_error: str = "fail",
    index: str | os.PathLike[str] | IngestIndex | None = None,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    chunk_options: ChunkOptions | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    lanes: int = 2,
    prefer_schema: pa.Schema | None = None,
    delta_bases: Callable[[AbstractSet[str]], Iterable[tuple[str, Sequence[str]]]] | None = None,
) -> IngestResult:
    """Read ``sources`` and store their records as shards in ``objects``.

    Raises NotFoundError for a missing path and BadInputError (one line naming
    ``file:line``) for bad input, unless ``on_error="skip"``, which drops bad records and
    counts them in ``IngestResult.skipped``. ``index`` is the ingest index (a file, a
    folder to keep ``index.json`` in, or an :class:`IngestIndex`); ``progress(n)`` is
    called with input bytes as they are read. ``shard_size=None`` means the default
    (16 MiB; 64 KiB for a ``files`` dataset, so an edited file rewrites little: its small
    shards are stored together in packs, see :mod:`cachetier.packs`). A big directory is
    ingested by up to ``lanes`` processes (see :mod:`datastore._lanes`); the shards are the same.
    ``prefer_schema`` (the schema of the data this will join) is taken when the sources'
    own schema differs from it only in column order or in columns that hold no values here,
    so data that fits it can be appended to it. ``delta_bases`` yields (shard id, anchors)
    of stored shards an edit may have rewritten (see :meth:`IngestIndex.learn_anchors_from`):
    with it, a rewritten shard finds its delta base without an index that remembers it (an
    in-memory index stands in where ``index`` is None).
    """
    if on_error not in ("fail", "skip"):
        raise BadInputError(
            f"unknown error policy {on_error!r}", subject="--on-error", hint="use fail or skip"
        )
    specs = resolve_sources(sources, format)
    files = specs[0].format == "files"
    if shard_size is None:
        shard_size = FILES_SHARD_SIZE if files else DEFAULT_SHARD_SIZE
    options = ShardOptions(shard_size=shard_size, algorithm=objects.algorithm)
    settings = _Settings(
        on_error=on_error,
        text_column=text_column,
        block_bytes=block_bytes,
        progress=progress,
        chunk_options=chunk_options or ChunkOptions(),
        lanes=lanes,
    )
    idx = _open_index(index, objects)
    if delta_bases is not None:
        idx = idx if idx is not None else IngestIndex(None, repo=objects.store.url)
        idx.learn_anchors_from(delta_bases)
    workers = workers or max(2, os.cpu_count() or 1)
    budget = max(64 << 20, 2 * workers * shard_size)
    if specs[0].format == "files":
        with Uploader(objects, workers=workers, budget=budget) as up:
            result = _ingest_files(specs, up, options, settings, idx)
    else:
        result = _ingest_tables_with_restarts(
            specs, objects, options, settings, idx, workers, budget, prefer_schema
        )
    if idx is not None:
        idx.save()
    return result


def _open_index(index, objects: ObjectStore) -> IngestIndex | None:
    if index is None or isinstance(index, IngestIndex):
        return index
    path = Path(index)
    if path.is_dir() or not path.suffix:
        path = path / INDEX_FILE_NAME
    return IngestIndex.load(path, repo=objects.store.url)


def _ingest_files(specs, up: Uploader, options, settings: _Settings, idx) -> IngestResult:
    outcome = ingest_files(
        specs,
        up,
        options,
        settings.chunk_options,
        idx,
        progress=settings.progress,
        read_started_ns=time.time_ns(),
        lanes=settings.lanes,
    )
    return _result(
        outcome.schema,
        outcome.shards,
        outcome.stats,
        specs,
        "files",
        options,
        settings,
        up,
        outcome.files_read,
    )


def _ingest_tables_with_restarts(
    specs, objects, options, settings, idx, workers, budget, prefer: pa.Schema | None
) -> IngestResult:
    hint = _schema_hint(specs, idx, settings)
    for attempt in range(_MAX_RESTARTS):
        up = Uploader(objects, workers=workers, budget=budget)
        try:
            schema, shards, stats = _ingest_tables(specs, up, options, settings, idx, hint)
        except SchemaWidened as widened:
            up.close(cancel=True)
            # A second widening: find every late column in one types-only pass instead.
            hint = widened.schema if attempt < 1 else scan_schema(specs, widened.schema, settings.block_bytes)
            continue
        except BaseException:
            up.close(cancel=True)
            raise
        if hint is not prefer and _should_take(schema, prefer):
            up.close(cancel=True)
            hint = prefer  # read again in the schema of the data this joins
            continue
        up.close()
        if idx is not None and schema is not None:
            context = _schema_context(specs, settings)
            for spec in specs:
                idx.remember_schema(spec.path, spec.size, spec.mtime_ns, schema, context)
        return _result(schema, shards, stats, specs, specs[0].format, options, settings, up, 0)
    raise BadInputError(
        "the schema kept changing while reading",
        subject=specs[0].display,
        hint="are some JSON keys data rather than column names?",
    )


def _should_take(schema: pa.Schema | None, prefer: pa.Schema | None) -> bool:
    """True when data read as ``schema`` should be read again as ``prefer`` (it fits it)."""
    if prefer is None or schema is None or same_types(schema, prefer):
        return False
    return fits_schema(schema, prefer)


def _schema_context(specs: list[SourceSpec], settings: _Settings) -> str:
    """What besides a source's own bytes decides the schema it is read with: its format, the
    reader options, and the sources read beside it (their columns join the schema)."""
    sources = [(s.path, s.format, s.size, s.mtime_ns) for s in specs]
    key = json.dumps([sources, settings.text_column, settings.on_error])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _schema_hint(specs: list[SourceSpec], idx: IngestIndex | None, settings: _Settings) -> pa.Schema | None:
    """The schema the last ingest of these same, unchanged sources, read the same way, ended with."""
    if idx is None:
        return None
    context = _schema_context(specs, settings)
    hints = [idx.schema_hint(s.path, s.size, s.mtime_ns, context) for s in specs]
    if any(h is None for h in hints) or any(not h.equals(hints[0]) for h in hints):
        return None
    return hints[0]


def _ingest_tables(specs, up: Uploader, options, settings: _Settings, idx, hint):
    writer = ShardWriter(options)
    futures = []
    schema, locked, shard_schema = hint, None, None
    stats: list[SourceStats] = []

    def submit(pendings) -> None:
        for pending in pendings:
            key = pending.key(options) if idx is not None else None
            futures.append(up.submit(int(pending.sizes.sum()), store_pending, up, pending, key, options, idx))

    for spec in specs:
        ctx = ReadContext(
            spec=spec,
            schema=schema,
            locked_by=locked,
            on_error=settings.on_error,
            block_bytes=settings.block_bytes,
            text_column=settings.text_column or "text",
            progress=settings.progress,
        )
        for batch in read_ahead(read_source(ctx)):
            if batch.num_rows == 0:
                continue
            if shard_schema is None:
                shard_schema = batch.schema
                _check_columns(shard_schema, settings.text_column, spec)
            submit(writer.add(conform(batch, shard_schema)))
            up.check()
        schema, locked = ctx.schema, ctx.locked_by
        stats.append(ctx.stats)
    submit(writer.finish())
    shards = [f.result() for f in futures]
    if schema is not None and shard_schema is None:
        _check_columns(schema, settings.text_column, specs[0])
    return schema, shards, stats


def _check_columns(schema: pa.Schema, text_column: str | None, spec: SourceSpec) -> None:
    """Refuse reserved column names (``__*`` are hidden shard columns) and a bad --text-column."""
    reserved = [n for n in schema.names if n.startswith("__")]
    if reserved:
        raise BadInputError(
            f"column name {reserved[0]!r} is reserved (names starting with '__' are hidden columns)",
            subject=spec.display,
            hint="rename the column",
        )
    if text_column is not None and spec.format != "text":
        _check_text_column(text_column, schema)


def _check_text_column(column: str, schema: pa.Schema) -> None:
    if column not in schema.names:
        raise BadInputError(
            f"no column {column!r} in the sources",
            subject="--text-column",
            hint=f"columns: {', '.join(schema.names)}",
        )
    t = schema.field(column).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise BadInputError(f"column {column!r} holds {t}, not text", subject="--text-column")


def _result(schema, shards, stats, specs, fmt, options, settings, up: Uploader, files_read) -> IngestResult:
    sources = tuple(
        SourceInfo(spec.display, spec.format, size, spec.mtime_ns, st.hash, st.records, st.skipped).to_dict()
        for spec, st, size in zip(specs, stats, _sizes(specs, stats))
    )
    return IngestResult(
        schema=schema if schema is not None else pa.schema([]),
        shards=tuple(shards),
        records=sum(s.records for s in shards),
        bytes=sum(s.bytes for s in shards),
        uncompressed_bytes=sum(s.uncompressed_bytes for s in shards),
        skipped=sum(s.skipped for s in stats),
        sources=sources,
        format=fmt,
        options={
            "shard_size": options.shard_size,
            "compression": f"zstd:{options.compression_level}",
            "chunk_threshold": settings.chunk_options.threshold,
            "chunk_avg_size": settings.chunk_options.avg_size,
        },
        text_column=settings.text_column or ("text" if fmt == "text" else None),
        new_bytes=up.new_bytes,
        new_objects=up.new_objects,
        reused_shards=up.reused_shards,
        files_read=files_read,
    )


def _sizes(specs, stats) -> list[int]:
    return [st.bytes or spec.size for spec, st in zip(specs, stats)]
