"""Arrow columns to torch values, column-wise, without a Python object per sample.

Each column of a decoded shard keeps its Arrow chunks, seen without a copy where Arrow
allows (``prepare``, by a *kind* chosen from the Arrow type). Rows reach a batch in one
of two ways:

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
anything else                   list of Python objects (``to_pylist``)
==============================  ======================================================

Variable-length lists come padded (with lengths) rather than as offsets + values
because that is what a model consumes; the lengths give the mask.

Per-sample mode (``emit_samples``) gives one value per row: Python scalars for 1-D
numbers, tensor rows for fixed-size lists, 1-D tensors (unpadded) for variable-length
lists, ``str``/``bytes``/objects for the rest.

Tensors always own their memory: a slice of a shard is copied once, never handed out
as a view (a view would pin the whole shard, make a DataLoader worker share the whole
shard's storage, and could point into read-only, memory-mapped cache pages).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from loaders.source import loader_memory_pool
from loaders.take import row_ranges, take_rows

__all__ = ["Kind", "ListKind", "NumericKind", "RaggedKind", "kind_of", "lengths_key"]


def lengths_key(name: str) -> str:
    """The batch key holding the lengths of variable-length column ``name``."""
    return f"{name}_lengths"


class Kind:
    """How one column type is prepared, indexed and turned into batch values.

    ``data`` is one Arrow chunk as ``prepare`` left it; a *piece* is rows of one or
    more chunks, ready for ``emit``; a *block* is rows gathered for ``select``.
    """

    name = "?"

    def prepare(self, chunk: pa.Array) -> Any:
        """One chunk's data (without a copy where possible)."""
        raise NotImplementedError

    def slice(self, data: Any, start: int, stop: int) -> Any:
        """The piece of rows ``[start, stop)`` of one chunk."""
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

    def fill(self, block: Any, at: int, data: Any, rows: np.ndarray) -> Any:
        """Write rows ``rows`` of chunk ``data`` to the block from row ``at``; returns the block."""
        raise NotImplementedError

    def finish(self, block: Any) -> Any:
        """The block, ready for ``select``, once every row is filled."""
        return block

    def select(self, block: Any, rows: np.ndarray) -> Any:
        """The piece of a block's rows ``rows`` (a copy: the block is reused)."""
        raise NotImplementedError

    def emit(self, name: str, piece: Any, out: dict[str, Any]) -> None:
        """Add the batch value(s) of column ``name`` for ``piece`` to ``out``."""
        raise NotImplementedError

    def emit_samples(self, piece: Any) -> list[Any]:
        """One value per row of ``piece``."""
        raise NotImplementedError


