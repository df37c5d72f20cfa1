"""Decoded shards, and the rows of batches taken from them column-wise.

A :class:`DecodedShard` keeps the selected columns of one shard as its chunks (record
batches), seen without a copy where the layout allows (:mod:`loaders.columns`): nothing
is converted for rows a reader does not deliver. A shard comes either as a view of the RAM
tier's decoded file (:class:`loaders.ipcview.IpcFile`, read without pyarrow) or as a
pyarrow table. Batches get their rows in one of two ways:

- :func:`slice_rows`: rows in order (no shuffle), sliced from the chunks;
- :class:`GatheredRows`: the rows of a few consecutive batches of a reader, gathered
  chunk by chunk into one block per column, from which each batch takes its rows with
  one numpy index. The per-chunk calls are paid once per block, not once per batch.

:func:`batch_from_pieces` / :func:`samples_from_pieces` turn the pieces into the
yielded items. No Python object is made per sample in batch mode, except the values of
string and other object columns.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from cachetier.errors import BadInputError
from cachetier.pages import FileMapping
from loaders.columns import Kind, RaggedKind, Reader, Scratch, kind_of, lengths_key, row_ranges
from loaders.ipcview import Column, IpcFile, UnsupportedIpc, column_from_arrow, field_type_from_arrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DROP_BYTES",
    "DecodedShard",
    "GatheredRows",
    "batch_from_pieces",
    "join_pieces",
    "samples_from_pieces",
    "select_columns",
    "slice_rows",
    "unknown_column",
]

Pieces = dict[str, Any]
_DISAGREE = "shards of one version disagree on their columns"
#: A reader unmaps the shard pages it has read after about this many bytes of records (in
#: order, and while gathering: rows picked at random touch whole pages, so a block of
#: 2048 rows would map several times its own size).
DROP_BYTES = 1 << 20
#: Columns whose values take at least this many bytes a record are copied out with the
#: shard's reader (one ``pread`` a range); narrower ones are read in place.
_READ_ROW_BYTES = 64
#: A gather copies the rows of a chunk in pieces that span at most this many bytes of it.
_PIECE_BYTES = 256 << 10
#: Rows of a piece spread over more than this many times their number are gathered
#: through the mapping; denser ones are copied out whole first (with the shard's reader).
_SPREAD = 8


def select_columns(table: pa.Table, columns: Sequence[str] | None, shard_id: str) -> pa.Table:
    """``table`` reduced to ``columns`` (default: every column not starting with ``__``)."""
    names = table.column_names
    keep = _selected(names, columns, shard_id)
    return table if keep == names else table.select(keep)


def _selected(names: list[str], columns: Sequence[str] | None, shard_id: str) -> list[str]:
    """``columns`` of a shard with columns ``names`` (default: those not starting with
    ``__``); BadInputError naming the first one it lacks."""
    if columns is None:
        return [n for n in names if not n.startswith("__")]
    missing = [c for c in columns if c not in names]
    if missing:
        raise unknown_column(missing[0], names, f"shard {shard_id[:16]}")
    return list(columns)


class DecodedShard:
    """The columns of one shard (plan index ``index``) as chunks ready for batching.

    Every column is cut into the same chunks, at rows ``bounds`` (``bounds[-1]`` is the
    shard's row count); ``data[name][c]`` is chunk ``c`` of column ``name``. A shard
    made by :meth:`subset` holds only some of its records: ``kept`` lists their rows.
    """

    kept: np.ndarray | None = None
    _drop: Callable[[], None] | None = None
    #: per column, what copies rows' values from the shard's file instead of its mapping
    #: (:data:`loaders.columns.Reader`): for the wide columns of records in a file mapping
    reads: Mapping[str, Reader] = MappingProxyType({})

    def __init__(
        self,
        index: int,
        shard_id: str,
        records: pa.Table | IpcFile,
        drop_pages: Callable[[], None] | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        """``records``: a table of the selected columns, or the shard's decoded file, of
        which ``columns`` are taken (default: every column not starting with ``__``);
        :class:`~loaders.ipcview.UnsupportedIpc` when a column of the file needs pyarrow."""
        self.index = index
        self._drop = drop_pages
        if isinstance(records, IpcFile):
            names, chunks, lengths, nbytes = _ipc_columns(records, columns, shard_id)
        else:
            names, chunks, lengths, nbytes = _table_columns(records)
        self.rows = int(sum(lengths))
        #: mean bytes per record of the selected columns
        self.row_bytes = nbytes / max(1, self.rows)
        #: of which reading rows maps into the process (all but the values a reader copies)
        self.mapped_row_bytes = self.row_bytes
        read = (
            _file_reader(records.buffer) if isinstance(records, IpcFile) and drop_pages is not None else None
        )
        if read is not None:
            reads, mapped = {}, 0
            for name, (_, parts) in chunks.items():
                index = sum(_index_bytes(c) for c in parts)
                values = sum(_value_bytes(c) for c in parts)
                if values >= _READ_ROW_BYTES * self.rows:
                    reads[name] = read
                    mapped += index
                else:  # a few bytes a record: read in place, its pages serve many records
                    mapped += index + values
            self.reads = reads
            self.mapped_row_bytes = mapped / max(1, self.rows)
        self.bounds = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        self.kinds: dict[str, Kind] = {}
        self.data: dict[str, list[Any]] = {}
        for name, (kind, parts) in chunks.items():
            try:
                self.data[name] = [kind.prepare(c) for c in parts]
            except (ValueError, TypeError) as e:
                raise BadInputError(f"column {name!r} cannot be read: {e}", subject=shard_id) from e
            self.kinds[name] = kind
            if isinstance(kind, RaggedKind) and lengths_key(name) in names:
                raise BadInputError(
                    f"column {lengths_key(name)!r} clashes with the lengths of "
                    f"variable-length column {name!r}",
                    subject=lengths_key(name),
                    hint="select columns so the names do not clash",
                )

    def subset(self, rows: np.ndarray) -> DecodedShard:
        """A copy holding only ``rows`` (sorted, distinct), so the rest can be let go."""
        if self.kept is not None:
            raise RuntimeError("a subset of a subset")
        groups = [(0, rows)]  # when none is needed: an empty chunk of the same types
        if len(rows):
            chunk = np.searchsorted(self.bounds, rows, "right") - 1
            cuts = [0, *(np.flatnonzero(chunk[1:] != chunk[:-1]) + 1).tolist(), len(rows)]
            groups = [(int(chunk[a]), rows[a:b] - self.bounds[chunk[a]]) for a, b in itertools.pairwise(cuts)]
        out = object.__new__(DecodedShard)
        out.index, out.rows, out.kinds, out.kept = self.index, len(rows), self.kinds, rows
        out.row_bytes = out.mapped_row_bytes = self.row_bytes  # copies: nothing is mapped
        out.bounds = np.array([0, len(rows)], dtype=np.int64)
        out.data = {
            name: [kind.subset([(self.data[name][c], local) for c, local in groups])]
            for name, kind in self.kinds.items()
        }
        return out

    @property
    def shared(self) -> bool:
        """True when the records live in a shared mapping (the RAM tier) whose pages this
        process can let go of (:meth:`drop_pages`): holding the shard whole then costs no
        private memory, so a :meth:`subset` copy would only add some."""
        return self._drop is not None

    def drop_pages(self) -> None:
        """Unmap this process's resident pages of a shard read from a shared mapping (see
        ``ShardSource.drop_pages``); the data stays readable. A no-op for other shards."""
        if self._drop is not None:
            self._drop()

    def local(self, rows: np.ndarray) -> np.ndarray:
        """Where records ``rows`` (of the whole shard) are in this one."""
        if self.kept is None:
            return rows
        local = np.searchsorted(self.kept, rows)
        if len(rows) and (local.max() >= len(self.kept) or not np.array_equal(self.kept[local], rows)):
            raise RuntimeError(f"shard {self.index} was cut to fewer records than the reader needs")
        return local


def unknown_column(name: str, names: list[str], where: str) -> BadInputError:
    """The error for a column ``name`` that ``where`` (with columns ``names``) lacks."""
    visible = ", ".join(n for n in names if not n.startswith("__"))
    return BadInputError(
        f"column {name!r} is not in {where}", subject=name, hint=f"available columns: {visible}"
    )


_Chunks = dict[str, tuple[Kind, list[Any]]]


def _ipc_columns(
    records: IpcFile, columns: Sequence[str] | None, shard_id: str
) -> tuple[list[str], _Chunks, list[int], int]:
    """The selected columns of a decoded file: names, ``{name: (kind, chunks)}``, the
    rows of each chunk (record batch) and the bytes of the selected columns."""
    names = [f.name for f in records.schema]
    columns = _selected(names, columns, shard_id)
    lengths = [records.batch_rows(i) for i in range(records.num_batches)]
    keep = [i for i, n in enumerate(lengths) if n]  # no empty chunk, as for tables
    types = {f.name: f.type for f in records.schema}
    chunks: _Chunks = {}
    nbytes = 0
    for name in columns:
        kind = kind_of(types[name])
        if kind.arrow:
            raise UnsupportedIpc(f"column {name!r} ({types[name].arrow}) is read with pyarrow")
        parts = [records.column(i, name) for i in keep]
        nbytes += sum(_column_bytes(c) for c in parts)
        chunks[name] = (kind, parts)
    return names, chunks, [lengths[i] for i in keep], nbytes


def _table_columns(table: pa.Table) -> tuple[list[str], _Chunks, list[int], int]:
    """:func:`_ipc_columns` for a pyarrow table (all of its columns)."""
    import pyarrow as pa

    table = _same_chunks(table)
    chunks: _Chunks = {}
    for name in table.column_names:
        parts = [
            c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in table.column(name).chunks
        ]
        kind = kind_of(field_type_from_arrow(parts[0].type if parts else table.schema.field(name).type))
        chunks[name] = (kind, parts if kind.arrow else [column_from_arrow(c) for c in parts])
    lengths = [len(c) for c in table.column(0).chunks] if table.num_columns else [table.num_rows]
    return table.column_names, chunks, lengths, table.nbytes


def _file_reader(buffer: memoryview) -> Reader | None:
    """A :data:`~loaders.columns.Reader` for views of ``buffer`` when it lies in a
    :class:`~cachetier.pages.FileMapping` (a RAM-tier file), else None."""
    mapping = buffer.obj
    if not isinstance(mapping, FileMapping) or mapping.closed or not hasattr(os, "preadv"):
        return None  # (no preadv: a platform where only the mapping is read)
    first = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    # where the mapping (the file's byte 0) starts: the buffer is a slice of it
    with memoryview(mapping) as whole:
        base = np.frombuffer(whole, dtype=np.uint8).ctypes.data
    end = base + len(mapping)
    assert base <= first <= end

    def read(view: np.ndarray, out: np.ndarray) -> bool:
        address = view.__array_interface__["data"][0]
        if not (base <= address and address + view.nbytes <= end and view.flags.c_contiguous):
            return False
        mapping.read_into(address - base, memoryview(out).cast("B"))
        return True

    return read


def _index_bytes(column: Column | Any) -> int:
    """Bytes of a column's offsets and validity (what is read in place), children included."""
    if not isinstance(column, Column):
        return 0
    own = sum(a.nbytes for a in (column.valid, column.offsets) if a is not None)
    return own + (_index_bytes(column.child) if column.child is not None else 0)


