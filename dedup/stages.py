"""The stages of a dedup run, shared by the single-process and the dask pipelines.

1. :func:`sketch_values` (per batch or partition): normalize, shingle, content keys,
   MinHash signatures, band keys. Work is done in slices of ``chunk_bytes`` of text.
2. :func:`exact_representatives` (global, on 16 bytes per record), then
   :func:`candidate_pairs` (per band: sort, buckets, pairs) over the records that are
   first of their exact group and have shingles.
3. :func:`shingle_sets` (per batch, only the records that appear in candidate pairs):
   the exact shingle sets for verification.
4. :func:`finish` (global): verify, connected components, keep rule, result tables.

Each stage is a pure function of its inputs, so the dask pipeline runs the same
functions on other processes and gets the same result.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cachetier.errors import BadInputError
from dedup.cluster import connected_components
from dedup.config import DedupConfig
from dedup.exact import content_keys, exact_eligible
from dedup.lsh import band_keys, band_pairs, choose_bands, decode_pairs
from dedup.minhash import Permutations, signatures
from dedup.normalize import check_type, normalize_array
from dedup.result import PAIRS_SCHEMA, REMOVED_SCHEMA, SKIPPED_SCHEMA, DedupResult
from dedup.shingle import hash32, shingle_batch
from dedup.status import NEAR_ELIGIBLE, REASONS
from dedup.verify import ShingleSets, exact_jaccard, signature_jaccard

__all__ = [
    "BatchSketch",
    "RunPlan",
    "candidate_pairs",
    "column_values",
    "finish",
    "minhash_signatures",
    "near_active",
    "shingle_sets",
    "sketch_values",
    "verify_pairs",
]

ALGORITHM = "tierdata-dedup/1"


@dataclass(frozen=True, eq=False)
class RunPlan:
    """A config with its derived parts: the permutations and the banding."""

    config: DedupConfig
    perms: Permutations | None
    bands: int
    rows: int

    @classmethod
    def create(cls, config: DedupConfig) -> RunPlan:
        """Resolve the banding (chosen when not given) and draw the permutations."""
        if config.method == "exact":
            return cls(config, None, 0, 0)
        if config.bands is not None and config.rows is not None:
            bands, rows = config.bands, config.rows
        else:
            bands, rows = choose_bands(config.threshold, config.num_perm, config.max_miss)
        return cls(config, Permutations.create(config.num_perm, config.seed, config.scheme), bands, rows)

    def params(self) -> dict[str, Any]:
        """Every parameter that determines the result, JSON-able."""
        out = self.config.to_dict()
        out["algorithm"] = ALGORITHM
        if self.config.method == "minhash":
            out["bands"], out["rows"] = self.bands, self.rows
        return out


@dataclass(frozen=True, eq=False)
class BatchSketch:
    """What stage 1 keeps of ``len(status)`` records: no text, no shingles."""

    status: np.ndarray  # uint8
    keys: np.ndarray  # (n, 2) uint64 content keys
    band_keys: np.ndarray | None  # (bands, n) uint64, minhash only
    sigs: np.ndarray | None  # (num_perm, n), only for verify="signature"

    @classmethod
    def concat(cls, parts: list[BatchSketch]) -> BatchSketch:
        """Join sketches of consecutive record ranges."""
        if not parts:
            return cls(np.zeros(0, np.uint8), np.zeros((0, 2), np.uint64), None, None)
        bands = None if parts[0].band_keys is None else np.concatenate([p.band_keys for p in parts], axis=1)
        sigs = None if parts[0].sigs is None else np.concatenate([p.sigs for p in parts], axis=1)
        return cls(
            np.concatenate([p.status for p in parts]),
            np.concatenate([p.keys for p in parts]),
            bands,
            sigs,
        )


def column_values(batch: pa.RecordBatch | pa.Table, column: str) -> pa.Array | pa.ChunkedArray:
    """The dedup column of a batch, or a clear error naming it."""
    names = batch.schema.names
    if column not in names:
        raise BadInputError(
            f"column {column!r} not found (columns: {', '.join(names)})",
            subject=column,
            hint="pass the text column with column=...",
        )
    check_type(batch.schema.field(column).type)
    return batch.column(column)


def _byte_slices(values: pa.Array, chunk_bytes: int) -> list[tuple[int, int]]:
    """Row ranges of ``values`` holding about ``chunk_bytes`` bytes each."""
    n = len(values)
    if n == 0:
        return []
    lengths = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    cum = np.cumsum(lengths, dtype=np.int64)
    bounds = [0]
    while bounds[-1] < n:
        base = int(cum[bounds[-1] - 1]) if bounds[-1] else 0
        nxt = int(np.searchsorted(cum, base + chunk_bytes, side="right"))
        bounds.append(min(n, max(nxt, bounds[-1] + 1)))
    return list(itertools.pairwise(bounds))


def _slices(values: pa.Array | pa.ChunkedArray, chunk_bytes: int):
    """Consecutive slices of about ``chunk_bytes`` bytes, chunk by chunk (no copies)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    for chunk in chunks:
        for lo, hi in _byte_slices(chunk, chunk_bytes):
            yield chunk.slice(lo, hi - lo)


