"""Plain text reader: one record per line, in one string column (``text`` by default).

Lines end at ``\\n``; a ``\\r`` before it is dropped (Windows line ends), as is a UTF-8
byte order mark at the start; every other byte is kept, blank lines included. Lines must
be UTF-8 without NUL bytes; a bad line fails naming it, or is skipped and counted with
``on_error="skip"``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from cachetier.errors import BadInputError
from datastore._input import iter_line_blocks, open_input
from datastore._sourcebase import ReadContext

__all__ = ["read_text"]


def read_text(ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Yield the lines of a text file as batches with one string column."""
    schema = pa.schema([pa.field(ctx.text_column, pa.string())])
    ctx.fix_schema(schema)
    with open_input(ctx.spec.path, ctx.spec.display, ctx.progress) as (stream, tap):
        empty = True
        for first_line, block in iter_line_blocks(stream, ctx.block_bytes, ctx.spec.display):
            if empty:
                block = block.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is no text
            empty = False
            lines = _lines(block, first_line, ctx)
            if len(lines):
                ctx.stats.records += len(lines)
                yield pa.RecordBatch.from_arrays([lines], schema=schema)
        if empty:
            ctx.empty_source()
        ctx.stats.hash = tap.hexdigest()


def _lines(block: bytes, first_line: int, ctx: ReadContext) -> pa.StringArray:
    bad = _first_bad(block)
    if bad is not None:
        if not ctx.skip:
            offset, what = bad
            line = first_line + block.count(b"\n", 0, offset)
            raise BadInputError(
                what, subject=f"{ctx.spec.display}:{line}", hint="pass --on-error skip to drop such lines"
            )
        block = _drop_bad_lines(block, ctx)
    body = block[:-1] if block.endswith(b"\n") else block
    if not body and not block:
        return pa.array([], pa.string())
    whole = pa.array([body], pa.large_binary()).cast(pa.large_string())
    lines = pc.split_pattern(whole, "\n").flatten()
    if b"\r" in block:
        lines = pc.replace_substring_regex(lines, "\r$", "")
    return lines.cast(pa.string())


def _first_bad(block: bytes) -> tuple[int, str] | None:
    nul = block.find(b"\x00")
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as e:
        if nul < 0 or e.start < nul:
            return e.start, "not valid UTF-8 text"
    if nul >= 0:
        return nul, "binary data (a NUL byte), not text"
    return None


def _drop_bad_lines(block: bytes, ctx: ReadContext) -> bytes:
    kept = []
    for line in block.splitlines(keepends=True):
        if _first_bad(line) is None:
            kept.append(line)
        else:
            ctx.stats.skipped += 1
    return b"".join(kept)
