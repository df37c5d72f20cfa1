"""Checking candidate pairs: exact Jaccard of shingle sets, or the MinHash estimate.

LSH candidates include pairs below the threshold; verification removes them, so wide
banding (high recall) costs only these checks. The exact check compares the sets of
64-bit shingle hashes (:func:`dedup.shingle.word_shingle_hash64` and its char-mode twin)
of the two records: sorted, unique arrays, intersected with ``np.searchsorted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ShingleSets", "exact_jaccard", "signature_jaccard"]


@dataclass(frozen=True)
class ShingleSets:
    """Sorted unique shingle hashes of some records: record ``records[k]`` owns
    ``values[offsets[k]:offsets[k + 1]]``; ``records`` is strictly increasing."""

    records: np.ndarray  # int64
    values: np.ndarray  # uint64
    offsets: np.ndarray  # int64

    @classmethod
    def build(cls, records: np.ndarray, hashes: np.ndarray, offsets: np.ndarray) -> ShingleSets:
        """Sets of ``records`` whose (unsorted, repeating) hashes are ``hashes[offsets[k]:offsets[k+1]]``."""
        parts, sizes = [], np.zeros(len(records), dtype=np.int64)
        bounds = offsets.tolist()
        for k in range(len(records)):
            v = np.sort(hashes[bounds[k] : bounds[k + 1]])
            if len(v) > 1:
                dup = v[1:] == v[:-1]
                if dup.any():
                    v = v[np.concatenate([[True], ~dup])]
            parts.append(v)
            sizes[k] = len(v)
        new_offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(sizes, out=new_offsets[1:])
        values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
        return cls(np.asarray(records, dtype=np.int64), values, new_offsets)

    @classmethod
    def concat(cls, sets: list[ShingleSets]) -> ShingleSets:
        """Join sets of disjoint, increasing record ranges (e.g. one per batch)."""
        sets = [s for s in sets if len(s.records)]
        if not sets:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(1, np.int64))
        shift = np.cumsum([0] + [len(s.values) for s in sets[:-1]])
        offsets = np.concatenate([[0]] + [s.offsets[1:] + d for s, d in zip(sets, shift)])
        return cls(
            np.concatenate([s.records for s in sets]),
            np.concatenate([s.values for s in sets]),
            offsets.astype(np.int64),
        )


def exact_jaccard(i: np.ndarray, j: np.ndarray, sets: ShingleSets | Sequence[ShingleSets]) -> np.ndarray:
    """Exact Jaccard similarity of the shingle sets of records ``i[k]`` and ``j[k]``.

    ``sets`` may be a list of :class:`ShingleSets` of increasing record ranges (one per
    batch): they are used in place, never joined into one copy.
    """
    out = np.zeros(len(i), dtype=np.float64)
    if len(i) == 0:
        return out
    parts = [sets] if isinstance(sets, ShingleSets) else [s for s in sets if len(s.records)]
    records = np.concatenate([p.records for p in parts])
    part_of = np.repeat(np.arange(len(parts)), [len(p.records) for p in parts])
    local = np.concatenate([np.arange(len(p.records)) for p in parts])
    ki, kj = np.searchsorted(records, i), np.searchsorted(records, j)
    values = [p.values for p in parts]
    offsets = [p.offsets.tolist() for p in parts]
    rows = zip(part_of[ki].tolist(), local[ki].tolist(), part_of[kj].tolist(), local[kj].tolist())
    for n, (px, x, py, y) in enumerate(rows):
        a = values[px][offsets[px][x] : offsets[px][x + 1]]
        b = values[py][offsets[py][y] : offsets[py][y + 1]]
        if len(a) > len(b):
            a, b = b, a
        if len(a) == 0:
            continue
        pos = np.searchsorted(b, a)
        pos[pos == len(b)] = 0
        inter = int(np.count_nonzero(b[pos] == a))
        out[n] = inter / (len(a) + len(b) - inter)
    return out


def signature_jaccard(i: np.ndarray, j: np.ndarray, sigs: np.ndarray, index: np.ndarray) -> np.ndarray:
    """MinHash estimate for pairs: ``sigs`` is ``(num_perm, m)`` for the records ``index``
    (strictly increasing)."""
    if len(i) == 0:
        return np.zeros(0, dtype=np.float64)
    a = sigs[:, np.searchsorted(index, i)]
    b = sigs[:, np.searchsorted(index, j)]
    return np.count_nonzero(a == b, axis=0) / sigs.shape[0]
