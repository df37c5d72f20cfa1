"""Arrow columns to torch values, column-wise, without a Python object per sample.

Each column of a decoded shard is converted once (``prepare``), by a *kind* chosen
from its Arrow type; a batch is then ``take`` (rows of one shard) or ``gather`` (rows
of several shards), and ``emit`` builds the output for all rows at once:

==============================  ======================================================
Arrow type                      batch value (``emit``)
==============================  ======================================================
integer, float, bool            1-D tensor (nulls become 0, NaN for floats)
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

import bisect
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = [
    "Chunks",
    "Kind",
    "ListKind",
    "NumericKind",
    "RaggedKind",
    "Rows",
    "Slab",
    "kind_of",
    "lengths_key",
]

Rows = slice | np.ndarray


def lengths_key(name: str) -> str:
    """The batch key holding the lengths of variable-length column ``name``."""
    return f"{name}_lengths"


class Kind:
    """How one column type is prepared, indexed and turned into batch values."""

    name = "?"

    def prepare(self, chunks: Sequence[pa.Array]) -> Any:
        """The column's data for one shard, from its Arrow chunks."""
        raise NotImplementedError

    def take(self, data: Any, rows: Rows) -> Any:
        """The piece of one shard's data at ``rows``."""
        raise NotImplementedError

    def gather(self, datas: Sequence[Any], which: np.ndarray, rows: np.ndarray) -> Any:
        """The piece whose ``i``-th row is ``rows[i]`` of ``datas[which[i]]``."""
        raise NotImplementedError

    def concat(self, pieces: Sequence[Any]) -> Any:
        """Join pieces (taken from consecutive windows)."""
        raise NotImplementedError

    def emit(self, name: str, piece: Any, out: dict[str, Any]) -> None:
        """Add the batch value(s) of column ``name`` for ``piece`` to ``out``."""
        raise NotImplementedError

    def emit_samples(self, piece: Any) -> list[Any]:
        """One value per row of ``piece``."""
        raise NotImplementedError


class Slab:
    """Rows ``[base, base + rows)`` of a stacked array that holds several shards' values.

    Readers that shuffle stack the numeric columns of their resident shards in one array
    per column (see :class:`loaders.decoded.SlotRing`), so a batch drawn from several
    shards is one numpy gather instead of one per shard.
    """

    __slots__ = ("array", "base", "rows")

    def __init__(self, array: np.ndarray, base: int, rows: int) -> None:
        self.array = array
        self.base = base
        self.rows = rows


class Chunks:
    """A shard's column as its Arrow chunks, viewed as numpy arrays without a copy."""

    __slots__ = ("arrays", "bounds")

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = list(arrays)
        self.bounds = [0]
        for a in self.arrays:
            self.bounds.append(self.bounds[-1] + len(a))

    def take(self, rows: Rows) -> np.ndarray:
        if isinstance(rows, slice):
            start, stop = rows.start, rows.stop
            k = bisect.bisect_right(self.bounds, start) - 1
            if k + 1 >= len(self.bounds) or stop <= self.bounds[k + 1]:
                return self.arrays[min(k, len(self.arrays) - 1)][
                    start - self.bounds[k] : stop - self.bounds[k]
                ]
            parts = []
            while start < stop:
                end = min(stop, self.bounds[k + 1])
                parts.append(self.arrays[k][start - self.bounds[k] : end - self.bounds[k]])
                start, k = end, k + 1
            return np.concatenate(parts)
        if len(self.arrays) == 1:
            return self.arrays[0][rows]
        which = np.searchsorted(self.bounds, rows, side="right") - 1
        first = self.arrays[0]
        out = np.empty((len(rows), *first.shape[1:]), dtype=first.dtype)
        for u in np.unique(which).tolist():
            mask = which == u
            out[mask] = self.arrays[u][rows[mask] - self.bounds[u]]
        return out


