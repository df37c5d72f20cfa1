"""CSV/TSV reader: pyarrow's streaming CSV reader, Python's csv module only to diagnose.

Types are inferred (null, bool, int64, double, string; dates and times stay strings, so
they come back as written; a number is a number, so ``00501`` or ``+1555`` comes back
as 501 or 1555.0: keep such identifiers in JSONL or Parquet strings) and widened
leniently: a column that meets a value its type cannot hold becomes the next type up
(int64 → double → string), which restarts the ingest with the wider schema (see
:mod:`datastore._sourcebase`). Rows with the wrong number of fields fail naming their
line, or are skipped and counted with ``on_error="skip"``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.csv as pcsv

from cachetier.errors import BadInputError
from datastore._input import open_input, sniff_binary
from datastore._schema import conform, same_types, widen, widen_schema
from datastore._sourcebase import ReadContext

__all__ = ["read_csv"]

_CONVERSION = re.compile(r"column #(\d+): CSV conversion error to (\S+): invalid value '(.*)'$", re.S)
_HEAD_BYTES = 64 << 10


class _Prefixed:
    """A read-only stream: ``head`` then the rest of ``stream``; counts the quotes it passes."""

    def __init__(self, head: bytes, stream):
        self._head = head
        self._stream = stream
        self.closed = False
        self.quotes = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            data, self._head = self._head + self._stream.read(), b""
        elif self._head:
            data, self._head = self._head[:size], self._head[size:]
        else:
            data = self._stream.read(size)
        if len(data) > 1 and data.endswith(b"\r"):
            # Arrow's CSV reader loses the "\n" of a quoted "\r\n" split between two blocks,
            # so a block never ends on "\r": it starts the next one.
            data, self._head = data[:-1], b"\r" + self._head
        self.quotes += data.count(b'"')
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def read_csv(ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """Yield the records of a CSV (``,``) or TSV (tab) file as batches of the context's schema."""
    display = ctx.spec.display
    delimiter = "\t" if ".tsv" in ctx.spec.path.lower() else ","
    bad_rows: list[tuple[int, int, str]] = []

    def on_invalid(row) -> str:
        bad_rows.append((row.expected_columns, row.actual_columns, row.text))
        if ctx.skip:
            ctx.stats.skipped += 1
            return "skip"
        return "error"

    with open_input(ctx.spec.path, display, ctx.progress) as (stream, tap):
        head = stream.read(_HEAD_BYTES)
        if not head.strip():
            ctx.empty_source()
            ctx.stats.hash = tap.hexdigest()
            return
        if not ctx.skip:
            sniff_binary(head, display)
        known = {f.name: f.type for f in ctx.schema} if ctx.schema is not None else {}
        source = _Prefixed(head, stream)
        try:
            reader = pcsv.open_csv(
                source,
                read_options=pcsv.ReadOptions(block_size=max(ctx.block_bytes, 1024)),
                # Quoted fields may hold newlines: without this, a block boundary inside one
                # splits the record (a false error, or a truncated value with skip).
                parse_options=pcsv.ParseOptions(
                    delimiter=delimiter, newlines_in_values=True, invalid_row_handler=on_invalid
                ),
                convert_options=_convert_options(known),
            )
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _failure(ctx, delimiter, e, bad_rows) from e
        schema = _file_schema(ctx, reader.schema, delimiter)
        try:
            for batch in reader:
                ctx.stats.records += batch.num_rows
                yield conform(batch, schema)
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _failure(ctx, delimiter, e, bad_rows, reader.schema) from e
        if source.quotes % 2:  # Arrow takes the rest of the file as the open field's value
            line = _scan(ctx, delimiter, lambda row: False, last=True)
            raise BadInputError(
                "a quoted field is never closed (it would run to the end of the file)",
                subject=f"{display}:{line}" if line else display,
            )
        for _ in iter(lambda: stream.read(1 << 20), b""):
            pass  # hash the whole file even if the reader stopped early
        ctx.stats.hash = tap.hexdigest()


