"""Rows of an Arrow array by index, without Arrow's compute kernels where the type allows.

Used for the columns only pyarrow converts (:class:`loaders.columns.ObjectKind`; strings,
binaries and lists of numbers are gathered with numpy there). Importing
``pyarrow.compute`` builds Arrow's kernel registry and a Python wrapper per function:
about 9 MB of memory in every process that does it, DataLoader workers included. So
variable-length lists of fixed-width values (decimals, say) are gathered here from their
offsets (one ``bytes.join`` of the rows' slices); any other type falls back to
``pyarrow.compute.take``. The copies are Python-allocated buffers, made and freed on the
consuming thread.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from loaders.source import loader_memory_pool

__all__ = ["take_rows"]


def take_rows(array: pa.Array, rows: np.ndarray) -> pa.Array:
    """A new array of ``array[rows]`` (``rows``: non-negative int row numbers) in memory of its
    own (it never points into ``array``'s buffers)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    typ = array.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        values = array.values
        width = _fixed_width(values.type)
        if width and values.null_count == 0:
            data = values.buffers()[1]
            return _take_variable(array, rows, data, width, values.offset)
    import pyarrow.compute as pc  # rare layouts only (see the module docstring)

    indices = pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])
    return pc.take(array, indices, memory_pool=loader_memory_pool())


def _fixed_width(typ: pa.DataType) -> int:
    """Bytes per value of a fixed-width, byte-aligned type; 0 for anything else (bits,
    nested types, and dictionaries, whose ``bit_width`` is that of their indices)."""
    if pa.types.is_dictionary(typ):
        return 0
    try:
        bits = typ.bit_width
    except ValueError:
        return 0
    return bits // 8 if bits % 8 == 0 else 0


def _offsets(array: pa.Array) -> np.ndarray:
    """The ``len(array) + 1`` offsets of a variable-length array, as numpy (no copy)."""
    dtype = np.dtype(np.int64 if pa.types.is_large_list(array.type) else np.int32)
    return np.frombuffer(
        array.buffers()[1], dtype, count=len(array) + 1, offset=array.offset * dtype.itemsize
    )


def _take_variable(
    array: pa.Array, rows: np.ndarray, data: pa.Buffer | None, width: int, values_offset: int = 0
) -> pa.Array:
    """Gather rows of a list array whose values are ``width`` bytes each in ``data``."""
    offsets = _offsets(array)
    starts, ends = offsets[rows], offsets[rows + 1]
    new_offsets = np.zeros(len(rows) + 1, dtype=offsets.dtype)
    np.cumsum(ends - starts, out=new_offsets[1:])
    view = memoryview(data).cast("B") if data is not None else memoryview(b"")
    if width != 1 or values_offset:
        view = view[values_offset * width :]
        starts, ends = starts * width, ends * width
    gathered = pa.py_buffer(b"".join([view[s:e] for s, e in zip(starts.tolist(), ends.tolist())]))
    validity, null_count = _take_validity(array, rows)
    values = pa.Array.from_buffers(array.type.value_type, int(new_offsets[-1]), [None, gathered])
    return pa.Array.from_buffers(
        array.type, len(rows), [validity, pa.py_buffer(new_offsets)], null_count, children=[values]
    )


def _take_validity(array: pa.Array, rows: np.ndarray) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``array[rows]`` and its null count (None, 0 without nulls)."""
    if array.null_count == 0:
        return None, 0
    bitmap = np.frombuffer(array.buffers()[0], dtype=np.uint8)
    bits = np.unpackbits(bitmap, bitorder="little")[array.offset : array.offset + len(array)]
    valid = bits[rows]
    return pa.py_buffer(np.packbits(valid, bitorder="little")), int(len(valid) - valid.sum())