def sketch_values(values: pa.Array | pa.ChunkedArray, plan: RunPlan) -> BatchSketch:
    """Stage 1 for one column of values."""
    config = plan.config
    parts = []
    for piece in _slices(values, config.chunk_bytes):
        norm = normalize_array(piece, content=config.content)
        if config.method == "exact":
            status = norm.status
            parts.append(BatchSketch(status, content_keys(norm, exact_eligible(status)), None, None))
            continue
        sh = shingle_batch(norm, config)
        sigs = signatures(hash32(norm.data, sh, config.shingle_hash), sh.offsets, plan.perms)
        keys = content_keys(norm, exact_eligible(sh.status))
        bkeys = band_keys(sigs, plan.bands, plan.rows)
        parts.append(BatchSketch(sh.status, keys, bkeys, sigs if config.verify == "signature" else None))
    return BatchSketch.concat(parts)


def minhash_signatures(
    values: pa.Array | pa.ChunkedArray, config: DedupConfig
) -> tuple[np.ndarray, np.ndarray]:
    """``(records, num_perm)`` MinHash signatures (datasketch's layout: row ``i`` equals
    ``datasketch.MinHash(num_perm, seed, scheme=..., hashfunc=...)`` updated with the
    shingles of record ``i``) and each record's status."""
    check_type(values.type)
    perms = Permutations.create(config.num_perm, config.seed, config.scheme)
    sigs, status = [], []
    for piece in _slices(values, config.chunk_bytes):
        norm = normalize_array(piece)
        sh = shingle_batch(norm, config)
        sigs.append(signatures(hash32(norm.data, sh, config.shingle_hash), sh.offsets, perms))
        status.append(sh.status)
    if not sigs:
        return np.zeros((0, config.num_perm), dtype=perms.dtype), np.zeros(0, np.uint8)
    return np.concatenate(sigs, axis=1).T.copy(), np.concatenate(status)


def near_active(status: np.ndarray, rep: np.ndarray) -> np.ndarray:
    """Records that take part in LSH: shingled, and first of their exact group."""
    return np.isin(status, np.array(NEAR_ELIGIBLE, dtype=np.uint8)) & (rep == np.arange(len(rep)))