def _file_schema(ctx: ReadContext, header: pa.Schema, delimiter: str) -> pa.Schema:
    """Check the header; widen or adopt the ingest schema; return the schema to yield."""
    display = ctx.spec.display
    seen = set()
    for name in header.names:
        if name in seen:
            raise BadInputError(f"duplicate column name {name!r} in the header", subject=f"{display}:1")
        seen.add(name)
    for field in header:
        if pa.types.is_binary(field.type):
            line = _scan(ctx, delimiter, lambda row: False)
            raise BadInputError(
                f"not valid UTF-8 text (column {field.name!r})", subject=f"{display}:{line or 1}"
            )
    file_schema = pa.schema([pa.field(f.name, _normalize(f.type)) for f in header])
    if ctx.schema is None:
        if not same_types(file_schema, header):  # dates and times: read them again as text
            ctx.widen(file_schema, f"{display}:1")
        ctx.define_schema(file_schema)
        return file_schema
    wider, column = widen_schema(ctx.schema, file_schema, lenient=True)
    if wider is None or not same_types(wider, ctx.schema):
        ctx.widen(wider, f"{display}:1", column)
    return ctx.schema


def _failure(ctx, delimiter, error, bad_rows, header: pa.Schema | None = None) -> Exception:
    """Turn a pyarrow CSV error into a widening (raised) or a one-line BadInputError."""
    display = ctx.spec.display
    text = str(error)
    match = _CONVERSION.search(text)
    if match and header is not None:
        index, type_name, value = int(match.group(1)), match.group(2), match.group(3)
        name = header.names[index]
        current = ctx.schema.field(name).type
        new_type = widen(current, _value_type(value), lenient=True)
        if new_type is not None and not ctx.locked and not new_type.equals(current):
            wider = pa.schema([pa.field(f.name, new_type if f.name == name else f.type) for f in ctx.schema])
            ctx.widen(wider, display, name)
        line = _scan(ctx, delimiter, lambda row: len(row) > index and row[index] == value)
        return BadInputError(
            f"column {name!r}: {value!r} is not a valid {type_name}",
            subject=f"{display}:{line}" if line else display,
            hint="all sources of one ingest need one schema",
        )
    if bad_rows:
        expected, actual, row_text = bad_rows[0]
        line = _scan(ctx, delimiter, lambda row: len(row) != expected)
        return BadInputError(
            f"expected {expected} fields, found {actual}: {row_text[:80]!r}",
            subject=f"{display}:{line}" if line else display,
            hint="fix the row, or pass --on-error skip",
        )
    if "UTF8" in text or isinstance(error, UnicodeDecodeError):
        line = _scan(ctx, delimiter, lambda row: False)
        return BadInputError("not valid UTF-8 text", subject=f"{display}:{line}" if line else display)
    return BadInputError(f"cannot parse CSV: {text.splitlines()[0]}", subject=display)


def _convert_options(column_types: dict[str, pa.DataType]) -> pcsv.ConvertOptions:
    """Inference limited to the CSV lattice: no timestamps, and only words are booleans."""
    return pcsv.ConvertOptions(
        column_types=column_types,
        timestamp_parsers=[],
        strings_can_be_null=False,
        true_values=["true", "True", "TRUE"],
        false_values=["false", "False", "FALSE"],
    )


def _normalize(t: pa.DataType) -> pa.DataType:
    """Dates and times that Arrow recognised stay text, so they come back as written."""
    if pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t):
        return pa.string()
    return t


def _value_type(value: str) -> pa.DataType:
    """The type Arrow infers for one value (what a whole-file inference would see)."""
    text = io.StringIO()
    csv.writer(text).writerows([["v"], [value]])
    table = pcsv.read_csv(
        io.BytesIO(text.getvalue().encode()),
        parse_options=pcsv.ParseOptions(newlines_in_values=True),
        convert_options=_convert_options({}),
    )
    return _normalize(table.schema.field(0).type)


def _scan(
    ctx: ReadContext, delimiter: str, bad: Callable[[list[str]], bool], *, last: bool = False
) -> int | None:
    """Return the first line of the first data row that is not UTF-8 or that ``bad`` flags
    (with ``last``, else the first line of the last row)."""
    with open_input(ctx.spec.path, ctx.spec.display) as (stream, _):
        state = {"line": 0, "error": None}

        def lines() -> Iterator[str]:
            for raw in io.BufferedReader(stream, 1 << 20):
                state["line"] += 1
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError:
                    state["error"] = state["line"]
                    return

        reader = csv.reader(lines(), delimiter=delimiter)
        start = previous = 1
        try:
            for number, row in enumerate(reader):
                if number > 0 and bad(row):
                    return start
                start, previous = state["line"] + 1, start
        except csv.Error:
            return start
        return previous if last and state["error"] is None else state["error"]