class NumericKind(Kind):
    """Numbers (primitives, fixed-size lists of them): numpy rows of a :class:`Slab` or :class:`Chunks`."""

    name = "numeric"

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def convert(self, chunk: pa.Array) -> np.ndarray:
        """One Arrow chunk as a numpy array ``(n, *shape)`` (a view where Arrow allows)."""
        return _fixed_numpy(chunk, self.shape)

    def prepare(self, chunks: Sequence[pa.Array]) -> Chunks:
        return Chunks([self.convert(c) for c in chunks])

    def take(self, data: Slab | Chunks, rows: Rows) -> np.ndarray:
        if isinstance(data, Chunks):
            return data.take(rows)
        if isinstance(rows, slice):
            return data.array[data.base + rows.start : data.base + rows.stop]
        return data.array[data.base + rows]

    def gather(self, datas: Sequence[Slab | Chunks], which: np.ndarray, rows: np.ndarray) -> np.ndarray:
        first = datas[0]
        if isinstance(first, Slab) and all(isinstance(d, Slab) and d.array is first.array for d in datas):
            bases = np.array([d.base for d in datas], dtype=np.int64)
            return first.array[bases[which] + rows]
        pieces = [self.take(d, rows[which == u]) for u, d in enumerate(datas)]
        sample = next(p for p in pieces if p is not None)
        out = np.empty((len(rows), *sample.shape[1:]), dtype=sample.dtype)
        for u, piece in enumerate(pieces):
            out[which == u] = piece
        return out

    def concat(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(pieces)

    def emit(self, name: str, piece: np.ndarray, out: dict[str, Any]) -> None:
        out[name] = _tensor(piece)

    def emit_samples(self, piece: np.ndarray) -> list[Any]:
        if piece.ndim == 1:
            return piece.tolist()
        return list(_tensor(piece).unbind(0))


class RaggedKind(Kind):
    """A variable-length list of numbers (one Arrow array per shard): padded 2-D tensor plus lengths."""

    name = "ragged"

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def prepare(self, chunks: Sequence[pa.Array]) -> pa.Array:
        return chunks[0] if len(chunks) == 1 else pa.concat_arrays(list(chunks))

    def take(self, data: pa.Array, rows: Rows) -> pa.Array:
        if isinstance(rows, slice):
            return data.slice(rows.start, rows.stop - rows.start)
        return data.take(pa.array(rows))

    def gather(self, datas: Sequence[pa.Array], which: np.ndarray, rows: np.ndarray) -> pa.Array:
        order = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[order], np.arange(len(datas) + 1))
        pieces = [self.take(d, rows[order[a:b]]) for d, a, b in zip(datas, bounds[:-1], bounds[1:])]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return pa.concat_arrays(pieces).take(pa.array(inverse))

    def concat(self, pieces: Sequence[pa.Array]) -> pa.Array:
        return pa.concat_arrays(list(pieces))

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
    """Strings, binaries and any other type: Python values, made once per shard.

    The whole column is converted when the shard is decoded, so a batch, shuffled or
    not, is a list of references to existing objects: no per-batch Arrow calls. Readers
    that shuffle stack the values in an object array (a :class:`Slab`) to gather them
    in one numpy call.
    """

    name = "list"

    def prepare(self, chunks: Sequence[pa.Array]) -> list[Any]:
        return [v for c in chunks for v in c.to_pylist()]

    def take(self, data: list[Any] | Slab, rows: Rows) -> list[Any]:
        if isinstance(data, Slab):
            if isinstance(rows, slice):
                return data.array[data.base + rows.start : data.base + rows.stop].tolist()
            return data.array[data.base + rows].tolist()
        if isinstance(rows, slice):
            return data[rows]
        return [data[r] for r in rows.tolist()]

    def gather(self, datas: Sequence[list[Any] | Slab], which: np.ndarray, rows: np.ndarray) -> list[Any]:
        first = datas[0]
        if isinstance(first, Slab) and all(isinstance(d, Slab) and d.array is first.array for d in datas):
            bases = np.array([d.base for d in datas], dtype=np.int64)
            return first.array[bases[which] + rows].tolist()
        return [self.take(datas[u], np.array([r]))[0] for u, r in zip(which.tolist(), rows.tolist())]

    def concat(self, pieces: Sequence[list[Any]]) -> list[Any]:
        return [v for p in pieces for v in p]

    def emit(self, name: str, piece: list[Any], out: dict[str, Any]) -> None:
        out[name] = piece

    def emit_samples(self, piece: list[Any]) -> list[Any]:
        return piece


def kind_of(typ: pa.DataType) -> Kind:
    """The kind for Arrow type ``typ`` (dictionary types are decoded first, see ``decode``)."""
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
        fill = float("nan") if pa.types.is_floating(array.type) else 0
        array = pc.fill_null(array, pa.scalar(fill, array.type))
    if pa.types.is_boolean(array.type):
        return array.to_numpy(zero_copy_only=False)
    return array.to_numpy(zero_copy_only=True)


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
