"""Text normalization: one rule, applied to a whole Arrow array at once.

The rule (what two texts must share to count as the same text):

1. Unicode NFKC (full-width letters, ligatures, non-breaking spaces fold to their plain
   forms), then lowercase (Arrow's ``utf8_lower``, the Unicode simple case mapping).
2. Every run of separators becomes one ASCII space, and separators at the start and the
   end are dropped. A separator is a character of Unicode category P* (punctuation),
   Z* (spaces and line/paragraph separators) or Cc (control characters: tab, newline...).
   Symbols (S*: ``$ + < = > ^ ` | ~``, emoji), letters, marks and digits stay.

So a normalized text is its words joined by single spaces; a word is a maximal run of
non-separators. Records whose texts are all ASCII (the common case) take a fast path
that applies the same rule with a 256-entry byte table over the batch's bytes; other
records go through Arrow's ``utf8_normalize``/``utf8_lower``/regex kernels first. Both
paths give the same bytes (tested).

The result is a :class:`NormalizedBatch`: one ``uint8`` buffer and each record's
``[start, end)`` byte range in it, plus a :class:`dedup.status.Status` per record
(``NULL``, ``EMPTY``, ``INVALID_UTF8`` for the bad ones).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cachetier.errors import BadInputError
from dedup.status import Status

__all__ = ["SEPARATOR_PATTERN", "NormalizedBatch", "check_type", "normalize_array", "normalize_text"]

SEPARATOR_PATTERN = r"[\p{P}\p{Z}\p{Cc}]+"
_SPACE = 32


def _ascii_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)
    for code in range(128):
        char = chr(code)
        category = unicodedata.category(char)
        if category[0] in "PZ" or category == "Cc":
            table[code] = _SPACE
        elif "A" <= char <= "Z":
            table[code] = code + 32
    return table


_ASCII_TABLE = _ascii_table()


@dataclass(frozen=True)
class NormalizedBatch:
    """Normalized bytes of ``len(status)`` records.

    Record ``i`` is ``data[starts[i]:ends[i]]`` (UTF-8 for text content; raw bytes for
    ``content="bytes"``). Ranges of records with a bad status are empty. For text, 8 zero
    bytes follow the last record, so 8-byte loads at any word start stay in bounds.
    """

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    status: np.ndarray  # uint8, dedup.status.Status codes

    def __len__(self) -> int:
        return len(self.status)

    def record(self, i: int) -> bytes:
        """The normalized bytes of record ``i``."""
        return self.data[self.starts[i] : self.ends[i]].tobytes()

    def take(self, rows: np.ndarray) -> NormalizedBatch:
        """The batch restricted to ``rows`` (indices into this batch), sharing ``data``."""
        return NormalizedBatch(self.data, self.starts[rows], self.ends[rows], self.status[rows])


def normalize_text(text: str) -> str:
    """Normalize one text by the module's rule (the same kernels as the batch path)."""
    batch = normalize_array(pa.array([text], pa.large_string()))
    return batch.record(0).decode("utf-8")