def _value_bytes(column: Column | Any) -> int:
    """Bytes of a column's values (what a reader copies out), children included."""
    if not isinstance(column, Column):
        return 0
    own = column.values.nbytes if column.values is not None else 0
    return own + (_value_bytes(column.child) if column.child is not None else 0)


def _column_bytes(column: Column) -> int:
    """Bytes of a column's buffers (its values, offsets and children)."""
    own = sum(a.nbytes for a in (column.values, column.offsets) if a is not None)
    return own + (_column_bytes(column.child) if column.child is not None else 0)


def _same_chunks(table: pa.Table) -> pa.Table:
    """``table`` with every column cut at the same rows and no empty chunk (slices, no copy)."""
    if table.num_columns == 0 or table.num_rows == 0:
        return table
    first = [len(c) for c in table.column(0).chunks]
    if 0 not in first and all([len(c) for c in col.chunks] == first for col in table.columns[1:]):
        return table
    import pyarrow as pa

    batches = [b for b in table.to_batches() if b.num_rows]
    return pa.Table.from_batches(batches, schema=table.schema)


def slice_rows(shard: DecodedShard, start: int, stop: int) -> tuple[dict[str, Kind], Pieces]:
    """The kinds and the pieces of rows ``[start, stop)`` of ``shard``, in order."""
    bounds = shard.bounds
    c = int(np.searchsorted(bounds, start, "right")) - 1
    spans = []
    while start < stop:
        end = min(stop, int(bounds[c + 1]))
        spans.append((c, start - int(bounds[c]), end - int(bounds[c])))
        start, c = end, c + 1
    pieces = {}
    for name, kind in shard.kinds.items():
        data = shard.data[name]
        read = shard.reads.get(name)
        pieces[name] = kind.concat([kind.slice(data[c], a, b, read) for c, a, b in spans])
    return shard.kinds, pieces


