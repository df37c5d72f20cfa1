"""Exact and MinHash near-duplicate detection on Arrow record batches (no storage here).

Entry point: :func:`find_duplicates` (one process, or a dask cluster with ``client=``)
returns a :class:`DedupResult`: a keep-mask (the first record of each cluster is kept)
and audit tables. Parameters live in :class:`DedupConfig`. The building blocks are
public for tests, benchmarks and other tools: normalization (:func:`normalize_text`),
shingles (:func:`shingles`) and their hash functions, signatures equal to datasketch's
(:func:`minhash_signatures`), the banding choice (:func:`choose_bands`).
"""

from dedup.config import DedupConfig
from dedup.distributed import local_cluster, tune_worker_malloc
from dedup.lsh import choose_bands
from dedup.normalize import normalize_text
from dedup.pipeline import find_duplicates
from dedup.result import DedupResult
from dedup.shingle import char_shingle_hash32, shingles, word_shingle_hash32
from dedup.stages import minhash_signatures

__all__ = [
    "DedupConfig",
    "DedupResult",
    "char_shingle_hash32",
    "choose_bands",
    "find_duplicates",
    "local_cluster",
    "minhash_signatures",
    "normalize_text",
    "shingles",
    "tune_worker_malloc",
    "word_shingle_hash32",
]