def normalize_array(values: pa.Array | pa.ChunkedArray, *, content: str = "text") -> NormalizedBatch:
    """Normalize every value of a string or binary array.

    ``content="text"``: the module's rule; binary values that are not UTF-8 get status
    ``INVALID_UTF8``. ``content="bytes"``: the bytes as they are (for exact dedup of
    files). Nulls get ``NULL`` and values with nothing left get ``EMPTY``.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    check_type(values.type)
    status = np.zeros(len(values), dtype=np.uint8)
    if content == "bytes":
        values = values.cast(pa.large_binary())
        status[_null_mask(values)] = Status.NULL
        data, starts, ends = _buffers(values)
        status[(ends == starts) & (status == 0)] = Status.EMPTY
        return NormalizedBatch(data, starts, ends, status)
    values = _as_utf8(values, status)
    values = _unicode_pass(values)
    data, starts, ends = _buffers(values)
    data, starts, ends = _collapse(data, starts, ends)
    status[(ends == starts) & (status == 0)] = Status.EMPTY
    return NormalizedBatch(data, starts, ends, status)


def check_type(type_: pa.DataType) -> None:
    """Raise :class:`BadInputError` unless ``type_`` is a string or binary type."""
    t = pa.types
    if not (
        t.is_string(type_)
        or t.is_large_string(type_)
        or t.is_binary(type_)
        or t.is_large_binary(type_)
        or t.is_string_view(type_)
        or t.is_binary_view(type_)
    ):
        raise BadInputError(
            f"dedup needs a string or binary column, got {type_}",
            subject="column",
            hint="pick the text column with column=...",
        )


def _null_mask(values: pa.Array) -> np.ndarray:
    if values.null_count == 0:
        return np.zeros(len(values), dtype=bool)
    return values.is_null().to_numpy(zero_copy_only=False)


def _as_utf8(values: pa.Array, status: np.ndarray) -> pa.Array:
    """``values`` as large_string; invalid UTF-8 values become null with their status set."""
    status[_null_mask(values)] = Status.NULL
    if (
        pa.types.is_binary(values.type)
        or pa.types.is_large_binary(values.type)
        or pa.types.is_binary_view(values.type)
    ):
        try:
            return values.cast(pa.large_string())
        except pa.ArrowInvalid:
            bad = np.zeros(len(values), dtype=bool)
            for i, value in enumerate(values.to_pylist()):
                if value is not None:
                    try:
                        value.decode("utf-8")
                    except UnicodeDecodeError:
                        bad[i] = True
            status[bad] = Status.INVALID_UTF8
            values = pc.if_else(pa.array(bad), pa.scalar(None, values.type), values)
            return values.cast(pa.large_string())
    return values if values.type == pa.large_string() else values.cast(pa.large_string())


def _unicode_pass(values: pa.Array) -> pa.Array:
    """Apply NFKC, lowercase and the separator regex to the non-ASCII values only."""
    data, _, _ = _buffers(values)
    if not (data >= 0x80).any():
        return values
    ascii_mask = pc.fill_null(pc.string_is_ascii(values), True)
    if pc.all(ascii_mask).as_py():
        return values
    non_ascii = pc.invert(ascii_mask)
    subset = values.filter(non_ascii)
    subset = pc.utf8_lower(pc.utf8_normalize(subset, "NFKC"))
    subset = pc.replace_substring_regex(subset, pattern=SEPARATOR_PATTERN, replacement=" ")
    return pc.replace_with_mask(values, non_ascii, subset.cast(pa.large_string()))


def _buffers(values: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The data buffer and per-value byte ranges of a large_string/large_binary array."""
    n = len(values)
    offsets_buf, data_buf = values.buffers()[1], values.buffers()[2]
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=values.offset + n + 1)[values.offset :]
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8)[lo:hi] if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1] - lo
    ends = offsets[1:] - lo
    if values.null_count:
        nulls = _null_mask(values)
        ends[nulls] = starts[nulls]
    return data, starts, ends


def _collapse(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """Map bytes through the ASCII table, squeeze separator runs to one space and drop
    leading and trailing ones; return the new buffer (with 8 zero bytes of padding after
    the last record, for 8-byte loads) and the new ranges."""
    n = len(starts)
    if n == 0:
        return np.zeros(8, np.uint8), starts, ends
    mapped = np.take(_ASCII_TABLE, data)
    is_word = mapped != _SPACE
    # A byte is kept if it is a word byte, or the first separator after a word byte of
    # the same record. Bytes outside every record's range (under nulls) are dropped.
    keep = is_word.copy()
    keep[1:] |= is_word[:-1]
    contiguous = bool(starts[0] == 0 and ends[-1] == len(mapped) and np.array_equal(starts[1:], ends[:-1]))
    if not contiguous:
        inside = np.zeros(len(mapped) + 1, dtype=np.int32)
        np.add.at(inside, starts, 1)
        np.add.at(inside, ends, -1)
        keep &= np.cumsum(inside[:-1]) > 0
    first = starts[ends > starts]
    keep[first] = is_word[first]
    dropped = np.flatnonzero(~keep)
    size = len(mapped) - len(dropped)
    out = np.empty(size + 8, dtype=np.uint8)
    out[:size] = mapped[keep]
    out[size:] = 0
    new_starts = starts - np.searchsorted(dropped, starts)
    new_ends = ends - np.searchsorted(dropped, ends)
    trailing = (new_ends > new_starts) & (out[np.maximum(new_ends - 1, 0)] == _SPACE)
    return out, new_starts, new_ends - trailing
