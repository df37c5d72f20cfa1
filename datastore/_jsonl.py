"""JSON Lines reader: pyarrow's parser on blocks of whole lines, Python only to diagnose.

Each block (about ``block_bytes`` of whole lines) is parsed by ``pyarrow.json`` with the
schema known so far. When a block does not parse, the reader finds out why, in this
order: the block's own types only widen the schema (a new column, an int that became a
float: the ingest restarts with the wider schema, see :class:`SchemaWidened`); or some
line is bad, found by bisecting the block with pyarrow (so a bad line is found even where
Python's json module would accept it) and described with Python's json module. With
``on_error="skip"`` bad lines are dropped and counted instead.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.json as pj

from cachetier.errors import BadInputError
from datastore._input import iter_line_blocks, open_input
from datastore._schema import normalize_json_schema, same_types, widen_schema
from datastore._sourcebase import ReadContext

__all__ = ["read_jsonl", "scan_jsonl_schema"]

_BOM = b"\xef\xbb\xbf"
_NON_BLANK = re.compile(rb"[^ \t\r\n]")
_ARROW_ERRORS = (
    pa.ArrowInvalid,
    pa.ArrowNotImplementedError,
    pa.ArrowTypeError,
    UnicodeDecodeError,
    ValueError,
)


def read_jsonl(ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Yield the records of a JSON Lines file as batches of the context's schema."""
    with open_input(ctx.spec.path, ctx.spec.display, ctx.progress) as (stream, tap):
        first = True
        for first_line, block in iter_line_blocks(stream, ctx.block_bytes, ctx.spec.display):
            if first:
                block = block.removeprefix(_BOM)
                _check_not_array(block, ctx)
                first = False
            table = _parse_block(block, first_line, ctx)
            if table is None:
                continue
            ctx.stats.records += table.num_rows
            yield from table.to_batches()
        if first:
            ctx.empty_source()
        ctx.stats.hash = tap.hexdigest()


def scan_jsonl_schema(path: str, display: str, schema: pa.Schema, block_bytes: int) -> pa.Schema:
    """Widen ``schema`` by the types of every block of a JSON Lines file (types only).

    Used after repeated restarts, so a file whose columns keep appearing late costs one
    extra pass instead of one restart per new column. Blocks that do not parse, or whose
    types conflict, are left to the real pass, which reports them with their line.
    """
    with open_input(path, display) as (stream, _):
        for _, block in iter_line_blocks(stream, block_bytes, display):
            try:
                inferred = normalize_json_schema(_parse(block.removeprefix(_BOM), None).schema)
            except _ARROW_ERRORS:
                continue
            wider, _conflict = widen_schema(schema, inferred)
            if wider is not None:
                schema = wider
    return schema


def _check_not_array(block: bytes, ctx: ReadContext) -> None:
    first = _NON_BLANK.search(block)
    if first is not None and first.group() == b"[":
        raise BadInputError(
            "a JSON array, not JSON Lines",
            subject=f"{ctx.spec.display}:1",
            hint="write one JSON object per line (e.g. `jq -c '.[]'`)",
        )


def _parse(data: bytes, schema: pa.Schema | None, *, strict: bool = False) -> pa.Table:
    """Parse whole lines; ``strict`` refuses columns that ``schema`` lacks."""
    parse_options = None
    if schema is not None:
        behavior = "error" if strict else "infer"
        parse_options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=behavior)
    try:
        table = pj.read_json(io.BytesIO(data), parse_options=parse_options)
    except pa.ArrowInvalid as e:
        if "straddl" not in str(e):
            raise
        options = pj.ReadOptions(block_size=len(data) + 1)  # one line longer than Arrow's block
        table = pj.read_json(io.BytesIO(data), read_options=options, parse_options=parse_options)
    if any(_has_null_list(f.type) for f in table.schema):
        columns = [pa.chunked_array([_repair(x) for x in c.chunks], c.type) for c in table.columns]
        table = pa.table(columns, schema=table.schema)
    return table


def _has_null_list(t: pa.DataType) -> bool:
    if pa.types.is_list(t):
        return pa.types.is_null(t.value_type) or _has_null_list(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_null_list(f.type) for f in t)
    return False


