"""Columns of decoded shards to torch values, column-wise, without a Python object per sample.

A column chunk arrives as a :class:`loaders.ipcview.Column`: numpy views of its Arrow
buffers, read from the RAM tier's decoded file without pyarrow, or taken from an Arrow
array (:func:`loaders.ipcview.column_from_arrow`) where pyarrow read the shard. A *kind*
chosen from the column's type prepares each chunk (``prepare``, no copy where possible)
and moves its rows to a batch in one of two ways:

- **in order** (no shuffle): ``slice`` rows of one chunk, ``concat`` the slices;
- **gathered** (shuffle): rows of a few batches are first gathered from many chunks
  into one *block* (``new_block`` / ``fill``, one call per chunk), then each batch
  ``select``\\ s its rows from the block. The per-call costs are paid once per block,
  not once per batch, and only the rows a reader delivers are ever converted.

``emit`` builds the batch values for all rows at once:

==============================  ======================================================
Arrow type                      batch value (``emit``)
==============================  ======================================================
integer, float, bool            1-D tensor (nulls become 0, False, NaN for floats)
fixed-size list (nested too)    N-D tensor, e.g. ``(batch, 512)``
temporal (timestamp, date, …)   int64 / int32 tensor of the stored integers
variable-length list of numbers padded 2-D tensor (pad 0) plus ``<name>_lengths`` (int64)
string, binary                  list of ``str`` / ``bytes`` (None for null)
null                            list of None
anything else                   list of Python objects (``to_pylist``; needs pyarrow)
==============================  ======================================================

Variable-length lists come padded (with lengths) rather than as offsets + values
because that is what a model consumes; the lengths give the mask.

Per-sample mode (``emit_samples``) gives one value per row: Python scalars for 1-D
numbers, tensor rows for fixed-size lists, 1-D tensors (unpadded) for variable-length
lists, ``str``/``bytes``/objects for the rest.

A shard read from the RAM tier comes with a *reader* (:data:`Reader`): rows that are
copied out anyway (a slice in order, a range of rows gathered) are then read from the
file with ``pread`` straight into their destination, never through the mapping, so the
process maps, faults in and later unmaps no page of their values (see
:mod:`cachetier.pages`). Offsets and validity stay read in place: they are small.

Tensors always own their memory: a slice of a shard is copied once, never handed out
as a view (a view would pin the whole shard, make a DataLoader worker share the whole
shard's storage, and could point into read-only, memory-mapped cache pages). In a
DataLoader worker they are made in shared memory, as torch's ``default_collate`` makes
its batches there: passing them to the training process then copies nothing more, and
the worker's heap does not churn (a tensor made in private memory is copied to shared
memory when it is sent, and freed; measured, that left about 9 MB of free heap per worker).
"""

from __future__ import annotations

import functools
import itertools
import math
import mmap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaders.ipcview import Column, FieldType

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "Kind",
    "NullKind",
    "NumericKind",
    "ObjectKind",
    "RaggedKind",
    "Reader",
    "Scratch",
    "StringKind",
    "kind_of",
    "lengths_key",
    "row_ranges",
]

#: Ranges are worth slicing when they hold at least this many rows on average.
_RANGE_ROWS = 8

#: Copies the bytes of ``view`` (a C-contiguous view of a shard's buffer) into ``out`` (as
#: many bytes, C-contiguous, writable) from the shard's file, not through its mapping;
#: False, copying nothing, when ``view`` does not lie in that file.
Reader = Callable[[np.ndarray, np.ndarray], bool]


def lengths_key(name: str) -> str:
    """The batch key holding the lengths of variable-length column ``name``."""
    return f"{name}_lengths"


