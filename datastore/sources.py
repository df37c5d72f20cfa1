"""Source readers: JSON Lines, Parquet, CSV/TSV, plain text lines and directories of files.

:func:`resolve_sources` checks every path up front (a missing path fails before anything
is read) and picks each format: with ``format="auto"`` by extension (``.jsonl``
``.ndjson`` ``.json`` → jsonl, ``.parquet`` ``.pq`` → parquet, ``.csv`` ``.tsv`` → csv,
``.txt`` → text; a ``.gz``/``.zst`` suffix is decompressed on the fly) and a directory
is a ``files`` dataset; with an explicit tabular format a directory stands for the
files in it with that format's extensions.

:func:`read_source` streams one source as record batches of bounded size (about
``block_bytes`` of input each) through pyarrow's fast readers; bad input fails with a
one-line :class:`~cachetier.errors.BadInputError` naming ``file:line`` and what is
wrong, or with ``on_error="skip"`` the bad records are dropped and counted. Types of
JSON Lines and CSV are inferred over the whole file (see :mod:`datastore._sourcebase`),
Parquet keeps its types exactly, and all sources of one ingest share one schema.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from cachetier.errors import BadInputError, NotFoundError
from datastore._csv import read_csv
from datastore._input import compression_of
from datastore._jsonl import read_jsonl, scan_jsonl_schema
from datastore._parquet import read_parquet
from datastore._schema import conform
from datastore._sourcebase import FORMATS, ReadContext, SchemaWidened, SourceSpec, SourceStats
from datastore._text import read_text

__all__ = [
    "FORMATS",
    "ReadContext",
    "SchemaWidened",
    "SourceSpec",
    "SourceStats",
    "detect_format",
    "read_source",
    "read_table",
    "resolve_sources",
    "scan_schema",
]

_EXTENSIONS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
}
_READERS: dict[str, Callable[[ReadContext], Iterator[pa.RecordBatch]]] = {
    "jsonl": read_jsonl,
    "csv": read_csv,
    "text": read_text,
    "parquet": read_parquet,
}


def detect_format(path: str) -> str | None:
    """The format a file's extension names (a compression suffix is looked through), or None."""
    name = path.lower()
    if compression_of(name):
        name = os.path.splitext(name)[0]
    return _EXTENSIONS.get(os.path.splitext(name)[1])


def resolve_sources(paths: Sequence[str | os.PathLike[str]], format: str = "auto") -> list[SourceSpec]:
    """Check and expand the source paths; return one :class:`SourceSpec` per input, in order."""
    if format != "auto" and format not in FORMATS:
        raise BadInputError(
            f"unknown format {format!r}", subject="--format", hint=f"use auto or {', '.join(FORMATS)}"
        )
    if not paths:
        raise BadInputError("no sources given", subject="ingest", hint="name at least one file or directory")
    specs: list[SourceSpec] = []
    for raw in paths:
        display = os.fspath(raw)
        path = os.path.abspath(display)
        try:
            st = os.stat(path)
        except FileNotFoundError as e:
            raise NotFoundError("no such file or directory", subject=display) from e
        except PermissionError as e:
            raise BadInputError("permission denied", subject=display) from e
        is_dir = os.path.isdir(path)
        if format == "files" or (format == "auto" and is_dir):
            specs.append(SourceSpec(path, display, "files", st.st_size, st.st_mtime_ns))
        elif is_dir:
            specs.extend(_expand_directory(path, display, format))
        else:
            kind = format if format != "auto" else detect_format(path)
            if kind is None:
                raise BadInputError(
                    "cannot tell the format from the file name",
                    subject=display,
                    hint="pass --format jsonl|parquet|csv|text|files",
                )
            specs.append(SourceSpec(path, display, kind, st.st_size, st.st_mtime_ns))
    kinds = {s.format for s in specs}
    if "files" in kinds and len(kinds) > 1:
        raise BadInputError(
            "a directory of files cannot be ingested together with tabular sources",
            subject=next(s.display for s in specs if s.format == "files"),
            hint="ingest them separately",
        )
    return specs


_MAX_RESTARTS = 16


def _too_many_restarts(specs: Sequence[SourceSpec]) -> BadInputError:
    return BadInputError(
        "the schema kept changing while reading",
        subject=specs[0].display,
        hint="are some JSON keys data rather than column names?",
    )


def _expand_directory(path: str, display: str, format: str) -> list[SourceSpec]:
    found = []
    for folder, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(folder, name)
            if detect_format(full) == format:
                st = os.stat(full)
                shown = os.path.join(display, os.path.relpath(full, path))
                found.append(SourceSpec(full, shown, format, st.st_size, st.st_mtime_ns))
    if not found:
        raise BadInputError(f"no {format} files in the directory", subject=display, hint="check --format")
    found.sort(key=lambda s: s.path)
    return found


def scan_schema(specs: Sequence[SourceSpec], schema: pa.Schema, block_bytes: int = 16 << 20) -> pa.Schema:
    """Widen ``schema`` over every JSON Lines source in one types-only pass.

    An ingest that had to restart more than once calls this, so the number of restarts
    stays small however late new columns appear.
    """
    for spec in specs:
        if spec.format == "jsonl":
            schema = scan_jsonl_schema(spec.path, spec.display, schema, block_bytes)
    return schema


def read_source(ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Stream one tabular source as record batches of ``ctx.schema`` (defined or checked).

    May raise :class:`SchemaWidened` (start over with the wider schema) and
    :class:`~cachetier.errors.BadInputError` naming ``file:line``.
    """
    reader = _READERS.get(ctx.spec.format)
    if reader is None:
        raise BadInputError(f"{ctx.spec.format!r} sources are not read as tables", subject=ctx.spec.display)
    for batch in reader(ctx):
        if not batch.schema.equals(ctx.schema):
            batch = conform(batch, ctx.schema)
        yield batch


def read_table(
    paths: Sequence[str | os.PathLike[str]],
    format: str = "auto",
    *,
    on_error: str = "fail",
    text_column: str = "text",
) -> tuple[pa.Table, list[SourceStats]]:
    """Read tabular sources into one in-memory table (small data, tests, previews)."""
    specs = resolve_sources(paths, format)
    hint: pa.Schema | None = None
    for attempt in range(_MAX_RESTARTS):
        try:
            schema, locked, batches, stats = hint, None, [], []
            for spec in specs:
                ctx = ReadContext(
                    spec=spec, schema=schema, locked_by=locked, on_error=on_error, text_column=text_column
                )
                batches.extend(read_source(ctx))
                schema, locked = ctx.schema, ctx.locked_by
                stats.append(ctx.stats)
            break
        except SchemaWidened as widened:
            hint = widened.schema if attempt < 1 else scan_schema(specs, widened.schema)
    else:
        raise _too_many_restarts(specs)
    if schema is None:
        schema = pa.schema([])
    return pa.Table.from_batches([conform(b, schema) for b in batches], schema=schema), stats
