"""Exact ground truth for the dedup benchmark: every pair with 5-word-shingle Jaccard >= t.

Shingles are named exactly (no hashing): the five 16-bit word ids of a shingle are
packed into 80 bits and numbered by sorting. The all-pairs join is exact and fast by
*prefix filtering*: order shingles by global frequency (rarest first); a set ``x``
sends only its first ``|x| - ceil(t * |x|) + 1`` shingles to an inverted index. Any pair
with Jaccard >= t has an overlap of at least ``t * max(|x|, |y|)``, so it shares one of
these prefix shingles (the classic prefix-filter lemma): no true pair can be missed.
Every pair sharing a prefix shingle is then checked by exact set intersection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks.dedup.corpus import Corpus

__all__ = ["Truth", "exact_truth", "shingle_sets"]


@dataclass
class Truth:
    """Pairs (left < right) with their exact Jaccard, for all pairs at or above ``threshold``,
    and for every checked candidate (for plots)."""

    threshold: float
    left: np.ndarray
    right: np.ndarray
    jaccard: np.ndarray
    checked_left: np.ndarray
    checked_right: np.ndarray
    checked_jaccard: np.ndarray

    def codes(self) -> np.ndarray:
        """The true pairs as ``left << 32 | right`` uint64 codes."""
        return (self.left.astype(np.uint64) << np.uint64(32)) | self.right.astype(np.uint64)


def shingle_sets(corpus: Corpus, n: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique exact shingle ids of every document: (values, offsets)."""
    words, offsets = corpus.words.astype(np.uint64), corpus.offsets
    docs = len(offsets) - 1
    counts = np.maximum(np.diff(offsets) - n + 1, 0)
    doc_of = np.repeat(np.arange(docs), counts)
    first = np.zeros(docs, dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    local = np.arange(int(counts.sum())) - first[doc_of]
    pos = offsets[:-1][doc_of] + local
    hi = (words[pos] << np.uint64(32)) | (words[pos + 1] << np.uint64(16)) | words[pos + 2]
    lo = (words[pos + 3] << np.uint64(16)) | words[pos + 4]
    order = np.lexsort((lo, hi))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (hi[order][1:] != hi[order][:-1]) | (lo[order][1:] != lo[order][:-1])
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    # Unique per document, sorted: sort by (doc, id).
    key = np.lexsort((ids, doc_of))
    d, v = doc_of[key], ids[key]
    keep = np.ones(len(v), dtype=bool)
    keep[1:] = (d[1:] != d[:-1]) | (v[1:] != v[:-1])
    d, v = d[keep], v[keep]
    out_offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(np.bincount(d, minlength=docs), out=out_offsets[1:])
    return v, out_offsets


def _overlap(a: np.ndarray, b: np.ndarray) -> int:
    if len(a) > len(b):
        a, b = b, a
    pos = np.searchsorted(b, a)
    pos[pos == len(b)] = 0
    return int(np.count_nonzero(b[pos] == a))


def exact_truth(corpus: Corpus, threshold: float = 0.8, n: int = 5) -> Truth:
    """All pairs with exact shingle Jaccard >= ``threshold`` (prefix-filtered exact join)."""
    values, offsets = shingle_sets(corpus, n)
    docs = len(offsets) - 1
    sizes = np.diff(offsets)
    freq = np.bincount(values)
    rank_of = np.empty(len(freq), dtype=np.int64)
    rank_of[np.lexsort((np.arange(len(freq)), freq))] = np.arange(len(freq))
    pre_doc, pre_tok = [], []
    for doc in range(docs):
        size = int(sizes[doc])
        if size == 0:
            continue
        ranks = np.sort(rank_of[values[offsets[doc] : offsets[doc + 1]]])
        p = size - math.ceil(threshold * size - 1e-12) + 1
        pre_tok.append(ranks[:p])
        pre_doc.append(np.full(p, doc, dtype=np.int64))
    tok = np.concatenate(pre_tok)
    doc_ids = np.concatenate(pre_doc)
    order = np.lexsort((doc_ids, tok))
    tok, doc_ids = tok[order], doc_ids[order]
    starts = np.flatnonzero(np.concatenate([[True], tok[1:] != tok[:-1]]))
    ends = np.concatenate([starts[1:], [len(tok)]])
    multi = np.flatnonzero(ends - starts > 1)
    cand = set()
    for g in multi.tolist():
        members = doc_ids[starts[g] : ends[g]].tolist()
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                a, b = members[x], members[y]
                small, large = min(sizes[a], sizes[b]), max(sizes[a], sizes[b])
                if small >= threshold * large - 1e-12:
                    cand.add((a, b) if a < b else (b, a))
    pairs = np.array(sorted(cand), dtype=np.int64).reshape(-1, 2)
    jac = np.zeros(len(pairs))
    for k, (a, b) in enumerate(pairs.tolist()):
        inter = _overlap(values[offsets[a] : offsets[a + 1]], values[offsets[b] : offsets[b + 1]])
        jac[k] = inter / (sizes[a] + sizes[b] - inter)
    ok = jac >= threshold
    return Truth(threshold, pairs[ok, 0], pairs[ok, 1], jac[ok], pairs[:, 0], pairs[:, 1], jac)