class Kind:
    """How one column type is prepared, indexed and turned into batch values.

    ``data`` is one chunk as ``prepare`` left it; a *piece* is rows of one or more
    chunks, ready for ``emit``; a *block* is rows gathered for ``select``.
    """

    name = "?"
    #: True when ``prepare`` takes the chunk as a pyarrow array, not as a :class:`Column`
    arrow = False

    def prepare(self, chunk: Any) -> Any:
        """One chunk's data (without a copy where possible)."""
        raise NotImplementedError

    def slice(self, data: Any, start: int, stop: int, read: Reader | None = None) -> Any:
        """The piece of rows ``[start, stop)`` of one chunk (values copied with ``read``
        where the kind can)."""
        raise NotImplementedError

    def concat(self, pieces: Sequence[Any]) -> Any:
        """Join pieces, in order."""
        raise NotImplementedError

    def subset(self, parts: Sequence[tuple[Any, np.ndarray]]) -> Any:
        """One chunk's data holding rows ``rows`` of each chunk ``data`` of ``parts``, in order."""
        raise NotImplementedError

    def new_block(self, rows: int, like: Any, spare: Any = None) -> Any:
        """A block with room for ``rows`` rows of data like ``like`` (``spare``, an older one, if it fits)."""
        raise NotImplementedError

    def fill(self, block: Any, at: int, data: Any, rows: np.ndarray, read: Reader | None = None) -> Any:
        """Write rows ``rows`` of chunk ``data`` to the block from row ``at`` (ranges of
        them copied with ``read`` where the kind can); returns the block."""
        raise NotImplementedError

    def finish(self, block: Any) -> Any:
        """The block, ready for ``select``, once every row is filled."""
        return block

    def read_rows(self, data: Any, start: int, stop: int, read: Reader, scratch: Scratch) -> Any:
        """Rows ``[start, stop)`` of chunk ``data`` as chunk data of their own, their values
        copied with ``read`` into ``scratch`` (valid until its next use), for ``fill`` to
        gather from; None where the kind cannot."""
        return None

    def select(self, block: Any, rows: np.ndarray) -> Any:
        """The piece of a block's rows ``rows`` (a copy: the block is reused)."""
        raise NotImplementedError

    def emit(self, name: str, piece: Any, out: dict[str, Any]) -> None:
        """Add the batch value(s) of column ``name`` for ``piece`` to ``out``."""
        raise NotImplementedError

    def emit_samples(self, piece: Any) -> list[Any]:
        """One value per row of ``piece``."""
        raise NotImplementedError


def _with_room(rows: int) -> int:
    """Rows to allocate for a gathered block of ``rows``: an eighth more, so the next
    blocks (of about the same size) fit in it instead of each being allocated anew."""
    return rows + rows // 8


