"""CSV/TSV reader: pyarrow's streaming CSV reader splits fields, :mod:`datastore._csvtypes`
types them, Python's csv module only reads the header and diagnoses.

Every column is read as text and typed here (null, bool, int64, double, string; dates and
times stay strings, and so do numbers written with a leading zero, such as ``00501``, and
whole numbers beyond int64, so they come back as written) and widened leniently: a column
that meets a value its type cannot hold becomes the next type up (int64 → double →
string), which restarts the ingest with the wider schema (see
:mod:`datastore._sourcebase`). Rows with the wrong number of fields fail naming their
line, or are skipped and counted with ``on_error="skip"``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.csv as pcsv

from cachetier.errors import BadInputError
from datastore._csvtypes import least_typed, to_type
from datastore._input import open_input, sniff_binary
from datastore._schema import conform, same_types, widen_schema
from datastore._sourcebase import ReadContext

__all__ = ["read_csv"]

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
        names, head = _header(head, stream, delimiter, display)
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
                convert_options=pcsv.ConvertOptions(
                    column_types=dict.fromkeys(names, pa.string()), strings_can_be_null=False
                ),
            )
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _failure(ctx, delimiter, e, bad_rows) from e
        try:
            for batch in reader:
                ctx.stats.records += batch.num_rows
                yield conform(_typed(ctx, delimiter, batch), ctx.schema)
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            raise _failure(ctx, delimiter, e, bad_rows) from e
        if ctx.schema is None:  # a header and no records
            ctx.define_schema(pa.schema([pa.field(name, pa.null()) for name in reader.schema.names]))
        if source.quotes % 2:  # Arrow takes the rest of the file as the open field's value
            line = _scan(ctx, delimiter, lambda row: False, last=True)
            raise BadInputError(
                "a quoted field is never closed (it would run to the end of the file)",
                subject=f"{display}:{line}" if line else display,
            )
        for _ in iter(lambda: stream.read(1 << 20), b""):
            pass  # hash the whole file even if the reader stopped early
        ctx.stats.hash = tap.hexdigest()


def _header(head: bytes, stream, delimiter: str, display: str) -> tuple[list[str], bytes]:
    """The names in the header row, and ``head`` read on until it holds that row whole."""
    while True:
        text = io.StringIO(head.decode("utf-8-sig", errors="replace"), newline="")
        rows = csv.reader(text, delimiter=delimiter)
        try:  # Arrow skips empty lines, the header's too
            names = next((row for row in rows if row), [])
            whole = next(rows, None) is not None
        except csv.Error:
            names, whole = [], False
        more = b"" if whole else stream.read(_HEAD_BYTES)
        if not more:
            break
        head += more
    seen = set()
    for name in names:
        if name in seen:
            raise BadInputError(f"duplicate column name {name!r} in the header", subject=f"{display}:1")
        seen.add(name)
    return names, head


def _typed(ctx: ReadContext, delimiter: str, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` (text columns) typed: in the ingest schema's types, or the least types
    that hold it for the first batch; raises SchemaWidened (or a BadInputError naming the
    line, where the schema is locked) when a column needs a wider type."""
    known = {f.name: f.type for f in ctx.schema} if ctx.schema is not None else {}
    arrays, wider = [], {}
    for name, column in zip(batch.schema.names, batch.columns):
        text = column if pa.types.is_string(column.type) else column.cast(pa.string())
        typed = to_type(text, known[name]) if name in known else None
        if typed is None:
            typed = least_typed(text)
            wider[name] = typed.type
        arrays.append(typed)
    typed_batch = pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
    if ctx.schema is None:
        ctx.define_schema(typed_batch.schema)
    elif wider:
        _widen(ctx, delimiter, batch, wider)
    return typed_batch


def _widen(ctx: ReadContext, delimiter: str, batch: pa.RecordBatch, wider: dict[str, pa.DataType]) -> None:
    """Ask for the ingest schema widened by the columns ``wider`` (raises)."""
    display = ctx.spec.display
    schema, column = widen_schema(ctx.schema, pa.schema(list(wider.items())), lenient=True)
    if schema is not None and not ctx.locked and not same_types(schema, ctx.schema):
        ctx.widen(schema, display, column)
    name = column or next(iter(wider))
    if name not in ctx.schema.names:
        ctx.widen(None, display, name)
    target = ctx.schema.field(name).type
    text = batch.column(batch.schema.names.index(name))
    value = next((v for v in text.to_pylist() if to_type(pa.array([v]), target) is None), None)
    index = batch.schema.names.index(name)
    line = _scan(ctx, delimiter, lambda row: len(row) > index and row[index] == value)
    raise BadInputError(
        f"column {name!r}: {value!r} is not a valid {target}",
        subject=f"{display}:{line}" if line else display,
        hint="all sources of one ingest need one schema",
    )


def _failure(ctx, delimiter, error, bad_rows) -> Exception:
    """Turn a pyarrow CSV error into a one-line BadInputError naming the line."""
    display = ctx.spec.display
    text = str(error)
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
