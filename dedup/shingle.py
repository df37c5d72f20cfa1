"""Shingles of normalized records and the hash that names each shingle.

A shingle is a piece of a normalized record (:mod:`dedup.normalize`):

- word mode: ``ngram`` consecutive words, e.g. ``b"the cat sat on the"``; a record
  with ``k`` words has ``k - ngram + 1`` shingles.
- char mode: ``char_ngram`` consecutive code points (spaces included), for records with
  fewer than ``ngram`` words or whose mean word is longer than ``char_mode_token_bytes``
  bytes (text written without spaces). A record with fewer code points than
  ``char_ngram`` gets status ``TOO_SHORT``; one longer than ``max_doc_bytes``,
  ``TOO_LARGE``.

**The shingle hash** ("fast", the default) is defined on the shingle's *units* (its
words in word mode, its code points in char mode):

- a unit's hash :func:`unit_hash64` reads the unit's UTF-8 bytes as little-endian 8-byte
  words and mixes them, starting from the unit's length, then finalizes with
  MurmurHash3's ``fmix64``;
- a shingle's hash is ``fmix64(sum_i unit_hash(u_i) * W_i mod 2**64 XOR D)`` with fixed
  odd weights ``W_i`` per position and a domain ``D`` per mode (0 for words), so a word
  shingle never takes the hash of the character shingle of the same letters (``b"h e l
  l o"`` against ``b"hello"``) (:func:`word_shingle_hash64`, :func:`char_shingle_hash64`).

This is vectorized over a whole batch without any per-byte arithmetic: unit boundaries
come from byte comparisons, each unit costs one unaligned 8-byte load per 8 bytes, and
shingles are weighted sums over the unit-hash array. MinHash takes the top 32 bits
(:func:`word_shingle_hash32`, :func:`char_shingle_hash32`); these are plain
``bytes -> int`` functions, so they can be handed to ``datasketch.MinHash(hashfunc=...)``
to check our signatures. Exact verification uses the full 64 bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from dedup.config import DedupConfig
from dedup.normalize import NormalizedBatch, normalize_array
from dedup.status import Status

__all__ = [
    "Shingles",
    "char_shingle_hash32",
    "char_shingle_hash64",
    "fmix64",
    "hash32",
    "sha1_hash32",
    "shingle_batch",
    "shingles",
    "unit_hash64",
    "word_shingle_hash32",
    "word_shingle_hash64",
]

_MASK64 = (1 << 64) - 1
_SPACE = 32
_U64 = np.uint64
_LEN_MULT = 0x9E3779B97F4A7C15
_CHUNK_MULT = 0xC2B2AE3D27D4EB4F
_WEIGHT_SEED = 0x2545F4914F6CDD1D
_WORDS, _CHARS = 0, 0x94D049BB133111EB  # the domains of word and character shingles
_LONG_UNIT = 64  # units longer than this are hashed one by one (rare)
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_MASK64], dtype=np.uint64)


def _fmix64_int(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK64
    return h ^ (h >> 33)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer on a uint64 array (in place; returns it)."""
    h ^= h >> _U64(33)
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


def _weight(i: int) -> int:
    return _fmix64_int((i + 1) * _WEIGHT_SEED & _MASK64) | 1


def _unit_state(unit: bytes) -> int:
    h = (len(unit) * _LEN_MULT) & _MASK64
    for k in range(0, len(unit), 8):
        h = ((h ^ int.from_bytes(unit[k : k + 8], "little")) * _CHUNK_MULT) & _MASK64
        h ^= h >> 29
    return h


def unit_hash64(unit: bytes) -> int:
    """The hash of one word or code point (reference implementation). For units of up
    to 8 bytes it is a bijection of (length, bytes): distinct short units never collide."""
    return _unit_state(unit)


def _combine(units: list[bytes], domain: int) -> int:
    acc = 0
    for i, unit in enumerate(units):
        acc = (acc + unit_hash64(unit) * _weight(i)) & _MASK64
    return _fmix64_int(acc ^ domain)


def word_shingle_hash64(shingle: bytes) -> int:
    """64-bit hash of a word shingle (words separated by single spaces)."""
    return _combine(shingle.split(b" "), _WORDS)


def word_shingle_hash32(shingle: bytes) -> int:
    """32-bit hash of a word shingle: the top bits of :func:`word_shingle_hash64`."""
    return word_shingle_hash64(shingle) >> 32


def char_shingle_hash64(shingle: bytes) -> int:
    """64-bit hash of a character shingle (UTF-8)."""
    return _combine([c.encode("utf-8") for c in shingle.decode("utf-8")], _CHARS)


def char_shingle_hash32(shingle: bytes) -> int:
    """32-bit hash of a character shingle: the top bits of :func:`char_shingle_hash64`."""
    return char_shingle_hash64(shingle) >> 32