def _mapped_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array in an anonymous mapping of its own, given back to the system
    as soon as the array (and every view of it) is freed.

    For gathered blocks: megabytes, held for a while, then dropped. From malloc, freeing
    one raises glibc's mmap threshold to its size, so every later block comes from the
    heap, and the heap keeps up to twice that size free instead of giving it back:
    measured, the process grew by 4.4 MB over 3 epochs, flat with blocks of their own.
    """
    count = math.prod(shape)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    return np.frombuffer(mmap.mmap(-1, max(1, count * dtype.itemsize), flags=flags), dtype, count).reshape(
        shape
    )


class Scratch:
    """A buffer reused for values copied out only to be gathered from, one use at a time:
    in a mapping of its own (see :func:`_mapped_empty`), replaced when too small."""

    def __init__(self) -> None:
        self._buffer: np.ndarray | None = None

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array over the buffer (the previous one's bytes)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if self._buffer is None or self._buffer.nbytes < nbytes:
            self._buffer = _mapped_empty((_with_room(nbytes),), np.dtype(np.uint8))
        return self._buffer[:nbytes].view(dtype).reshape(shape)


def _block_buffer(rows: int, like: np.ndarray, spare: np.ndarray | None) -> np.ndarray:
    """A buffer for ``rows`` rows like ``like``'s: ``spare`` (an older block's) when it fits,
    else a new mapping with room (:func:`_with_room`)."""
    if (
        spare is not None
        and len(spare) >= rows
        and spare.dtype == like.dtype
        and spare.shape[1:] == like.shape[1:]
    ):
        return spare
    return _mapped_empty((_with_room(rows), *like.shape[1:]), like.dtype)


class NumericKind(Kind):
    """Numbers (primitives, fixed-size lists of them): numpy arrays ``(rows, *shape)``."""

    name = "numeric"

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def prepare(self, chunk: Column) -> np.ndarray:
        return _numbers(chunk)

    def slice(self, data: np.ndarray, start: int, stop: int, read: Reader | None = None) -> np.ndarray:
        piece = data[start:stop]
        if read is not None and len(piece):
            out = _empty(piece.shape, piece.dtype).numpy()  # the batch's own tensor: see _tensor
            if read(piece, out):
                return out
        return piece

    def concat(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def subset(self, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        out = self.new_block(sum(len(r) for _, r in parts), parts[0][0])
        at = 0
        for data, rows in parts:
            self.fill(out, at, data, rows)
            at += len(rows)
        return out

    def new_block(self, rows: int, like: np.ndarray, spare: np.ndarray | None = None) -> np.ndarray:
        return _block_buffer(rows, like, spare)

    def fill(
        self, block: np.ndarray, at: int, data: np.ndarray, rows: np.ndarray, read: Reader | None = None
    ) -> np.ndarray:
        dest = block[at : at + len(rows)]
        same = data.dtype == block.dtype and data.shape[1:] == block.shape[1:]
        if read is not None and same and _read_ranges(read, data, rows, dest):
            return block
        if same:
            np.take(data, rows, axis=0, out=dest, mode="clip")  # rows are valid; "raise" would buffer
        else:
            dest[...] = data[rows]
        return block

    def read_rows(self, data: np.ndarray, start: int, stop: int, read: Reader, scratch: Scratch) -> Any:
        view = data[start:stop]
        out = scratch.array(view.shape, view.dtype)
        return out if read(view, out) else None

    def select(self, block: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return block[rows]

    def emit(self, name: str, piece: np.ndarray, out: dict[str, Any]) -> None:
        out[name] = _tensor(piece)

    def emit_samples(self, piece: np.ndarray) -> list[Any]:
        if piece.ndim == 1:
            return piece.tolist()
        return list(_tensor(piece).unbind(0))


@dataclass(frozen=True, slots=True)
class Ragged:
    """Rows of variable length: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    offsets: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def rows(self, start: int, stop: int) -> Ragged:
        """Rows ``[start, stop)`` (views, no copy)."""
        return Ragged(self.offsets[start : stop + 1], self.values)

    def take(self, rows: np.ndarray) -> Ragged:
        """Rows ``rows``, copied into arrays of their own (offsets from 0)."""
        starts = self.offsets[rows].astype(np.int64)
        lengths = self.offsets[rows + 1].astype(np.int64) - starts
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # index of every value taken: its row's start, plus its place in the row
        index = np.arange(int(offsets[-1]), dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths)
        return Ragged(offsets, self.values[index])

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The values of all rows, in order, and each row's length (int64)."""
        first, last = int(self.offsets[0]), int(self.offsets[-1])
        return self.values[first:last], np.diff(self.offsets).astype(np.int64)

    @staticmethod
    def join(
        pieces: Sequence[Ragged], empty: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty
    ) -> Ragged:
        """Pieces, in order, as one (copied into values from ``empty`` when there is more than one)."""
        if len(pieces) == 1:
            return pieces[0]
        flats = [p.flat() for p in pieces]
        lengths = np.concatenate([n for _, n in flats])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        like = pieces[0].values
        values = empty((int(offsets[-1]), *like.shape[1:]), like.dtype)
        np.concatenate([v for v, _ in flats], out=values)
        return Ragged(offsets, values)


class _RaggedPieces(list):
    """A ragged block while it is gathered: its pieces, and the buffer of an older block
    (``room``, None if none) to join them into."""

    def __init__(self, room: np.ndarray | None) -> None:
        super().__init__()
        self.room = room


@dataclass(frozen=True, slots=True)
class _RaggedBlock(Ragged):
    """A gathered ragged block: its ``values`` start ``room``, a buffer of its own (see
    :func:`_mapped_empty`) that the next block is joined into when it fits."""

    room: np.ndarray | None = None