class GatheredRows:
    """Rows of consecutive positions, gathered from many chunks into one block per column.

    ``add`` the records of the next positions (``(shard, row)`` addresses in the shards
    of one window), in order, until ``rows`` positions are in; then ``take(start,
    stop)`` gives the pieces of positions ``[start, stop)``. Within an ``add`` the
    records are copied chunk by chunk (one call per chunk and column), so the block is
    in chunk order; ``where`` maps each position to its row of the block. ``spare``
    holds the blocks of an earlier instance, reused when they fit. The pages gathered
    from are unmapped every ``drop_bytes`` of records read through a mapping.

    From a shard with readers (:attr:`DecodedShard.reads`), ranges of consecutive rows
    are copied into the blocks with it, and rows spread over a range (those of one
    DataLoader worker, say) are copied out with their neighbours into ``scratch`` and
    gathered from there: no page of their values is mapped.
    """

    def __init__(
        self,
        rows: int,
        spare: Mapping[str, Any] | None = None,
        drop_bytes: float = DROP_BYTES,
        scratch: Scratch | None = None,
    ) -> None:
        self.rows = rows
        self.scratch = scratch or Scratch()
        self.drop_bytes = drop_bytes
        self.kinds: dict[str, Kind] | None = None
        self.blocks: dict[str, Any] = {}
        self.where = np.empty(rows, dtype=np.int64)
        self._filled = 0
        self._spare = spare or {}
        self._touched: dict[int, DecodedShard] = {}  # shards gathered from since the last drop
        self._passed = 0.0  # bytes of records gathered since then

    def add(self, shards: Mapping[int, DecodedShard], which: int | np.ndarray, rows: np.ndarray) -> None:
        """Gather the records at ``rows`` of shards ``which`` (plan indices, keys of ``shards``)."""
        n = len(rows)
        if n == 0:
            return
        groups, order = _by_chunk(shards, which, rows)
        if self.kinds is None:
            shard, c, _ = groups[0]
            self.kinds = shard.kinds
            self.blocks = {
                name: kind.new_block(self.rows, shard.data[name][c], self._spare.get(name))
                for name, kind in shard.kinds.items()
            }
            self._spare = {}
        kinds = self.kinds
        at = self._filled
        checked: set[int] = set()
        try:
            for shard, c, local in groups:
                if shard.index not in checked:
                    _check_same_columns(kinds, shard)
                    checked.add(shard.index)
                # rows are in address order: pieces of consecutive address ranges, the pages
                # mapped behind each let go of before the next maps its own
                span = max(1, int(_PIECE_BYTES / max(shard.row_bytes, 1.0)))
                a = 0
                while a < len(local):
                    b = a + int(np.searchsorted(local[a:], local[a] + span))
                    piece = local[a:b]
                    mapped = self._fill(shard, c, at, piece)
                    at += len(piece)
                    self._touched[shard.index] = shard
                    self._passed += len(piece) * (shard.row_bytes if mapped else shard.mapped_row_bytes)
                    a = b
                    if self._passed >= self.drop_bytes:  # the rows are copies now: unmap their pages
                        self.drop_pages()
        except (ValueError, TypeError) as e:  # pyarrow's ArrowInvalid and ArrowTypeError among them
            raise BadInputError(f"{_DISAGREE}: {e}", subject="columns") from e
        base = self._filled
        if order is None:
            self.where[base : base + n] = np.arange(base, base + n)
        else:
            self.where[base + order] = np.arange(base, base + n)
        self._filled += n

    def _fill(self, shard: DecodedShard, c: int, at: int, piece: np.ndarray) -> bool:
        """Copy rows ``piece`` of chunk ``c`` to the blocks from row ``at``; True when the
        values of a column with a reader were read through the shard's mapping."""
        assert self.kinds is not None
        blocks, reads = self.blocks, shard.reads
        first, last = int(piece[0]), int(piece[-1]) + 1
        ranges = bool(reads) and row_ranges(piece) is not None
        near = last - first <= _SPREAD * len(piece)
        mapped = False
        for name, kind in self.kinds.items():
            data, read = shard.data[name][c], reads.get(name)
            if read is not None and ranges:  # each range straight into the block
                blocks[name] = kind.fill(blocks[name], at, data, piece, read)
                continue
            copy = (
                kind.read_rows(data, first, last, read, self.scratch) if read is not None and near else None
            )
            if copy is not None:  # spread rows: copied out with their neighbours, gathered from there
                blocks[name] = kind.fill(blocks[name], at, copy, piece - first)
            else:
                blocks[name] = kind.fill(blocks[name], at, data, piece)
                mapped = mapped or read is not None
        return mapped

    def finish(self) -> GatheredRows:
        """Close the blocks once every position is in (returns self)."""
        if self._filled != self.rows:
            raise RuntimeError(f"gathered {self._filled} of {self.rows} rows")
        if self.kinds is not None:
            self.blocks = {name: kind.finish(self.blocks[name]) for name, kind in self.kinds.items()}
        return self

    def drop_pages(self) -> None:
        """Unmap the shard pages gathered from so far (see :meth:`DecodedShard.drop_pages`)."""
        for shard in self._touched.values():
            shard.drop_pages()
        self._touched.clear()
        self._passed = 0.0

    def take(self, start: int, stop: int) -> tuple[dict[str, Kind], Pieces]:
        """The kinds and the pieces of positions ``[start, stop)`` (copies: blocks are reused)."""
        assert self.kinds is not None
        rows = self.where[start:stop]
        return self.kinds, {name: kind.select(self.blocks[name], rows) for name, kind in self.kinds.items()}