class NumericKind(Kind):
    """Numbers (primitives, fixed-size lists of them): numpy arrays ``(rows, *shape)``."""

    name = "numeric"

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def prepare(self, chunk: pa.Array) -> np.ndarray:
        return _fixed_numpy(chunk, self.shape)

    def slice(self, data: np.ndarray, start: int, stop: int) -> np.ndarray:
        return data[start:stop]

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
        fits = spare is not None and len(spare) >= rows and spare.dtype == like.dtype
        if fits and spare.shape[1:] == like.shape[1:]:
            return spare
        return np.empty((rows, *like.shape[1:]), dtype=like.dtype)

    def fill(self, block: np.ndarray, at: int, data: np.ndarray, rows: np.ndarray) -> np.ndarray:
        dest = block[at : at + len(rows)]
        if data.dtype == block.dtype and data.shape[1:] == block.shape[1:]:
            np.take(data, rows, axis=0, out=dest, mode="clip")  # rows are valid; "raise" would buffer
        else:
            dest[...] = data[rows]
        return block

    def select(self, block: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return block[rows]

    def emit(self, name: str, piece: np.ndarray, out: dict[str, Any]) -> None:
        out[name] = _tensor(piece)

    def emit_samples(self, piece: np.ndarray) -> list[Any]:
        if piece.ndim == 1:
            return piece.tolist()
        return list(_tensor(piece).unbind(0))


class RaggedKind(Kind):
    """A variable-length list of numbers (Arrow arrays): padded 2-D tensor plus lengths."""

    name = "ragged"

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def prepare(self, chunk: pa.Array) -> pa.Array:
        return chunk

    def slice(self, data: pa.Array, start: int, stop: int) -> pa.Array:
        return data.slice(start, stop - start)

    def concat(self, pieces: Sequence[pa.Array]) -> pa.Array:
        return (
            pieces[0]
            if len(pieces) == 1
            else pa.concat_arrays(list(pieces), memory_pool=loader_memory_pool())
        )

    def subset(self, parts: Sequence[tuple[pa.Array, np.ndarray]]) -> pa.Array:
        return self.concat([take_rows(data, rows) for data, rows in parts])

    def new_block(self, rows: int, like: pa.Array, spare: Any = None) -> list[pa.Array]:
        return []

    def fill(self, block: list[pa.Array], at: int, data: pa.Array, rows: np.ndarray) -> list[pa.Array]:
        block.append(take_rows(data, rows))
        return block

    def finish(self, block: list[pa.Array]) -> pa.Array:
        return self.concat(block)

    def select(self, block: pa.Array, rows: np.ndarray) -> pa.Array:
        return take_rows(block, rows)

    def _flat(self, piece: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        offsets = piece.offsets.to_numpy()
        lengths = np.diff(offsets).astype(np.int64)
        values = piece.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        return _numpy(values, self.dtype), lengths

    def emit(self, name: str, piece: pa.Array, out: dict[str, Any]) -> None:
        flat, lengths = self._flat(piece)
        width = int(lengths.max()) if len(lengths) else 0
        padded = np.zeros((len(lengths), width), dtype=flat.dtype)
        padded[np.arange(width) < lengths[:, None]] = flat
        out[name] = torch.from_numpy(padded)
        out[lengths_key(name)] = torch.from_numpy(lengths)

    def emit_samples(self, piece: pa.Array) -> list[Any]:
        flat, lengths = self._flat(piece)
        return list(_tensor(flat).split(lengths.tolist()))


class ListKind(Kind):
    """Strings, binaries and any other type: Python values, made only for rows that are delivered.

    Chunks stay Arrow arrays; a piece is a list of Python values (``to_pylist`` of a
    slice, one call per batch), a block an object array filled with one ``take`` +
    ``to_pylist`` per chunk, from which a batch is one numpy gather.
    """

    name = "list"

    def prepare(self, chunk: pa.Array) -> pa.Array:
        return chunk

    def slice(self, data: pa.Array, start: int, stop: int) -> list[Any]:
        return data.slice(start, stop - start).to_pylist()

    def concat(self, pieces: Sequence[list[Any]]) -> list[Any]:
        return pieces[0] if len(pieces) == 1 else [v for p in pieces for v in p]

    def subset(self, parts: Sequence[tuple[pa.Array, np.ndarray]]) -> pa.Array:
        taken = [take_rows(data, rows) for data, rows in parts]
        return taken[0] if len(taken) == 1 else pa.concat_arrays(taken, memory_pool=loader_memory_pool())

    def new_block(self, rows: int, like: pa.Array, spare: np.ndarray | None = None) -> np.ndarray:
        if spare is not None and len(spare) >= rows:
            return spare
        return np.empty(rows, dtype=object)

    def fill(self, block: np.ndarray, at: int, data: pa.Array, rows: np.ndarray) -> np.ndarray:
        ranges = row_ranges(rows)
        if ranges is None:
            values: Iterable[Any] = take_rows(data, rows).to_pylist()
        else:  # runs of rows (a page-local shuffle): slicing them is cheaper than gathering
            values = itertools.chain.from_iterable(data.slice(a, b - a).to_pylist() for a, b in ranges)
        # fromiter keeps list values as objects (assigning a list of lists would broadcast)
        block[at : at + len(rows)] = np.fromiter(values, dtype=object, count=len(rows))
        return block

    def select(self, block: np.ndarray, rows: np.ndarray) -> list[Any]:
        return block[rows].tolist()

    def emit(self, name: str, piece: list[Any], out: dict[str, Any]) -> None:
        out[name] = piece

    def emit_samples(self, piece: list[Any]) -> list[Any]:
        return piece


def kind_of(typ: pa.DataType) -> Kind:
    """The kind for Arrow type ``typ`` (dictionary types are decoded first, see ``decoded``)."""
    shape = _numeric_shape(typ)
    if shape is not None:
        return NumericKind(shape)
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and _numeric_shape(typ.value_type) == ():
        return RaggedKind(_np_dtype(typ.value_type))
    return ListKind()


def _numeric_shape(typ: pa.DataType) -> tuple[int, ...] | None:
    """Trailing shape when ``typ`` is numbers (or fixed-size lists of them), else None."""
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return ()
    if pa.types.is_temporal(typ):
        return ()
    if pa.types.is_fixed_size_list(typ):
        inner = _numeric_shape(typ.value_type)
        return None if inner is None else (typ.list_size, *inner)
    return None


def _np_dtype(typ: pa.DataType) -> np.dtype:
    if pa.types.is_boolean(typ):
        return np.dtype(np.bool_)
    if pa.types.is_temporal(typ):
        return np.dtype(np.int64 if typ.bit_width == 64 else np.int32)
    return np.dtype(typ.to_pandas_dtype())


def _numpy(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """A 1-D numpy array of a primitive Arrow array (zero-copy when it has no nulls)."""
    if pa.types.is_temporal(array.type):
        array = array.view(pa.int64() if dtype == np.int64 else pa.int32())
    if array.null_count:
        import pyarrow.compute as pc  # only for numbers with nulls: see loaders.take

        array = pc.fill_null(array, pa.scalar(_null_fill(array.type), array.type))
    if pa.types.is_boolean(array.type):
        return array.to_numpy(zero_copy_only=False)
    return array.to_numpy(zero_copy_only=True)


def _null_fill(typ: pa.DataType) -> float | bool | int:
    """What a null becomes: NaN for floats, False for booleans, else 0."""
    if pa.types.is_floating(typ):
        return float("nan")
    return False if pa.types.is_boolean(typ) else 0


def _fixed_numpy(array: pa.Array, shape: tuple[int, ...]) -> np.ndarray:
    """Rows of a (nested) fixed-size list or primitive array as a numpy array ``(n, *shape)``."""
    n = len(array)
    typ = array.type
    while pa.types.is_fixed_size_list(typ):
        size = typ.list_size
        array = array.values.slice(array.offset * size, len(array) * size)
        typ = typ.value_type
    flat = _numpy(array, _np_dtype(typ))
    return flat.reshape((n, *shape)) if shape else flat


def _tensor(piece: np.ndarray) -> torch.Tensor:
    """A tensor that owns its memory: a view (of a shard, of an Arrow buffer) is copied once."""
    if piece.base is None and piece.flags.writeable and piece.flags.c_contiguous:
        return torch.from_numpy(piece)
    out = torch.empty(piece.shape, dtype=_torch_dtype(piece.dtype))
    np.copyto(out.numpy(), piece, casting="no")
    return out


@functools.lru_cache(maxsize=32)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