class RaggedKind(Kind):
    """A variable-length list of numbers: padded 2-D tensor plus lengths."""

    name = "ragged"

    def prepare(self, chunk: Column) -> Ragged:
        assert chunk.offsets is not None and chunk.child is not None
        return Ragged(chunk.offsets, _numbers(chunk.child))

    def slice(self, data: Ragged, start: int, stop: int, read: Reader | None = None) -> Ragged:
        piece = data.rows(start, stop)
        return (read is not None and _read_ragged(read, piece)) or piece

    def concat(self, pieces: Sequence[Ragged]) -> Ragged:
        return Ragged.join(pieces)

    def subset(self, parts: Sequence[tuple[Ragged, np.ndarray]]) -> Ragged:
        return Ragged.join([data.take(rows) for data, rows in parts])

    def new_block(self, rows: int, like: Ragged, spare: Any = None) -> list[Ragged]:
        return _RaggedPieces(spare.room if isinstance(spare, _RaggedBlock) else None)

    def fill(
        self, block: list[Ragged], at: int, data: Ragged, rows: np.ndarray, read: Reader | None = None
    ) -> list[Ragged]:
        ranges = row_ranges(rows) if read is not None else None
        if ranges is not None:
            pieces = [_read_ragged(read, data.rows(a, b)) for a, b in ranges]
            if all(pieces):
                block.extend(pieces)
                return block
        block.append(data.take(rows))
        return block

    def finish(self, block: list[Ragged]) -> Ragged:
        if len(block) < 2:
            return Ragged.join(block)
        count = sum(int(p.offsets[-1] - p.offsets[0]) for p in block)
        room = _block_buffer(count, block[0].values, block.room if isinstance(block, _RaggedPieces) else None)
        joined = Ragged.join(block, empty=lambda shape, dtype: room[: shape[0]])
        return _RaggedBlock(joined.offsets, joined.values, room)

    def read_rows(self, data: Ragged, start: int, stop: int, read: Reader, scratch: Scratch) -> Any:
        return _read_ragged(read, data.rows(start, stop), scratch.array)

    def select(self, block: Ragged, rows: np.ndarray) -> Ragged:
        return block.take(rows)

    def emit(self, name: str, piece: Ragged, out: dict[str, Any]) -> None:
        flat, lengths = piece.flat()
        width = int(lengths.max()) if len(lengths) else 0
        padded = _empty((len(lengths), width), flat.dtype)
        values = padded.numpy()
        values.fill(0)
        values[np.arange(width) < lengths[:, None]] = flat
        out[name] = padded
        out[lengths_key(name)] = _tensor(lengths)

    def emit_samples(self, piece: Ragged) -> list[Any]:
        flat, lengths = piece.flat()
        return list(_tensor(flat).split(lengths.tolist()))


@dataclass(frozen=True, slots=True)
class Strings:
    """String or binary values: row ``i`` is ``data[offsets[i]:offsets[i + 1]]``, None
    where ``valid`` says so; ``text`` rows are decoded as UTF-8."""

    offsets: np.ndarray
    data: memoryview
    valid: np.ndarray | None
    text: bool

    def values(self, start: int, stop: int) -> list[Any]:
        """Rows ``[start, stop)`` as Python values."""
        bounds = self.offsets[start : stop + 1].tolist()
        data, make = self.data, (_utf8 if self.text else bytes)
        out = [make(data[a:b]) for a, b in itertools.pairwise(bounds)]
        if self.valid is not None:
            for i in np.flatnonzero(~self.valid[start:stop]).tolist():
                out[i] = None
        return out

    def values_at(self, rows: np.ndarray) -> list[Any]:
        """Rows ``rows`` as Python values (runs of consecutive rows are sliced, not gathered)."""
        ranges = row_ranges(rows)
        if ranges is not None:
            return list(itertools.chain.from_iterable(self.values(a, b) for a, b in ranges))
        starts, stops = self.offsets[rows].tolist(), self.offsets[rows + 1].tolist()
        data, make = self.data, (_utf8 if self.text else bytes)
        out = [make(data[a:b]) for a, b in zip(starts, stops)]
        if self.valid is not None:
            for i in np.flatnonzero(~self.valid[rows]).tolist():
                out[i] = None
        return out

    def take(self, rows: np.ndarray) -> Strings:
        """Rows ``rows``, copied into buffers of their own."""
        taken = Ragged(self.offsets, np.frombuffer(self.data, dtype=np.uint8)).take(rows)
        valid = None if self.valid is None else self.valid[rows]
        return Strings(taken.offsets, memoryview(taken.values), valid, self.text)


