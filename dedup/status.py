"""Per-record status codes: why a record takes part in dedup, or why it does not.

A status is one byte per record (a numpy ``uint8`` array travels cheaply between dask
workers). Records whose status is not :data:`Status.WORDS` or :data:`Status.CHARS` are
never compared as near duplicates; they are kept, and the result lists them with the
reason's name (``null``, ``empty``, ``invalid_utf8``, ``too_short``, ``too_large``).
``too_short`` and ``too_large`` records still take part in exact dedup.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

__all__ = ["EXACT_ELIGIBLE", "NEAR_ELIGIBLE", "REASONS", "Status", "reason_names"]


class Status(IntEnum):
    """What normalization and shingling found for one record."""

    WORDS = 0  # shingled by word n-grams
    CHARS = 1  # shingled by character n-grams (short, or text without spaces)
    NULL = 2  # the value is null
    EMPTY = 3  # nothing left after normalization (empty, only spaces/punctuation)
    INVALID_UTF8 = 4  # a binary value that is not UTF-8 (text content only)
    TOO_SHORT = 5  # fewer characters than one character shingle
    TOO_LARGE = 6  # longer than DedupConfig.max_doc_bytes


REASONS: dict[int, str] = {
    Status.NULL: "null",
    Status.EMPTY: "empty",
    Status.INVALID_UTF8: "invalid_utf8",
    Status.TOO_SHORT: "too_short",
    Status.TOO_LARGE: "too_large",
}

# Statuses whose records have content to hash for exact dedup / shingles for MinHash.
EXACT_ELIGIBLE = (Status.WORDS, Status.CHARS, Status.TOO_SHORT, Status.TOO_LARGE)
NEAR_ELIGIBLE = (Status.WORDS, Status.CHARS)


def reason_names(codes: np.ndarray) -> list[str]:
    """The reason name of each status code (``""`` for records that were compared)."""
    table = [REASONS.get(code, "") for code in range(256)]
    return [table[int(c)] for c in codes]
