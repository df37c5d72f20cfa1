"""The methods compared side by side, each end to end from an Arrow table of texts.

- ``tierdata``: :func:`dedup.find_duplicates` (defaults: 128 permutations, 21 x 6
  bands, exact-Jaccard verification).
- ``datasketch``: Python shingling, ``MinHash.bulk`` (SHA-1, its default), then
  ``MinHashLSH(threshold=0.8)`` (it picks 9 x 13) insert and query; candidates are its
  answer, as its users take them.
- ``rensa``: Python shingling, ``RMinHash.from_token_sets`` (Rust), ``RMinHashLSH``
  with 16 bands of 8, ``insert_many`` and ``query_all``.

Peers need their own environment (``benchmarks/setup_bench_env.sh``). Each returns the
pairs it found as ``uint64`` codes (``i << 32 | j``, ``i < j``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

from dedup.lsh import encode_pairs

__all__ = ["METHODS", "py_shingles", "run_method"]

THRESHOLD = 0.8
NUM_PERM = 128
_PUNCT = re.compile(r"[^\w\s]+")


def py_shingles(text: str, n: int = 5) -> list[str]:
    """The same 5-word shingles as tierdata's on this corpus, the usual Python way."""
    words = _PUNCT.sub(" ", text.lower()).split()
    if len(words) < n:
        return [" ".join(words)]
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def _codes(query_results: list[list[int]] | Any) -> np.ndarray:
    left, right = [], []
    for i, found in enumerate(query_results):
        for j in found:
            if j != i:
                left.append(i)
                right.append(j)
    if not left:
        return np.zeros(0, np.uint64)
    return np.unique(encode_pairs(np.array(left), np.array(right)))


def run_tierdata(table: pa.Table) -> tuple[np.ndarray, Any]:
    """tierdata, single process."""
    from benchmarks.dedup.quality import tierdata_pairs
    from dedup import find_duplicates

    result = find_duplicates(table)
    return tierdata_pairs(result), result


def run_datasketch(table: pa.Table) -> tuple[np.ndarray, Any]:
    """datasketch's bulk API and LSH index."""
    from datasketch import MinHash, MinHashLSH

    texts = table.column("text").to_pylist()
    shingle_sets = ([s.encode("utf-8") for s in py_shingles(t)] for t in texts)  # streamed
    sketches = MinHash.bulk(shingle_sets, num_perm=NUM_PERM)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    with lsh.insertion_session() as session:
        for i, m in enumerate(sketches):
            session.insert(i, m)
    return _codes([lsh.query(m) for m in sketches]), {"bands": lsh.b, "rows": lsh.r}


def run_rensa(table: pa.Table) -> tuple[np.ndarray, Any]:
    """rensa's bulk constructors and LSH index."""
    from rensa import RMinHash, RMinHashLSH

    texts = table.column("text").to_pylist()
    sketches = RMinHash.from_token_sets((py_shingles(t) for t in texts), NUM_PERM, 42)  # streamed
    lsh = RMinHashLSH(THRESHOLD, NUM_PERM, 16)
    lsh.insert_many(sketches)
    return _codes(lsh.query_all(sketches)), {"bands": 16, "rows": 8}


METHODS = {"tierdata": run_tierdata, "datasketch": run_datasketch, "rensa": run_rensa}


def run_method(name: str, table: pa.Table) -> tuple[np.ndarray, Any]:
    """Run one method by name."""
    return METHODS[name](table)