def _utf8(raw: memoryview) -> str:
    return str(raw, "utf-8")


class _ValuesKind(Kind):
    """A kind whose pieces are lists of Python values and whose blocks are object arrays."""

    def concat(self, pieces: Sequence[list[Any]]) -> list[Any]:
        return pieces[0] if len(pieces) == 1 else [v for p in pieces for v in p]

    def new_block(self, rows: int, like: Any, spare: np.ndarray | None = None) -> np.ndarray:
        if spare is not None and spare.dtype == object and len(spare) >= rows:
            spare[rows:] = None  # values of an earlier block are not kept alive by its tail
            return spare
        return np.empty(_with_room(rows), dtype=object)

    def select(self, block: np.ndarray, rows: np.ndarray) -> list[Any]:
        return block[rows].tolist()

    def emit(self, name: str, piece: list[Any], out: dict[str, Any]) -> None:
        out[name] = piece

    def emit_samples(self, piece: list[Any]) -> list[Any]:
        return piece


class StringKind(_ValuesKind):
    """Strings and binaries (fixed-size too): ``str`` / ``bytes`` made only for rows that
    are delivered. A piece is a list of Python values (one slice per batch); a block an
    object array filled once per chunk, from which a batch is one numpy gather."""

    name = "strings"

    def prepare(self, chunk: Column) -> Strings:
        assert chunk.values is not None
        if chunk.offsets is None:  # fixed-size binary: (rows, width) bytes
            width = chunk.type.width
            offsets = np.arange(0, (chunk.length + 1) * width, width, dtype=np.int64)
            data = np.ascontiguousarray(chunk.values).reshape(-1)
        else:
            offsets, data = chunk.offsets, chunk.values
        valid = chunk.valid if chunk.null_count else None
        return Strings(offsets, memoryview(data).cast("B"), valid, chunk.type.id == "utf8")

    def slice(self, data: Strings, start: int, stop: int, read: Reader | None = None) -> list[Any]:
        own = _read_strings(read, data, start, stop) if read is not None else None
        return own.values(0, stop - start) if own is not None else data.values(start, stop)

    def read_rows(self, data: Strings, start: int, stop: int, read: Reader, scratch: Scratch) -> Any:
        return _read_strings(read, data, start, stop, scratch.array)

    def subset(self, parts: Sequence[tuple[Strings, np.ndarray]]) -> Strings:
        taken = [data.take(rows) for data, rows in parts]
        if len(taken) == 1:
            return taken[0]
        joined = Ragged.join([Ragged(t.offsets, np.frombuffer(t.data, dtype=np.uint8)) for t in taken])
        valids = [t.valid if t.valid is not None else np.ones(len(t.offsets) - 1, bool) for t in taken]
        valid = None if all(t.valid is None for t in taken) else np.concatenate(valids)
        return Strings(joined.offsets, memoryview(joined.values), valid, taken[0].text)

    def fill(
        self, block: np.ndarray, at: int, data: Strings, rows: np.ndarray, read: Reader | None = None
    ) -> np.ndarray:
        ranges = row_ranges(rows) if read is not None else None
        if ranges is not None:
            owns = [_read_strings(read, data, a, b) for a, b in ranges]
            if all(o is not None for o in owns):
                values = itertools.chain.from_iterable(o.values(0, len(o.offsets) - 1) for o in owns)
                block[at : at + len(rows)] = np.fromiter(values, dtype=object, count=len(rows))
                return block
        block[at : at + len(rows)] = np.fromiter(data.values_at(rows), dtype=object, count=len(rows))
        return block