def sha1_hash32(data: bytes) -> int:
    """datasketch's default hash (first 4 bytes of SHA-1, little-endian)."""
    return int.from_bytes(hashlib.sha1(data).digest()[:4], "little")


@dataclass(frozen=True)
class Shingles:
    """All shingles of a batch: record ``i`` owns ``offsets[i]:offsets[i + 1]``.

    ``hash64`` is the fast 64-bit hash; ``starts``/``ends`` are each shingle's byte range
    in the batch buffer (for the slow hash functions and for tests); ``status`` is the
    batch's status with WORDS/CHARS/TOO_SHORT/TOO_LARGE filled in.
    """

    hash64: np.ndarray  # uint64
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    offsets: np.ndarray  # int64, records + 1
    status: np.ndarray  # uint8


def _ragged(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For groups of ``counts`` items: each item's group index and index inside its group."""
    total = int(counts.sum())
    group = np.repeat(np.arange(len(counts)), counts)
    first = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    local = np.arange(total, dtype=np.int64) - first[group]
    return group, local


def _ragged_index(base: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([base[r] + arange(counts[r]) for r])`` without a Python loop."""
    first = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(base - first, counts)


def _unit_hashes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """:func:`unit_hash64` of every unit ``data[starts[k]:starts[k] + lengths[k]]``;
    ``data`` has 8 readable bytes past every unit."""
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    h = lengths.astype(np.uint64) * _U64(_LEN_MULT)
    h ^= words[starts] & _MASKS[np.minimum(lengths, 8)]
    h *= _U64(_CHUNK_MULT)
    h ^= h >> _U64(29)
    todo = np.flatnonzero((lengths > 8) & (lengths <= _LONG_UNIT))
    k = 8
    while len(todo):
        chunk = words[starts[todo] + k] & _MASKS[np.minimum(lengths[todo] - k, 8)]
        x = (h[todo] ^ chunk) * _U64(_CHUNK_MULT)
        x ^= x >> _U64(29)
        h[todo] = x
        k += 8
        todo = todo[lengths[todo] > k]
    long_rows = np.flatnonzero(lengths > _LONG_UNIT)
    if len(long_rows):
        raw = data.tobytes()
        for r in long_rows.tolist():
            h[r] = _unit_state(raw[starts[r] : starts[r] + lengths[r]])
    return h


def _combine_units(
    unit_hash: np.ndarray, first_unit: np.ndarray, counts: np.ndarray, n: int, domain: int
) -> tuple:
    """Shingle hashes of ``n`` consecutive units (in ``domain``); record ``r``'s units start
    at ``first_unit[r]`` and it has ``counts[r]`` shingles. Returns the hashes and the index
    of each shingle's first unit."""
    # Weighted sums over every window of the unit array (windows that cross records
    # included: cheap contiguous arithmetic), then pick the windows inside a record.
    windows = len(unit_hash) - n + 1
    if windows <= 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    acc = unit_hash[:windows] * _U64(_weight(0))
    scratch = np.empty(windows, dtype=np.uint64)
    for i in range(1, n):
        np.multiply(unit_hash[i : i + windows], _U64(_weight(i)), out=scratch)
        acc += scratch
    g = _ragged_index(first_unit, counts)
    return fmix64(acc[g] ^ _U64(domain)), g


def shingle_batch(norm: NormalizedBatch, config: DedupConfig) -> Shingles:
    """Choose word or char mode for each record; hash all its shingles."""
    status = norm.status.copy()
    starts, ends = norm.starts, norm.ends
    lengths = ends - starts
    ok = status == Status.WORDS
    if config.max_doc_bytes is not None:
        large = ok & (lengths > config.max_doc_bytes)
        status[large] = Status.TOO_LARGE
        ok &= ~large
    n = len(status)
    spaces = np.flatnonzero(norm.data == _SPACE)
    # Spaces inside record r are spaces[first_space[r]:end_space[r]].
    first_space = np.searchsorted(spaces, starts)
    end_space = np.searchsorted(spaces, ends)
    n_spaces = np.where(ok, end_space - first_space, 0)
    n_words = np.where(ok, n_spaces + 1, 0)
    word_mode = (
        ok & (n_words >= config.ngram) & (lengths - n_spaces <= config.char_mode_token_bytes * n_words)
    )
    char_mode = ok & ~word_mode

    word_rows = np.flatnonzero(word_mode)
    word_spaces = spaces[_ragged_index(first_space[word_rows], n_spaces[word_rows])]
    w = _word_shingles(norm.data, starts, ends, word_spaces, word_rows, n_words, config.ngram)
    char_rows = np.flatnonzero(char_mode)
    c = _char_shingles(norm.data, starts, ends, char_rows, config.char_ngram)
    status[word_rows] = Status.WORDS
    status[char_rows[c[0] == 0]] = Status.TOO_SHORT
    status[char_rows[c[0] > 0]] = Status.CHARS

    counts = np.zeros(n, dtype=np.int64)
    counts[word_rows] = np.maximum(n_words[word_rows] - config.ngram + 1, 0)
    counts[char_rows] = c[0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if len(char_rows) == 0:  # the common case: word shingles are already in record order
        return Shingles(w[1], w[2], w[3], offsets, status)
    if len(word_rows) == 0:
        return Shingles(c[1], c[2], c[3], offsets, status)
    total = int(offsets[-1])
    h64 = np.empty(total, dtype=np.uint64)
    span_s = np.empty(total, dtype=np.int64)
    span_e = np.empty(total, dtype=np.int64)
    for rows, (_, hh, ss, ee) in ((word_rows, w), (char_rows, c)):
        if len(hh):
            group, local = _ragged(counts[rows])
            dest = offsets[rows][group] + local
            h64[dest], span_s[dest], span_e[dest] = hh, ss, ee
    return Shingles(h64, span_s, span_e, offsets, status)


def _word_shingles(data, starts, ends, spaces, rows, n_words, ngram):
    """Hashes and byte ranges of the word n-grams of ``rows``, record by record."""
    empty = np.zeros(0, dtype=np.int64)
    if len(rows) == 0:
        return None, np.zeros(0, np.uint64), empty, empty
    k = n_words[rows]
    first_word = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(k[:-1], out=first_word[1:])
    total_words = int(k.sum())
    last_word = first_word + k - 1
    word_start = np.empty(total_words, dtype=np.int64)
    word_end = np.empty(total_words, dtype=np.int64)
    not_first = np.ones(total_words, dtype=bool)
    not_first[first_word] = False
    word_start[first_word] = starts[rows]
    word_start[not_first] = spaces + 1
    not_last = np.ones(total_words, dtype=bool)
    not_last[last_word] = False
    word_end[last_word] = ends[rows]
    word_end[not_last] = spaces
    unit = _unit_hashes(data, word_start, word_end - word_start)
    h, g = _combine_units(unit, first_word, k - ngram + 1, ngram, _WORDS)
    return None, h, word_start[g], word_end[g + ngram - 1]


def _char_shingles(data, starts, ends, rows, n):
    """Counts, hashes and byte ranges of the code-point n-grams of ``rows``."""
    empty = np.zeros(0, dtype=np.int64)
    if len(rows) == 0:
        return empty, np.zeros(0, np.uint64), empty, empty
    lengths = ends[rows] - starts[rows]
    group, local = _ragged(lengths)
    idx = starts[rows][group] + local
    is_cp = (data[idx] & 0xC0) != 0x80
    cp_start, cp_group = idx[is_cp], group[is_cp]
    n_cps = np.bincount(cp_group, minlength=len(rows))
    cp_end = np.empty_like(cp_start)
    cp_end[:-1] = cp_start[1:]
    first_cp = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(n_cps[:-1], out=first_cp[1:])
    last_cp = first_cp + n_cps - 1
    has = n_cps > 0
    cp_end[last_cp[has]] = ends[rows][has]
    counts = np.maximum(n_cps - n + 1, 0)
    unit = _unit_hashes(data, cp_start, cp_end - cp_start)
    h, g = _combine_units(unit, first_cp, counts, n, _CHARS)
    return counts, h, cp_start[g], cp_end[g + n - 1]


def hash32(data: np.ndarray, sh: Shingles, shingle_hash: str | Callable[[bytes], int]) -> np.ndarray:
    """The 32-bit hash of every shingle by the chosen function: "fast" (the top bits of
    ``sh.hash64``), "sha1" (datasketch's default) or a callable ``bytes -> int``.
    The last two call Python per shingle: for compatibility checks, not for speed."""
    if isinstance(shingle_hash, str) and shingle_hash == "fast":
        return (sh.hash64 >> _U64(32)).astype(np.uint32)
    func = sha1_hash32 if shingle_hash == "sha1" else shingle_hash
    raw = data.tobytes()
    out = np.fromiter(
        (func(raw[s:e]) for s, e in zip(sh.starts.tolist(), sh.ends.tolist())),
        dtype=np.uint64,
        count=len(sh.starts),
    )
    if len(out) and int(out.max()) >= 1 << 32:
        raise ValueError("shingle_hash returned a value that does not fit in 32 bits")
    return out.astype(np.uint32)


def shingles(text: str | bytes | None, config: DedupConfig | None = None) -> tuple[str, list[bytes]]:
    """The mode (a :class:`dedup.status.Status` name, lowercase) and the shingles of one
    text, as bytes: the reference path for tests and for feeding peers."""
    config = config or DedupConfig()
    array = pa.array([text], pa.large_binary() if isinstance(text, bytes) else pa.large_string())
    norm = normalize_array(array)
    sh = shingle_batch(norm, config)
    raw = norm.data.tobytes()
    mode = Status(int(sh.status[0])).name.lower()
    return mode, [raw[s:e] for s, e in zip(sh.starts.tolist(), sh.ends.tolist())]
