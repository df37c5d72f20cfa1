"""MinHash signatures of many records at once, equal to datasketch's ``MinHash``.

For each record and each permutation ``k``, the signature value is the minimum over the
record's shingle hashes ``h`` of the permuted hash, exactly as ``datasketch.MinHash``
computes it (datasketch 2.x, ``hashvalues`` for the same ``num_perm``, ``seed``,
``scheme`` and 32-bit shingle hash):

- ``"affine32"`` (datasketch's default since 2.0): ``a_k * fmix32(h) + b_k mod 2**32``
  with ``a_k`` odd; ``uint32`` values.
- ``"legacy"`` (datasketch before 2.0, or ``scheme="legacy"``):
  ``((a_k * h + b_k) mod 2**64 mod (2**61 - 1)) & (2**32 - 1)``; ``uint64`` values.

The parameters ``a``, ``b`` come from ``numpy.random.RandomState(seed)`` drawn in
datasketch's order (:class:`Permutations`). A record without shingles gets the empty
value (all ``2**32 - 1``), like an empty datasketch MinHash.

The kernel keeps the permutation axis first: a ``(num_perm, window)`` block holds every
permuted value of a window of shingles; ``np.minimum.reduceat`` along its contiguous
rows yields each record's minima. Blocks are reused (``out=``), so the kernel allocates
almost nothing per window and does not suffer from allocator settings such as dask's
``MALLOC_TRIM_THRESHOLD_``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EMPTY_VALUE", "Permutations", "fmix32", "signatures"]

_MERSENNE_PRIME = np.uint64((1 << 61) - 1)
EMPTY_VALUE = (1 << 32) - 1
# Shingles per block: (num_perm, _WINDOW) uint32 is ~1.5 MB, about an L2 cache. Rows are
# padded by _PAD values so that they do not start at power-of-two strides (cache-set
# aliasing made a 2048-wide block 3x slower than a 2560-wide one).
_WINDOW = 3072
_PAD = 24


@dataclass(frozen=True, eq=False)
class Permutations:
    """The ``num_perm`` permutation parameters of one MinHash family (datasketch's)."""

    num_perm: int
    seed: int
    scheme: str
    a: np.ndarray
    b: np.ndarray

    @classmethod
    def create(cls, num_perm: int = 128, seed: int = 1, scheme: str = "affine32") -> Permutations:
        """Draw ``a`` and ``b`` the way ``datasketch.MinHash(num_perm, seed, scheme=...)`` does."""
        gen = np.random.RandomState(seed)
        if scheme == "legacy":
            pairs = [
                (
                    gen.randint(1, _MERSENNE_PRIME, dtype=np.uint64),
                    gen.randint(0, _MERSENNE_PRIME, dtype=np.uint64),
                )
                for _ in range(num_perm)
            ]
            ab = np.array(pairs, dtype=np.uint64).T
            return cls(num_perm, seed, scheme, ab[0].copy(), ab[1].copy())
        if scheme != "affine32":
            raise ValueError(f"unknown MinHash scheme {scheme!r} (use 'affine32' or 'legacy')")
        a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
        b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
        return cls(num_perm, seed, scheme, a, b)

    @property
    def dtype(self) -> type:
        """numpy dtype of the signature values (uint32 for affine32, uint64 for legacy)."""
        return np.uint32 if self.scheme == "affine32" else np.uint64


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer on a uint32 array (a new array)."""
    h = h.astype(np.uint32, copy=True)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def signatures(hashes: np.ndarray, offsets: np.ndarray, perms: Permutations) -> np.ndarray:
    """Signatures of records whose 32-bit shingle hashes are ``hashes[offsets[i]:offsets[i+1]]``.

    Returns a ``(num_perm, records)`` array (permutation-major; ``.T`` gives datasketch's
    layout, one row per record).
    """
    n = len(offsets) - 1
    counts = np.diff(offsets)
    rows = np.flatnonzero(counts > 0)
    if len(rows) == 0:
        return np.full((perms.num_perm, n), EMPTY_VALUE, dtype=perms.dtype)
    starts = np.ascontiguousarray(offsets[:-1][rows])
    total = int(offsets[-1])
    legacy = perms.scheme == "legacy"
    values = hashes.astype(np.uint64) if legacy else fmix32(hashes)
    a, b = perms.a[:, None], perms.b[:, None]
    dense = np.full((perms.num_perm, len(rows)), EMPTY_VALUE, dtype=perms.dtype)
    block = np.empty((perms.num_perm, min(_WINDOW, total) + _PAD), dtype=perms.dtype)
    lo = 0
    while lo < total:
        hi = _window_end(starts, lo, total)
        first = int(np.searchsorted(starts, lo, side="right")) - 1
        last = int(np.searchsorted(starts, hi, side="left"))
        width = hi - lo
        if block.shape[1] < width:
            block = np.empty((perms.num_perm, width + _PAD), dtype=block.dtype)
        view = block[:, :width]
        np.multiply(a, values[None, lo:hi], out=view)
        np.add(view, b, out=view)
        if legacy:
            np.remainder(view, _MERSENNE_PRIME, out=view)
            np.bitwise_and(view, np.uint64(EMPTY_VALUE), out=view)
        seg = starts[first:last] - lo
        if seg[0] < 0:  # the first record began in an earlier window
            seg[0] = 0
            mins = np.minimum.reduceat(view, seg, axis=1)
            np.minimum(dense[:, first], mins[:, 0], out=dense[:, first])
            dense[:, first + 1 : last] = mins[:, 1:]
        else:
            dense[:, first:last] = np.minimum.reduceat(view, seg, axis=1)
        lo = hi
    if len(rows) == n:
        return dense
    out = np.full((perms.num_perm, n), EMPTY_VALUE, dtype=perms.dtype)
    out[:, rows] = dense
    return out


def _window_end(starts: np.ndarray, lo: int, total: int) -> int:
    """End of the window that begins at shingle ``lo``: the last record boundary within
    ``_WINDOW`` shingles, or ``lo + _WINDOW`` inside one record longer than that."""
    target = lo + _WINDOW
    if target >= total:
        return total
    j = int(np.searchsorted(starts, target, side="right")) - 1
    boundary = int(starts[j])
    return boundary if boundary > lo else target