class NullKind(_ValuesKind):
    """A column of the null type: None for every row (a chunk is its row count)."""

    name = "null"

    def prepare(self, chunk: Column) -> int:
        return chunk.length

    def slice(self, data: int, start: int, stop: int, read: Reader | None = None) -> list[Any]:
        return [None] * (stop - start)

    def subset(self, parts: Sequence[tuple[int, np.ndarray]]) -> int:
        return sum(len(rows) for _, rows in parts)

    def fill(
        self, block: np.ndarray, at: int, data: int, rows: np.ndarray, read: Reader | None = None
    ) -> np.ndarray:
        block[at : at + len(rows)] = None
        return block

    def select(self, block: np.ndarray, rows: np.ndarray) -> list[Any]:
        return [None] * len(rows)


class ObjectKind(_ValuesKind):
    """Any other type (structs, maps, lists of strings, decimals, …): Python values
    (``to_pylist``), made only for rows that are delivered.

    Only shards read with pyarrow have such columns (:mod:`loaders.ipcview` does not
    read them), so chunks stay pyarrow arrays: a piece is a list of Python values (one
    ``to_pylist`` of a slice per batch), a block an object array filled with one
    ``take`` + ``to_pylist`` per chunk.
    """

    name = "objects"
    arrow = True

    def prepare(self, chunk: pa.Array) -> pa.Array:
        return chunk

    def slice(self, data: pa.Array, start: int, stop: int, read: Reader | None = None) -> list[Any]:
        return data.slice(start, stop - start).to_pylist()

    def subset(self, parts: Sequence[tuple[pa.Array, np.ndarray]]) -> pa.Array:
        import pyarrow as pa

        from loaders.take import take_rows

        taken = [take_rows(data, rows) for data, rows in parts]
        if len(taken) == 1:
            return taken[0]
        from loaders.source import loader_memory_pool

        return pa.concat_arrays(taken, memory_pool=loader_memory_pool())

    def fill(
        self, block: np.ndarray, at: int, data: pa.Array, rows: np.ndarray, read: Reader | None = None
    ) -> np.ndarray:
        from loaders.take import take_rows

        ranges = row_ranges(rows)
        if ranges is None:
            values: Iterable[Any] = take_rows(data, rows).to_pylist()
        else:  # runs of rows (a page-local shuffle): slicing them is cheaper than gathering
            values = itertools.chain.from_iterable(data.slice(a, b - a).to_pylist() for a, b in ranges)
        # fromiter keeps list values as objects (assigning a list of lists would broadcast)
        block[at : at + len(rows)] = np.fromiter(values, dtype=object, count=len(rows))
        return block


def kind_of(typ: FieldType) -> Kind:
    """The kind for column type ``typ`` (dictionary types are decoded first, see ``decoded``)."""
    shape = _numeric_shape(typ)
    if shape is not None:
        return NumericKind(shape)
    if typ.id == "list" and typ.child is not None and _numeric_shape(typ.child.type) == ():
        return RaggedKind()
    if typ.id in ("utf8", "binary", "fixed_binary"):
        return StringKind()
    if typ.id == "null":
        return NullKind()
    return ObjectKind()


def row_ranges(rows: np.ndarray) -> list[tuple[int, int]] | None:
    """``rows`` as ``[(start, stop), ...]`` ranges of consecutive rows, when they are
    ascending runs of ``_RANGE_ROWS`` or more on average; else None."""
    n = len(rows)
    if n < _RANGE_ROWS:
        return None
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    if (len(breaks) + 1) * _RANGE_ROWS > n:
        return None
    starts = np.concatenate([[0], breaks]).tolist()
    stops = [*breaks.tolist(), n]
    first = rows[starts].tolist()
    return [(a, a + (e - s)) for a, s, e in zip(first, starts, stops)]


