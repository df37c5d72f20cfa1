"""LSH banding as arrays: band keys, buckets by sorting, candidate pairs.

A signature of ``num_perm`` values is cut into ``bands`` bands of ``rows`` values; two
records are candidates when all values of one band agree. With true Jaccard ``s`` a
pair becomes a candidate with probability ``1 - (1 - s**rows)**bands``.

**Choice of bands x rows** (:func:`choose_bands`). datasketch minimizes the sum of the
false-positive and false-negative areas, which for ``threshold=0.8``, 128 permutations
gives 9 x 13: its 50% point is 0.84, so true pairs just above 0.8 are missed half the
time. Here every candidate is verified afterwards (exact Jaccard by default), so a false
candidate costs only a check, while a missed pair is lost for good. We therefore take
the most selective banding (largest ``rows``, as many bands as fit) whose probability
of missing a pair exactly at the threshold is at most ``max_miss`` (1%): 21 x 6 for
0.8 and 128 permutations (miss 0.17% at 0.8, 0.02% at 0.85).

**Buckets without dicts.** Each band's values are folded into one 64-bit key per record
(:func:`band_keys`), the keys of a band are sorted (stable, so equal keys keep record
order), and runs of equal keys are the buckets (:func:`band_pairs`). Each record is
paired with the next ``max_neighbors`` records of its bucket: all pairs in buckets of
up to ``max_neighbors + 1`` records, and a connected chain in bigger ones, so memory and
time stay linear in the number of records. Pairs are ``uint64`` codes ``i << 32 | j``
with ``i < j`` (:func:`encode_pairs`).
"""

from __future__ import annotations

import numpy as np

from dedup.shingle import fmix64

__all__ = [
    "band_keys",
    "band_pairs",
    "choose_bands",
    "decode_pairs",
    "encode_pairs",
    "miss_probability",
]

_U64 = np.uint64
_ROW_MULT = _U64(0x9E3779B97F4A7C15)
_BAND_SALT = _U64(0xD6E8FEB86659FD93)


def miss_probability(similarity: float, bands: int, rows: int) -> float:
    """Probability that a pair of Jaccard ``similarity`` shares no band."""
    return (1.0 - similarity**rows) ** bands


def choose_bands(threshold: float, num_perm: int, max_miss: float = 0.01) -> tuple[int, int]:
    """``(bands, rows)`` with the largest ``rows`` (``bands = num_perm // rows``) whose
    miss probability at ``threshold`` is at most ``max_miss``; ``(num_perm, 1)`` if none."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if bands < 1:
            break
        if miss_probability(threshold, bands, rows) <= max_miss:
            best = (bands, rows)
    return best


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One uint64 key per band and record from permutation-major signatures
    ``(num_perm, records)``; returns ``(bands, records)``. Keys of different bands differ
    even for equal values (the band index is mixed in)."""
    n = sigs.shape[1]
    grouped = sigs[: bands * rows].reshape(bands, rows, n)
    salt = [((b + 1) * int(_BAND_SALT)) & 0xFFFFFFFFFFFFFFFF for b in range(bands)]
    keys = np.empty((bands, n), dtype=np.uint64)
    keys[...] = np.array(salt, dtype=np.uint64)[:, None]
    scratch = np.empty((bands, n), dtype=np.uint64)
    for row in range(rows):
        keys *= _ROW_MULT
        np.copyto(scratch, grouped[:, row, :], casting="unsafe")
        keys += scratch
    return fmix64(keys)


def band_pairs(keys: np.ndarray, records: np.ndarray, max_neighbors: int) -> np.ndarray:
    """Candidate pairs from one band: ``keys[i]`` is the key of record ``records[i]``;
    ``records`` must be strictly increasing. Returns encoded pairs (may repeat)."""
    if len(keys) < 2:
        return np.zeros(0, dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    same = sorted_keys[1:] == sorted_keys[:-1]
    if not same.any():
        return np.zeros(0, dtype=np.uint64)
    # Keep only members of buckets with two or more records.
    member = np.zeros(len(keys), dtype=bool)
    member[1:] |= same
    member[:-1] |= same
    idx = np.flatnonzero(member)
    bucket_start = np.ones(len(idx), dtype=bool)
    bucket_start[1:] = ~same[idx[1:] - 1] | (idx[1:] - idx[:-1] != 1)
    bucket = np.cumsum(bucket_start)
    recs = records[order[idx]]
    out = []
    for step in range(1, max_neighbors + 1):
        if step >= len(recs):
            break
        ok = bucket[step:] == bucket[:-step]
        if not ok.any():
            break
        out.append(encode_pairs(recs[:-step][ok], recs[step:][ok]))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def encode_pairs(i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Pairs as uint64 codes ``min << 32 | max`` (record indices below 2**32)."""
    i = i.astype(np.uint64)
    j = j.astype(np.uint64)
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    return (lo << _U64(32)) | hi


def decode_pairs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`encode_pairs`: the two int64 record arrays."""
    codes = codes.astype(np.uint64)
    return (codes >> _U64(32)).astype(np.int64), (codes & _U64(0xFFFFFFFF)).astype(np.int64)
