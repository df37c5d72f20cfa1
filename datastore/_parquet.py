"""Parquet reader: row group by row group, types exactly as stored.

Schema-level metadata (e.g. pandas' index description) is dropped; column types,
nullability and field metadata are kept. A file that is not Parquet, truncated, or with
a corrupt row group fails naming the file (and the row group).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from cachetier.errors import BadInputError
from cachetier.hashing import hasher
from datastore._schema import conform
from datastore._sourcebase import ReadContext

__all__ = ["read_parquet"]

_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, EOFError)


def read_parquet(ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Yield the records of a Parquet file in batches of about ``ctx.block_bytes``."""
    display = ctx.spec.display
    try:
        pf = pq.ParquetFile(ctx.spec.path)
        schema = pf.schema_arrow.remove_metadata()
    except _ERRORS as e:
        raise BadInputError(f"not a Parquet file, or truncated ({_first_line(e)})", subject=display) from e
    names = schema.names
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate is not None:
        raise BadInputError(f"duplicate column name {duplicate!r}", subject=display, hint="rename the column")
    ctx.fix_schema(schema)
    schema = ctx.schema  # the file's, or a known one it fits
    meta = pf.metadata
    for index in range(meta.num_row_groups):
        group = meta.row_group(index)
        rows = max(group.num_rows, 1)
        batch_rows = max(1, min(rows, ctx.block_bytes * rows // max(group.total_byte_size, 1)))
        try:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[index]):
                batch = conform(batch.replace_schema_metadata(None), schema)
                ctx.stats.records += batch.num_rows
                yield batch
        except _ERRORS as e:
            raise BadInputError(f"row group {index} is corrupt ({_first_line(e)})", subject=display) from e
        if ctx.progress is not None:
            ctx.progress(group.total_compressed_size)
    ctx.stats.hash = _file_hash(ctx.spec.path)


def _file_hash(path: str) -> str:
    h = hasher()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
