"""Scoring a dedup run against the exact truth: pair precision/recall and false merges.

- **Pairs found** by a method: for tierdata, the verified near-duplicate pairs between
  exact-group representatives, expanded over the exact groups (every member of one group
  paired with every member of the other), plus the pairs inside each exact group; for
  the peers, the LSH candidate pairs their query API returns.
- **Pair precision / recall / F1** against the truth pairs (Jaccard >= threshold).
- **False merges**: clusters (connected components of the found pairs; for tierdata its
  own clusters) holding documents from two or more planted families, i.e. unrelated
  documents chained together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dedup.cluster import connected_components
from dedup.lsh import encode_pairs
from dedup.result import DedupResult

__all__ = ["cluster_scores", "pair_scores", "tierdata_pairs"]


def tierdata_pairs(result: DedupResult) -> np.ndarray:
    """Unique encoded pairs found by a tierdata run (see module docstring)."""
    n = result.records
    exact_rep = np.arange(n)
    removed = result.removed
    reasons = np.array(removed.column("reason").to_pylist())
    rec = removed.column("record").to_numpy()
    exact_of = removed.column("exact_of").fill_null(-1).to_numpy()
    is_exact = reasons == "exact"
    exact_rep[rec[is_exact]] = exact_of[is_exact]
    order = np.argsort(exact_rep, kind="stable")
    reps_sorted = exact_rep[order]
    starts = np.searchsorted(reps_sorted, np.arange(n))
    ends = np.searchsorted(reps_sorted, np.arange(n), side="right")

    def members(r: int) -> np.ndarray:
        return order[starts[r] : ends[r]]

    out = []
    for r in np.unique(exact_rep[rec[is_exact]]).tolist():
        m = members(r)
        a, b = np.triu_indices(len(m), 1)
        out.append(encode_pairs(m[a], m[b]))
    left = result.pairs.column("left").to_numpy()
    right = result.pairs.column("right").to_numpy()
    for x, y in zip(left.tolist(), right.tolist()):
        mx, my = members(x), members(y)
        out.append(encode_pairs(np.repeat(mx, len(my)), np.tile(my, len(mx))))
    return np.unique(np.concatenate(out)) if out else np.zeros(0, np.uint64)


def pair_scores(found: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Precision, recall and F1 of encoded ``found`` pairs against encoded ``truth`` pairs."""
    found, truth = np.unique(found), np.unique(truth)
    tp = int(np.intersect1d(found, truth, assume_unique=True).size)
    precision = tp / len(found) if len(found) else 1.0
    recall = tp / len(truth) if len(truth) else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "found_pairs": len(found),
        "true_pairs": len(truth),
        "true_positives": tp,
        "precision": round(precision, 5),
        "recall": round(recall, 5),
        "f1": round(f1, 5),
    }


def cluster_scores(
    n: int, found: np.ndarray, family: np.ndarray, roots: np.ndarray | None = None
) -> dict[str, Any]:
    """Clusters (``roots`` if given, else components of ``found``) and how many of them mix
    documents of different families."""
    if roots is None:
        i = (found >> np.uint64(32)).astype(np.int64)
        j = (found & np.uint64(0xFFFFFFFF)).astype(np.int64)
        roots = connected_components(n, i, j)
    multi = roots != np.arange(n)
    cluster_roots = np.unique(roots[multi])
    members = np.flatnonzero(np.isin(roots, cluster_roots))
    fam = family[members]
    r = roots[members]
    order = np.lexsort((fam, r))
    r, fam = r[order], fam[order]
    distinct = np.ones(len(r), dtype=bool)
    distinct[1:] = (r[1:] != r[:-1]) | (fam[1:] != fam[:-1])
    families_per_cluster = np.bincount(
        np.searchsorted(cluster_roots, r[distinct]), minlength=len(cluster_roots)
    )
    sizes = np.bincount(np.searchsorted(cluster_roots, r), minlength=len(cluster_roots))
    return {
        "clusters": len(cluster_roots),
        "false_merged_clusters": int((families_per_cluster > 1).sum()),
        "largest_cluster": int(sizes.max()) if len(sizes) else 0,
    }