def _check_same_columns(kinds: dict[str, Kind], shard: DecodedShard) -> None:
    if shard.kinds is kinds:
        return
    if shard.kinds.keys() != kinds.keys() or any(
        type(shard.kinds[n]) is not type(k) for n, k in kinds.items()
    ):
        raise BadInputError(
            f"{_DISAGREE}: {sorted(shard.kinds)} vs {sorted(kinds)}",
            subject="columns",
            hint="every shard of a version must have the same columns and types",
        )


def _by_chunk(
    shards: Mapping[int, DecodedShard], which: int | np.ndarray, rows: np.ndarray
) -> tuple[list[tuple[DecodedShard, int, np.ndarray]], np.ndarray | None]:
    """Addresses grouped by chunk: ``(shard, chunk, rows in the chunk)`` per group, in
    address order (so the runs of a page-local shuffle come out as ranges of rows), and
    the positions sorted the same way (None: they already are)."""
    if isinstance(which, (int, np.integer)):
        members = [shards[int(which)]]
        offsets = np.zeros(1, dtype=np.int64)
        rows = members[0].local(rows)
        where = rows
    else:
        first = int(which.min())
        members = [shards[i] for i in range(first, int(which.max()) + 1)]
        if any(s.kept is not None for s in members):
            rows = rows.copy()
            for s in members:
                if s.kept is not None:
                    mask = which == s.index
                    rows[mask] = s.local(rows[mask])
        offsets = np.cumsum([0] + [s.rows for s in members[:-1]], dtype=np.int64)
        where = offsets[which - first] + rows
    if len(members) == 1 and len(members[0].bounds) == 2:
        order = np.argsort(rows)  # rows are distinct: any sort gives this order
        return [(members[0], 0, rows[order])], order
    starts = np.concatenate([s.bounds[:-1] + off for s, off in zip(members, offsets)])
    owner = [(s, c) for s in members for c in range(len(s.bounds) - 1)]
    chunk = np.searchsorted(starts, where, "right") - 1
    local = where - starts[chunk]
    order = np.argsort(where)  # addresses are distinct: any sort gives this order
    ordered = chunk[order]
    cuts = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), len(order)]
    groups = []
    for a, b in itertools.pairwise(cuts):
        shard, c = owner[int(ordered[a])]
        groups.append((shard, c, local[order[a:b]]))
    return groups, order


def join_pieces(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> Pieces:
    """Consecutive pieces as one piece per column."""
    if len(parts) == 1:
        return parts[0]
    try:
        return {name: kind.concat([p[name] for p in parts]) for name, kind in kinds.items()}
    except (KeyError, ValueError, TypeError) as e:
        raise BadInputError(f"{_DISAGREE}: {e}", subject="columns") from e


def batch_from_pieces(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> dict[str, Any]:
    """A batch dict (tensors, lists) from consecutive pieces."""
    joined = join_pieces(kinds, parts)
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        kind.emit(name, joined[name], out)
    return out


def samples_from_pieces(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> list[dict[str, Any]]:
    """One dict per row from consecutive pieces."""
    joined = join_pieces(kinds, parts)
    names = list(kinds)
    values = [kinds[n].emit_samples(joined[n]) for n in names]
    return [dict(zip(names, row)) for row in zip(*values)]
