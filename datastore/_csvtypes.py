"""Types for CSV fields: pyarrow splits a CSV into text columns, this module types them.

A column's type is the least of ``null``, ``bool``, ``int64``, ``double`` that holds every
field, ``string`` when none does (the lenient lattice of :mod:`datastore._schema`). The
rules are Arrow's CSV inference, with these differences:

- a number written with a leading zero (``00501``, ``-07``, ``0x1F``) is text: it is an
  identifier (a ZIP or product code, a phone number) more often than a quantity, and as a
  number it would come back without its zeros. DuckDB's CSV sniffer draws the same line;
- a whole number beyond int64 (a 20-digit id) is text, not a double that rounds it, as
  pandas keeps it;
- dates and times are text, so they come back as written.

Null fields are Arrow's default null spellings (empty, ``NA``, ``null``, ``NaN``, ...) in
a column of any type but ``string``; a ``string`` column keeps them as written. Only the
words ``true``/``True``/``TRUE`` and ``false``/``False``/``FALSE`` are booleans. Spaces
around a number or a boolean are dropped, as Arrow's converters drop them.

Every step is an Arrow kernel over the whole column; a cast is tried only where it is
expected to succeed (a failing cast costs Arrow a few hundred ns per field).
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["least_typed", "to_type"]

# Arrow's default ``ConvertOptions.null_values``.
_NULLS = pa.array(
    [
        *("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN"),
        *("N/A", "NA", "NULL", "NaN", "n/a", "nan", "null"),
    ]
)
_TRUE_WORDS, _FALSE_WORDS = ("true", "True", "TRUE"), ("false", "False", "FALSE")
_TRUE, _WORDS = pa.array(_TRUE_WORDS), pa.array(_TRUE_WORDS + _FALSE_WORDS)
# a leading zero followed by anything but the decimal point or an exponent
_LEADING_ZERO = r"^[+-]?0[^.eE]"
_INTEGER = re.compile(r"-?[0-9]+")
_NULL_STARTS = np.frombuffer(b"Nn#", np.uint8)
_NOT_AFTER_ZERO = np.frombuffer(b".eE", np.uint8)
_ZERO, _PLUS, _MINUS = ord("0"), ord("+"), ord("-")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT64_DIGITS = 19  # no shorter field of digits lies outside int64


def least_typed(text: pa.Array) -> pa.Array:
    """``text`` (a string array) in the least type of the CSV lattice that holds every field."""
    null = pc.is_in(text, value_set=_NULLS)
    first = _first_value(text, null)
    if first is None:
        return pa.nulls(len(text))
    # The first value rules out most of the ladder: the others must join with it.
    if first in _TRUE_WORDS + _FALSE_WORDS:
        ladder: tuple[pa.DataType, ...] = (pa.bool_(),)
    elif re.match(_LEADING_ZERO, first):
        return text
    elif _INTEGER.fullmatch(first):
        ladder = (pa.int64(), pa.float64())
    elif _is_float(first):
        ladder = (pa.float64(),)
    else:
        return text
    for candidate in ladder:
        typed = _convert(text, null, candidate)
        if typed is not None:
            return typed
    return text


def to_type(text: pa.Array, type_: pa.DataType) -> pa.Array | None:
    """``text`` (a string array) converted to ``type_``, or None when a field does not fit.

    Any type pyarrow casts text to works (a schema set by a Parquet or JSON Lines source
    may hold ``int32`` or ``timestamp`` columns); null spellings become nulls in every type
    but text.
    """
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return text if text.type.equals(type_) else text.cast(type_)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return text.cast(type_)
    return _convert(text, None, type_)


def _convert(text: pa.Array, null: pa.Array | None, type_: pa.DataType) -> pa.Array | None:
    """``text`` in ``type_``, or None. ``null`` flags the null spellings; None means a quick
    look found none a numeric cast would accept (it rejects the others, then they are
    looked up)."""
    numeric = pa.types.is_integer(type_) or pa.types.is_floating(type_)
    if null is None and (not numeric or _maybe_null(text)):
        null = pc.is_in(text, value_set=_NULLS)
    if pa.types.is_null(type_):
        return pa.nulls(len(text)) if _first_value(text, null) is None else None
    values = text if null is None else _with_nulls(text, null)
    for trimmed in (False, True):
        if trimmed:  # spaces around some field: Arrow's converters drop them
            values = pc.utf8_trim_whitespace(values)
        if pa.types.is_boolean(type_):
            words = pc.is_in(values, value_set=_WORDS)
            if pc.all(words if null is None else pc.or_(null, words)).as_py():
                return pc.if_else(null, pa.scalar(None, pa.bool_()), pc.is_in(values, value_set=_TRUE))
            continue
        if numeric and _leading_zero(values):
            return None
        if pa.types.is_floating(type_) and _beyond_int64(values):
            return None
        try:
            result = values.cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            if null is None:  # a null spelling the quick look let through ("-1.#IND")
                return _convert(text, pc.is_in(text, value_set=_NULLS), type_)
            continue
        if null is None and pa.types.is_floating(type_) and pc.any(pc.is_nan(result)).as_py():
            return _convert(text, pc.is_in(text, value_set=_NULLS), type_)  # "-nan" is null
        return result
    return None


def _chars(text: pa.Array, count: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The length of every field of ``text`` and its first ``count`` bytes (0 past its end)."""
    offsets = np.frombuffer(text.buffers()[1], np.int32, len(text) + 1, 4 * text.offset)
    data = text.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None and data.size else np.zeros(1, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    chars = []
    for i in range(count):
        at = np.minimum(starts + i, len(data) - 1)
        chars.append(np.where(lengths > i, data[at], 0))
    return lengths, chars


def _maybe_null(text: pa.Array) -> bool:
    """False when no field can be a null spelling but the rare ones a cast rejects.

    Every spelling but ``-nan``, ``-NaN`` and the ``1.#IND`` family is empty or starts
    with ``N``, ``n`` or ``#``; no number does.
    """
    lengths, (first,) = _chars(text, 1)
    return bool(np.any((lengths == 0) | np.isin(first, _NULL_STARTS)))


def _leading_zero(values: pa.Array) -> bool:
    """True when some field is a number written with a leading zero: ``0`` then anything
    but the decimal point or an exponent, after an optional sign."""
    _, (c0, c1, c2) = _chars(values, 3)
    signed = (c0 == _PLUS) | (c0 == _MINUS)
    zero_then = np.where(signed, c1 == _ZERO, c0 == _ZERO)
    after = np.where(signed, c2, c1)
    return bool(np.any(zero_then & (after != 0) & ~np.isin(after, _NOT_AFTER_ZERO)))


def _beyond_int64(values: pa.Array) -> bool:
    """True when some field is a whole number int64 cannot hold: a double would round it."""
    lengths, _ = _chars(values, 0)
    long = lengths >= _INT64_DIGITS
    if not long.any():
        return False
    whole = values.filter(pa.array(long))  # long decimals are common: keep the integers
    whole = whole.filter(pc.equal(pc.find_substring(whole, "."), -1))
    whole = whole.filter(pc.match_substring_regex(whole, r"^\s*-?[0-9]+\s*$"))
    return any(not _INT64_MIN <= int(field) <= _INT64_MAX for field in whole.to_pylist())


def _with_nulls(text: pa.Array, null: pa.Array) -> pa.Array:
    """``text`` with the fields flagged in ``null`` made null (no copy of the values)."""
    if not pc.any(null).as_py():
        return text
    if text.offset == 0 and text.null_count == 0:
        validity = pc.invert(null).buffers()[1]
        return pa.Array.from_buffers(text.type, len(text), [validity, *text.buffers()[1:]])
    return pc.if_else(null, pa.scalar(None, text.type), text)


def _first_value(text: pa.Array, null: pa.Array) -> str | None:
    """The first field that is not a null spelling, spaces dropped; None if there is none."""
    index = pc.index(null, False).as_py()
    return None if index < 0 else text[index].as_py().strip()


def _is_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return "_" not in value
