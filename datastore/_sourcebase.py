"""What every source reader shares: the source spec, its counters, the read context.

Schema negotiation across the sources of one ingest: the first block of the first source
defines the schema; readers of inferred formats (JSON Lines, CSV) parse with it and may
need it wider (a new column, an int column that meets a float). Batches already handed
on were built with the old types, so the reader raises :class:`SchemaWidened` and the
ingest starts over with the wider schema, which then holds from the first record on; the
widening rules form a lattice (:mod:`datastore._schema`), so this ends after a few
rounds at the same schema in every process, whatever the block size. Fixed-type sources
(Parquet, text, files) *lock* the schema: a later source that does not fit is an error
naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa

from cachetier.errors import BadInputError
from datastore._schema import fits_schema, same_types

__all__ = ["FORMATS", "ReadContext", "SchemaWidened", "SourceSpec", "SourceStats"]

FORMATS = ("jsonl", "parquet", "csv", "text", "files")


class SchemaWidened(Exception):
    """A source needs a wider schema than the one in use: the ingest restarts with it."""

    def __init__(self, schema: pa.Schema, where: str):
        super().__init__(f"{where}: schema widened to {schema}")
        self.schema = schema
        self.where = where


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """One input file or directory, resolved: absolute path, the name to show, its format."""

    path: str
    display: str
    format: str
    size: int
    mtime_ns: int


@dataclass(slots=True)
class SourceStats:
    """What reading one source found: records kept, records skipped, the content hash."""

    records: int = 0
    skipped: int = 0
    hash: str | None = None
    bytes: int = 0  # input bytes, where the file size does not say it (a directory)


@dataclass(slots=True, kw_only=True)
class ReadContext:
    """The state a reader works with: the schema so far and the error policy."""

    spec: SourceSpec
    schema: pa.Schema | None = None
    locked_by: str | None = None
    on_error: str = "fail"
    block_bytes: int = 16 << 20
    text_column: str = "text"
    progress: Callable[[int], None] | None = None
    stats: SourceStats = field(default_factory=SourceStats)

    @property
    def skip(self) -> bool:
        """True when bad records are skipped (and counted) instead of failing."""
        return self.on_error == "skip"

    @property
    def locked(self) -> bool:
        """True when a fixed-type source set the schema, so it cannot widen."""
        return self.locked_by is not None

    def define_schema(self, schema: pa.Schema) -> None:
        """Set the schema from this source's first block (only when none is known)."""
        if self.schema is not None:
            raise RuntimeError("schema already defined")
        self.schema = schema

    def widen(self, schema: pa.Schema | None, where: str, column: str | None = None) -> None:
        """Ask for a wider schema: raise SchemaWidened, or BadInputError if that is impossible."""
        if schema is None or self.locked:
            against = f" of {self.locked_by}" if self.locked else " of the earlier records"
            what = f"column {column!r}" if column else "the records"
            raise BadInputError(
                f"{what} do not fit the schema{against}",
                subject=where,
                hint="all sources of one ingest need one schema",
            )
        raise SchemaWidened(schema, where)

    def fix_schema(self, schema: pa.Schema) -> None:
        """A fixed-type source: adopt its schema, keep the known one if the source fits it
        losslessly (see :func:`~datastore._schema.fits_schema`), or fail naming the first
        difference. The source's records are then read in ``self.schema``."""
        if self.schema is not None and fits_schema(schema, self.schema):
            self.locked_by = self.locked_by or self.spec.display
            return
        if self.schema is not None and not same_types(self.schema, schema):
            raise BadInputError(
                f"schema differs from the earlier sources: {_difference(self.schema, schema)}",
                subject=self.spec.display,
                hint="ingest sources with different columns separately",
            )
        self.schema = schema
        self.locked_by = self.locked_by or self.spec.display

    def empty_source(self) -> None:
        """Called for a source without a single record: an error unless skipping."""
        if not self.skip:
            raise BadInputError(
                "empty file: no records", subject=self.spec.display, hint="remove it from the sources"
            )


def _difference(before: pa.Schema, here: pa.Schema) -> str:
    for f in here:
        if f.name not in before.names:
            return f"column {f.name!r} is new here"
        other = before.field(f.name)
        if not other.type.equals(f.type):
            return f"column {f.name!r} is {f.type} here, {other.type} before"
    missing = [n for n in before.names if n not in here.names]
    if missing:
        return f"column {missing[0]!r} is missing here"
    return "the columns are in another order"