def candidate_pairs(parts: list[np.ndarray | None], active: np.ndarray, max_neighbors: int) -> np.ndarray:
    """Stage 2 for all bands: ``parts`` are consecutive ``(bands, records)`` key arrays,
    ``active`` the records taking part; returns unique sorted pair codes. Only one band of
    the active records is copied at a time."""
    records = np.flatnonzero(active)
    parts = [p for p in parts if p is not None and p.shape[1]]
    if not parts or len(records) < 2:
        return np.zeros(0, dtype=np.uint64)
    bounds = np.cumsum([0] + [p.shape[1] for p in parts])
    masks = [active[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    out = []
    for band in range(parts[0].shape[0]):
        keys = np.concatenate([p[band][m] for p, m in zip(parts, masks)])
        out.append(band_pairs(keys, records, max_neighbors))
    return np.unique(np.concatenate(out))


def shingle_sets(
    values: pa.Array | pa.ChunkedArray, rows: np.ndarray, first_record: int, plan: RunPlan
) -> ShingleSets:
    """Stage 3: exact shingle sets of ``rows`` (increasing indices into ``values``)."""
    if len(rows) == 0:
        return ShingleSets.concat([])
    sub = values.take(pa.array(rows, pa.int64()))
    parts, done = [], 0
    for piece in _slices(sub, plan.config.chunk_bytes):
        norm = normalize_array(piece, content="text")
        sh = shingle_batch(norm, plan.config)
        parts.append(ShingleSets.build(rows[done : done + len(piece)] + first_record, sh.hash64, sh.offsets))
        done += len(piece)
    return ShingleSets.concat(parts)


def verify_pairs(
    pairs: np.ndarray,
    plan: RunPlan,
    sets: ShingleSets | list[ShingleSets] | None,
    sigs: np.ndarray | None,
    sig_index: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stage 4a: the candidate pairs that pass verification, with their similarity."""
    i, j = decode_pairs(pairs)
    mode = plan.config.verify
    if mode == "none":
        return i, j, np.full(len(i), np.nan)
    sim = exact_jaccard(i, j, sets) if mode == "exact" else signature_jaccard(i, j, sigs, sig_index)
    ok = sim >= plan.config.threshold
    return i[ok], j[ok], sim[ok]


def finish(
    status: np.ndarray,
    rep: np.ndarray,
    edges: tuple[np.ndarray, np.ndarray, np.ndarray],
    plan: RunPlan,
    stats: dict[str, Any],
) -> DedupResult:
    """Stage 4b: clusters from exact groups and verified pairs; the keep rule; tables."""
    n = len(status)
    i, j, sim = edges
    dup = np.flatnonzero((rep >= 0) & (rep != np.arange(n)))
    roots = connected_components(n, np.concatenate([dup, i]), np.concatenate([rep[dup], j]))
    removed = np.flatnonzero(roots != np.arange(n))
    representative = roots[removed]
    cluster_roots = np.unique(representative)
    cluster = np.searchsorted(cluster_roots, representative)
    is_exact = rep[removed] != removed
    reason = np.where(is_exact, "exact", "near")
    keep = roots == np.arange(n)
    skip_codes = np.array(sorted(REASONS), dtype=np.uint8)
    skipped = np.flatnonzero(keep & np.isin(status, skip_codes))
    reason_of = {code: name for code, name in REASONS.items()}
    tables = {
        "removed": pa.table(
            [
                pa.array(removed, pa.int64()),
                pa.array(cluster.astype(np.int64), pa.int64()),
                pa.array(representative, pa.int64()),
                pa.array(reason.tolist(), pa.string()),
                pa.array(np.where(is_exact, rep[removed], 0), pa.int64(), mask=~is_exact),
            ],
            schema=REMOVED_SCHEMA,
        ),
        "skipped": pa.table(
            [
                pa.array(skipped, pa.int64()),
                pa.array([reason_of[int(c)] for c in status[skipped]], pa.string()),
            ],
            schema=SKIPPED_SCHEMA,
        ),
        "pairs": pa.table(
            [pa.array(i, pa.int64()), pa.array(j, pa.int64()), pa.array(sim, pa.float64())],
            schema=PAIRS_SCHEMA,
        ),
    }
    stats = dict(stats)
    stats["verified_pairs"] = len(i)
    return DedupResult(
        keep=keep,
        removed=tables["removed"],
        skipped=tables["skipped"],
        pairs=tables["pairs"],
        clusters=len(cluster_roots),
        params=plan.params(),
        stats=stats,
    )
