"""Arrow columns to torch values, column-wise, without a Python object per sample.

One window's column (the same column of its few shards) becomes one :class:`Column`,
chosen by Arrow type once per window; a batch is then a ``take`` of rows and an
``emit`` that builds the output for all rows at once:

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

Per-sample mode (``emit_samples``) gives one value per row: Python scalars for 1-D
numbers, tensor rows for fixed-size lists, 1-D tensors (unpadded) for variable-length
lists, ``str``/``bytes``/objects for the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["Column", "NumericColumn", "RaggedColumn", "ListColumn", "make_column", "lengths_key"]

Rows = slice | np.ndarray


def lengths_key(name: str) -> str:
    """The batch key holding the lengths of variable-length column ``name``."""
    return f"{name}_lengths"


class Column:
    """One column of a loaded window: ``take`` rows, ``concat`` pieces, ``emit`` values."""

    def __init__(self, name: str) -> None:
        self.name = name

    def take(self, rows: Rows) -> Any:
        """The piece of this column at ``rows`` (a view for a slice where possible)."""
        raise NotImplementedError

    def concat(self, pieces: Sequence[Any]) -> Any:
        """Join pieces taken from consecutive windows."""
        raise NotImplementedError

    def emit(self, piece: Any, out: dict[str, Any]) -> None:
        """Add this column's batch value(s) for ``piece`` to ``out``."""
        raise NotImplementedError

    def emit_samples(self, piece: Any) -> list[Any]:
        """One value per row of ``piece``."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes held by this column."""
        raise NotImplementedError


class NumericColumn(Column):
    """Numbers as one numpy array (rows first): primitives and fixed-size lists of them."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        super().__init__(name)
        self.array = array

    def take(self, rows: Rows) -> np.ndarray:
        return self.array[rows]

    def concat(self, pieces: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(pieces)

    def emit(self, piece: np.ndarray, out: dict[str, Any]) -> None:
        out[self.name] = _tensor(piece)

    def emit_samples(self, piece: np.ndarray) -> list[Any]:
        if piece.ndim == 1:
            return piece.tolist()
        return list(_tensor(piece).unbind(0))

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


class RaggedColumn(Column):
    """A variable-length list of numbers: padded 2-D tensor plus lengths."""

    def __init__(self, name: str, array: pa.Array, dtype: np.dtype) -> None:
        super().__init__(name)
        self.array = array
        self.dtype = dtype

    def take(self, rows: Rows) -> pa.Array:
        return _arrow_take(self.array, rows)

    def concat(self, pieces: Sequence[pa.Array]) -> pa.Array:
        return pa.concat_arrays(list(pieces))

    def _flat(self, piece: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        offsets = piece.offsets.to_numpy()
        lengths = np.diff(offsets).astype(np.int64)
        values = piece.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        return _numpy(values, self.dtype), lengths

    def emit(self, piece: pa.Array, out: dict[str, Any]) -> None:
        flat, lengths = self._flat(piece)
        width = int(lengths.max()) if len(lengths) else 0
        padded = np.zeros((len(lengths), width), dtype=flat.dtype)
        padded[np.arange(width) < lengths[:, None]] = flat
        out[self.name] = torch.from_numpy(padded)
        out[lengths_key(self.name)] = torch.from_numpy(lengths)

    def emit_samples(self, piece: pa.Array) -> list[Any]:
        flat, lengths = self._flat(piece)
        return list(_tensor(flat).split(lengths.tolist()))

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


class ListColumn(Column):
    """Strings, binaries and any other type: Python values, built per batch."""

    def __init__(self, name: str, array: pa.Array) -> None:
        super().__init__(name)
        self.array = array

    def take(self, rows: Rows) -> pa.Array:
        return _arrow_take(self.array, rows)

    def concat(self, pieces: Sequence[pa.Array]) -> pa.Array:
        return pa.concat_arrays(list(pieces))

    def emit(self, piece: pa.Array, out: dict[str, Any]) -> None:
        out[self.name] = piece.to_pylist()

    def emit_samples(self, piece: pa.Array) -> list[Any]:
        return piece.to_pylist()

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def make_column(name: str, chunks: Sequence[pa.Array]) -> Column:
    """The column for ``chunks`` (the column's chunks in every shard of a window, in order)."""
    chunks = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in chunks]
    typ = chunks[0].type if chunks else pa.null()
    numeric = _numeric_shape(typ)
    if numeric is not None:
        arrays = [_fixed_numpy(c, numeric) for c in chunks]
        array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        return NumericColumn(name, array)
    joined = chunks[0] if len(chunks) == 1 else pa.concat_arrays(list(chunks))
    if (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and _numeric_shape(typ.value_type) == ():
        return RaggedColumn(name, joined, _np_dtype(typ.value_type))
    return ListColumn(name, joined)


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
    width = 1
    while pa.types.is_fixed_size_list(typ):
        size = typ.list_size
        array = array.values.slice(array.offset * size, len(array) * size)
        typ = typ.value_type
        width *= size
    flat = _numpy(array, _np_dtype(typ))
    return flat.reshape((n, *shape)) if shape else flat


def _arrow_take(array: pa.Array, rows: Rows) -> pa.Array:
    if isinstance(rows, slice):
        return array.slice(rows.start, rows.stop - rows.start)
    return array.take(pa.array(rows))


def _tensor(piece: np.ndarray) -> torch.Tensor:
    """A tensor that owns its memory: a view (of a window, of an Arrow buffer) is copied once.

    Handing out views would pin the whole window in memory and make a DataLoader worker
    share the whole window's storage with every batch.
    """
    if piece.base is None and piece.flags.writeable and piece.flags.c_contiguous:
        return torch.from_numpy(piece)
    out = torch.empty(piece.shape, dtype=_torch_dtype(piece.dtype))
    np.copyto(out.numpy(), piece, casting="no")
    return out


@functools.lru_cache(maxsize=32)
def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
