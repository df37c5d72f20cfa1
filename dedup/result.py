"""The outcome of a dedup run: which records to keep, and why each other one goes.

:class:`DedupResult` holds a keep-mask over the input records (in record order) and
three small Arrow tables for the audit:

- ``removed``: ``record`` (index), ``cluster`` (dense id, clusters numbered by their
  kept record), ``representative`` (the kept record of the cluster: its first record),
  ``reason`` (``exact``: same normalized content as an earlier record; ``near``: joined
  to the cluster through verified similar pairs), ``exact_of`` (for ``exact``: the first
  record with the same content; null for ``near``).
- ``skipped``: records kept without being compared, with the reason (``null``,
  ``empty``, ``invalid_utf8``, ``too_short``, ``too_large``).
- ``pairs``: the verified near-duplicate pairs (``left`` < ``right``) and their
  similarity (exact Jaccard, or the MinHash estimate with ``verify="signature"``,
  NaN with ``verify="none"``).

:meth:`DedupResult.summary` is the small JSON-able dict for a version record;
:meth:`DedupResult.to_dict` adds the lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["PAIRS_SCHEMA", "REMOVED_SCHEMA", "SKIPPED_SCHEMA", "DedupResult"]

REMOVED_SCHEMA = pa.schema(
    [
        ("record", pa.int64()),
        ("cluster", pa.int64()),
        ("representative", pa.int64()),
        ("reason", pa.string()),
        ("exact_of", pa.int64()),
    ]
)
SKIPPED_SCHEMA = pa.schema([("record", pa.int64()), ("reason", pa.string())])
PAIRS_SCHEMA = pa.schema([("left", pa.int64()), ("right", pa.int64()), ("similarity", pa.float64())])


@dataclass(frozen=True, eq=False)
class DedupResult:
    """Keep-mask, audit tables, cluster count, parameters and run statistics."""

    keep: np.ndarray
    removed: pa.Table
    skipped: pa.Table
    pairs: pa.Table
    clusters: int
    params: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Number of input records."""
        return len(self.keep)

    @property
    def removed_records(self) -> int:
        """Number of records to drop."""
        return self.removed.num_rows

    def removed_indices(self) -> np.ndarray:
        """Indices of the records to drop, ascending (int64)."""
        return self.removed.column("record").to_numpy()

    def keeping_first(self, n: int) -> DedupResult:
        """This result with the first ``n`` records kept whatever they duplicate (data that
        is already committed): only later records are removed, counted and audited; the
        first ``n`` still stand as the representatives of their clusters."""
        if n <= 0:
            return self
        import pyarrow.compute as pc

        keep = self.keep.copy()
        keep[:n] = True
        later = pc.greater_equal(self.removed.column("record"), n)
        removed = self.removed.filter(later)
        dense = np.unique(removed.column("cluster").to_numpy(), return_inverse=True)[1]
        removed = removed.set_column(
            removed.schema.get_field_index("cluster"), "cluster", pa.array(dense.astype(np.int64))
        )
        return DedupResult(
            keep=keep,
            removed=removed,
            skipped=self.skipped.filter(pc.greater_equal(self.skipped.column("record"), n)),
            pairs=self.pairs.filter(pc.greater_equal(self.pairs.column("right"), n)),
            clusters=int(dense.max()) + 1 if len(dense) else 0,
            params=self.params,
            stats=self.stats,
        )

    def summary(self) -> dict[str, Any]:
        """Counts and parameters, JSON-able and small (for a version record)."""
        reasons = self.removed.column("reason").to_pylist()
        skipped: dict[str, int] = {}
        for reason in self.skipped.column("reason").to_pylist():
            skipped[reason] = skipped.get(reason, 0) + 1
        return {
            "records": self.records,
            "kept_records": int(self.keep.sum()),
            "removed_records": self.removed_records,
            "exact_removed": reasons.count("exact"),
            "near_removed": reasons.count("near"),
            "clusters": self.clusters,
            "skipped": dict(sorted(skipped.items())),
            "params": self.params,
            "stats": self.stats,
        }

    def to_dict(self) -> dict[str, Any]:
        """The summary plus the ``removed``, ``skipped`` and ``pairs`` rows (JSON-able)."""
        out = self.summary()
        out["removed"] = self.removed.to_pylist()
        out["skipped_records"] = self.skipped.to_pylist()
        out["pairs"] = self.pairs.to_pylist()
        return out