def _repair(arr: pa.Array) -> pa.Array:
    """Rebuild lists of nulls: Arrow's JSON reader (as of 26.0) gives them a short child."""
    t = arr.type
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_list(t) and _has_null_list(t):
        offsets = arr.offsets
        end = offsets[-1].as_py() if len(offsets) else 0
        values = pa.nulls(end) if pa.types.is_null(t.value_type) else _repair(arr.values.slice(0, end))
        return pa.ListArray.from_arrays(offsets, values, type=t, mask=mask)
    if pa.types.is_struct(t) and _has_null_list(t):
        children = [_repair(arr.field(i)) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    return arr


def _parse_block(block: bytes, first_line: int, ctx: ReadContext) -> pa.Table | None:
    """Parse one block to a table of ``ctx.schema`` (defining it on the first block)."""
    if _blank(block):
        return None
    block = _valid_utf8(block, first_line, ctx)
    if _blank(block):
        return None
    while True:
        try:
            table = _parse(block, ctx.schema, strict=ctx.locked)
        except _ARROW_ERRORS as e:
            block = _recover(block, first_line, ctx, e)
            if _blank(block):
                return None
            continue
        if ctx.schema is None:
            schema = normalize_json_schema(table.schema)
            ctx.define_schema(schema)
            # Parse again with the types fixed: Arrow's inference (as of 26.0) turns the
            # nulls of an inferred list<int64> such as [null, 0] into zeros.
            return _parse(block, schema)
        if same_types(table.schema, ctx.schema):
            return table
        wider, _ = widen_schema(ctx.schema, normalize_json_schema(table.schema))
        ctx.widen(wider, f"{ctx.spec.display}:{first_line}")
        return None  # unreachable: widen() raises


def _valid_utf8(block: bytes, first_line: int, ctx: ReadContext) -> bytes:
    """The block, if it is UTF-8; else fail naming the first bad line, or drop bad lines.

    Arrow's JSON parser copies string bytes without checking them, so without this a
    Latin-1 file would make a version whose strings cannot be read back.
    """
    whole = pa.LargeStringArray.from_buffers(
        1, pa.py_buffer(np.array([0, len(block)], np.int64)), pa.py_buffer(block)
    )
    try:
        whole.validate(full=True)  # Arrow's vectorized UTF-8 check, ~10 GB/s
        return block
    except pa.ArrowInvalid:
        pass
    kept, dropped = [], 0
    for index, line in enumerate(block.splitlines(keepends=True)):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            if not ctx.skip:
                raise BadInputError(
                    f"not valid UTF-8 (byte {line[e.start]:#04x} at column {e.start + 1})",
                    subject=f"{ctx.spec.display}:{first_line + index}",
                    hint="re-encode it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or pass --on-error skip",
                ) from None
            dropped += 1
            line = b"\n"  # keep the line count stable
        kept.append(line)
    ctx.stats.skipped += dropped
    return b"".join(kept)


def _recover(block: bytes, first_line: int, ctx: ReadContext, error: Exception) -> bytes:
    """After a failed parse: widen the schema (raises), fail naming the line, or drop bad lines."""
    if ctx.schema is not None and not ctx.locked:
        _widen_for(block, first_line, ctx)  # the block as a whole needs wider types?
    if ctx.skip:
        cleaned, dropped = _drop_unparsable(block)
        if dropped:
            ctx.stats.skipped += dropped
            return cleaned
    index, message = _first_bad_line(block, lambda data: _parse(data, ctx.schema, strict=ctx.locked))
    if index is None:
        raise BadInputError(_clean(str(error)), subject=f"{ctx.spec.display}:{first_line}")
    lines = block.splitlines(keepends=True)
    if ctx.schema is not None and not ctx.locked:
        _widen_for(lines[index], first_line + index, ctx)  # the first failing line needs them?
    if ctx.skip:
        ctx.stats.skipped += 1
        return b"".join([*lines[:index], b"\n", *lines[index + 1 :]])
    raise BadInputError(
        _describe(lines[index], message, ctx),
        subject=f"{ctx.spec.display}:{first_line + index}",
        hint="fix or remove the line, or pass --on-error skip",
    )


def _widen_for(data: bytes, first_line: int, ctx: ReadContext) -> None:
    """Raise SchemaWidened if ``data`` parses alone and only needs wider types than ``ctx.schema``."""
    try:
        inferred = normalize_json_schema(_parse(data, None).schema)
    except _ARROW_ERRORS:
        return
    wider, _ = widen_schema(ctx.schema, inferred)
    if wider is not None and not same_types(wider, ctx.schema):
        ctx.widen(wider, f"{ctx.spec.display}:{first_line}")


def _blank(data: bytes) -> bool:
    """True when ``data`` is only whitespace (without copying it, unlike ``strip``)."""
    return _NON_BLANK.search(data) is None


def _drop_unparsable(block: bytes) -> tuple[bytes, int]:
    """Drop the lines that are not JSON objects (Python's json module decides)."""
    kept, dropped = [], 0
    for line in block.splitlines(keepends=True):
        if line.strip():
            try:
                ok = isinstance(json.loads(line), dict)
            except (ValueError, RecursionError):
                ok = False
            if not ok:
                dropped += 1
                kept.append(b"\n")  # keep the line count stable
                continue
        kept.append(line)
    return b"".join(kept), dropped


def _first_bad_line(block: bytes, parse: Callable[[bytes], pa.Table]) -> tuple[int | None, str]:
    """Bisect for the first line whose prefix no longer parses; return its index and error."""
    raw = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(raw == 10) + 1
    if len(ends) == 0 or ends[-1] != len(block):
        ends = np.append(ends, len(block))
    lo, hi, message = 0, len(ends), ""
    try:
        parse(block[: ends[-1]])
        return None, ""
    except _ARROW_ERRORS as e:
        message = str(e)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            prefix = block[: ends[mid - 1]] if mid > 0 else b""
            if not _blank(prefix):
                parse(prefix)
            lo = mid
        except _ARROW_ERRORS as e:
            hi, message = mid, str(e)
    return hi - 1, message


def _describe(line: bytes, arrow_message: str, ctx: ReadContext) -> str:
    """One phrase saying what is wrong with a JSON line."""
    if b"\x00" in line:
        return "binary data (a NUL byte), not JSON"
    try:
        value = json.loads(line.strip())
    except UnicodeDecodeError:
        return "not valid UTF-8 (binary data?)"
    except json.JSONDecodeError as e:
        return f"invalid JSON: {e.msg} (column {e.colno})"
    except (ValueError, RecursionError) as e:
        return f"invalid JSON: {e}"
    if not isinstance(value, dict):
        return f"expected a JSON object, found {type(value).__name__}"
    if "unexpected field" in arrow_message and ctx.schema is not None:
        extra = [k for k in value if k not in ctx.schema.names]
        if extra:
            return f"column {extra[0]!r} is not in the schema of {ctx.locked_by or 'the earlier records'}"
    return _clean(arrow_message)


def _clean(message: str) -> str:
    message = message.replace("JSON parse error: ", "")
    message = re.sub(r" in row \d+$", "", message)
    message = re.sub(r"Column\(/([^)]*)\)", lambda m: f"column {m.group(1).replace('/', '.')!r}", message)
    return message.replace("\n", " ")