def _read_ranges(read: Reader, data: np.ndarray, rows: np.ndarray, dest: np.ndarray) -> bool:
    """Copy rows ``rows`` of ``data`` into ``dest`` range by range with ``read``; False
    (``dest`` left to the caller) when they are not ranges or not in the reader's file."""
    ranges = row_ranges(rows)
    if ranges is None:
        return False
    at = 0
    for a, b in ranges:
        if not read(data[a:b], dest[at : at + b - a]):
            return False
        at += b - a
    return True


def _read_ragged(read: Reader, piece: Ragged, empty: Callable[..., np.ndarray] = np.empty) -> Ragged | None:
    """``piece`` (consecutive rows) with its values copied with ``read`` into an array
    from ``empty`` (None if it cannot)."""
    first, last = int(piece.offsets[0]), int(piece.offsets[-1])
    view = piece.values[first:last]
    values = empty(view.shape, view.dtype)
    if len(view) and not read(view, values):
        return None
    return Ragged(piece.offsets.astype(np.int64) - first, values)


def _read_strings(
    read: Reader, data: Strings, start: int, stop: int, empty: Callable[..., np.ndarray] = np.empty
) -> Strings | None:
    """Rows ``[start, stop)`` of ``data`` with their bytes copied with ``read`` into an
    array from ``empty`` (None if it cannot)."""
    offsets = data.offsets[start : stop + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    raw = empty((last - first,), np.dtype(np.uint8))
    if last > first and not read(np.frombuffer(data.data, dtype=np.uint8)[first:last], raw):
        return None
    valid = None if data.valid is None else data.valid[start:stop]
    return Strings(offsets.astype(np.int64) - first, memoryview(raw), valid, data.text)


def _numeric_shape(typ: FieldType) -> tuple[int, ...] | None:
    """Trailing shape when ``typ`` is numbers (or fixed-size lists of them), else None."""
    if typ.id in ("int", "float", "bool", "temporal"):
        return ()
    if typ.id == "fixed_list" and typ.child is not None:
        inner = _numeric_shape(typ.child.type)
        return None if inner is None else (typ.width, *inner)
    return None


def _numbers(column: Column) -> np.ndarray:
    """A numeric (or nested fixed-size list) column as numpy ``(rows, *shape)``, nulls
    filled (NaN for floats, False for booleans, else 0); a view where it has no nulls.
    A null fixed-size list keeps the values stored under it."""
    if column.type.id == "fixed_list":
        assert column.child is not None
        inner = _numbers(column.child)
        return inner.reshape((column.length, column.type.width, *inner.shape[1:]))
    values = column.values
    assert values is not None
    if column.null_count and column.valid is not None:
        values = np.where(column.valid, values, _null_fill(values.dtype))
    return values


def _null_fill(dtype: np.dtype) -> float | bool | int:
    """What a null becomes: NaN for floats, False for booleans, else 0."""
    if dtype.kind == "f":
        return float("nan")
    return False if dtype.kind == "b" else 0


def _tensor(piece: np.ndarray) -> torch.Tensor:
    """A tensor that owns its memory: a view (of a shard, of an Arrow buffer) is copied once;
    in a DataLoader worker, every piece is copied once, into shared memory (see :func:`_empty`)."""
    base = piece.base
    if (
        isinstance(base, torch.Tensor)
        and piece.flags.c_contiguous
        and base.data_ptr() == piece.ctypes.data
        and tuple(base.shape) == piece.shape
    ):
        return base  # the whole of a tensor made for this piece (NumericKind.slice)
    owned = base is None and piece.flags.writeable and piece.flags.c_contiguous
    if owned and get_worker_info() is None:
        return torch.from_numpy(piece)
    out = _empty(piece.shape, piece.dtype)
    np.copyto(out.numpy(), piece, casting="no")
    return out


def _empty(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """An uninitialised tensor; in a DataLoader worker, in shared memory (module docstring)."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=_torch_dtype(dtype))
    # what default_collate does in a worker; _new_shared is torch's own (private) constructor
    storage = torch.UntypedStorage._new_shared(max(1, math.prod(shape) * dtype.itemsize))
    return torch.empty(0, dtype=_torch_dtype(dtype)).set_(storage, 0, shape)


@functools.lru_cache(maxsize=32)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
