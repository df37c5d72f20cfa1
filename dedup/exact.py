"""Exact dedup: a 128-bit content hash per record, and each record's first equal.

The key of a record is XXH3-128 of its normalized text (``content="text"``, see
:mod:`dedup.normalize`) or of its raw bytes (``content="bytes"``). Records with equal
keys are exact duplicates; the first of them in record order represents them all.
Groups are found by sorting the keys (numpy ``lexsort``), never a dict of all keys.
"""

from __future__ import annotations

import numpy as np
import xxhash

from dedup.normalize import NormalizedBatch
from dedup.status import EXACT_ELIGIBLE

__all__ = ["content_keys", "exact_eligible", "exact_representatives"]


def exact_eligible(status: np.ndarray) -> np.ndarray:
    """Which records have content to hash (not null, empty or invalid UTF-8)."""
    return np.isin(status, np.array(EXACT_ELIGIBLE, dtype=np.uint8))


def content_keys(norm: NormalizedBatch, eligible: np.ndarray) -> np.ndarray:
    """XXH3-128 of every eligible record's bytes as an ``(n, 2)`` uint64 array (zeros elsewhere)."""
    n = len(norm)
    keys = np.zeros((n, 2), dtype=np.uint64)
    rows = np.flatnonzero(eligible)
    if len(rows) == 0:
        return keys
    view = memoryview(norm.data)
    digest = xxhash.xxh3_128_digest
    starts = norm.starts[rows].tolist()
    ends = norm.ends[rows].tolist()
    raw = b"".join([digest(view[s:e]) for s, e in zip(starts, ends)])
    keys[rows] = np.frombuffer(raw, dtype=np.uint64).reshape(-1, 2)
    return keys


def exact_representatives(keys: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """For each record, the index of the first record with the same key (itself if it
    is the first); ``-1`` for records that are not eligible."""
    n = len(keys)
    rep = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero(eligible)
    if len(rows) == 0:
        return rep
    k = keys[rows]
    order = np.lexsort((rows, k[:, 1], k[:, 0]))
    sk = k[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (sk[1:, 0] != sk[:-1, 0]) | (sk[1:, 1] != sk[:-1, 1])
    group = np.cumsum(start) - 1
    first_of_group = rows[order[start]]
    rep[rows[order]] = first_of_group[group]
    return rep
