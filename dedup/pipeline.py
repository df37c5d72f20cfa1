"""``find_duplicates``: the whole dedup run over a source of Arrow record batches.

The source is read at most twice and never held whole: the first pass keeps, per
record, a status byte, a 16-byte content key and one 8-byte key per LSH band (about
190 bytes with the defaults; signatures are dropped after banding unless
``verify="signature"``); the second pass (``verify="exact"``) re-reads only to shingle
the records that appear in candidate pairs.

A source is one of:

- a ``pyarrow.Table`` or ``RecordBatch``;
- a sequence of parts, each a ``Table``, a ``RecordBatch`` or a zero-argument callable
  returning one (or an iterable of them) — the form the dask pipeline distributes, one
  task per part;
- a zero-argument callable returning an iterable of tables/batches (called once per pass).

Record indices in the result count records across the source in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cachetier.errors import BadInputError
from dedup.config import DedupConfig
from dedup.exact import exact_eligible, exact_representatives
from dedup.result import DedupResult
from dedup.stages import (
    RunPlan,
    candidate_pairs,
    column_values,
    finish,
    near_active,
    shingle_sets,
    sketch_values,
    verify_pairs,
)
from dedup.verify import ShingleSets

__all__ = ["Source", "find_duplicates", "iter_part"]

Part = pa.Table | pa.RecordBatch | Callable[[], Any]
Source = pa.Table | pa.RecordBatch | Sequence[Part] | Callable[[], Iterable[pa.Table | pa.RecordBatch]]


def find_duplicates(
    source: Source,
    *,
    column: str = "text",
    config: DedupConfig | None = None,
    client: Any = None,
) -> DedupResult:
    """Find exact (and, with ``method="minhash"``, near) duplicates among the records of
    ``source``; keep the first record of each cluster.

    With a ``distributed.Client``, stages run on its workers (see
    :mod:`dedup.distributed`); the result is the same as without one. Raises
    :class:`cachetier.errors.BadInputError` for a missing or non-text column.
    """
    config = config or DedupConfig()
    if client is not None:
        from dedup.distributed import find_duplicates_distributed

        return find_duplicates_distributed(source, column=column, config=config, client=client)
    plan = RunPlan.create(config)
    reader = _reader(source, needs_second_pass=config.method == "minhash" and config.verify == "exact")
    clock = _Clock()

    status_parts, key_parts, band_parts, sig_parts = [], [], [], []
    for batch in reader():
        sketch = sketch_values(column_values(batch, column), plan)
        status_parts.append(sketch.status)
        key_parts.append(sketch.keys)
        band_parts.append(sketch.band_keys)
        sig_parts.append(sketch.sigs)
        del sketch
    clock.lap("sketch")
    # Each per-record array is joined and its parts dropped before the next one, so the
    # peak stays near one copy of what stage 1 keeps (~190 bytes per record).
    sizes = [len(p) for p in status_parts]
    status = np.concatenate(status_parts) if status_parts else np.zeros(0, np.uint8)
    del status_parts
    n = len(status)
    keys = np.concatenate(key_parts) if key_parts else np.zeros((0, 2), np.uint64)
    del key_parts
    rep = exact_representatives(keys, exact_eligible(status))
    del keys
    stats: dict[str, Any] = {"records": n}
    edges = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    if config.method == "minhash":
        active = near_active(status, rep)
        pairs = candidate_pairs(band_parts, active, config.max_bucket_neighbors)
        del band_parts
        stats.update(compared_records=int(active.sum()), candidate_pairs=len(pairs))
        clock.lap("candidates")
        sets = sig_index = sigs = None
        if config.verify == "exact":
            sets = _shingle_sets(reader, column, sizes, pairs, plan)
            clock.lap("shingle_sets")
        elif config.verify == "signature":
            sig_index = np.unique(np.concatenate([pairs >> np.uint64(32), pairs & np.uint64(0xFFFFFFFF)]))
            sig_index = sig_index.astype(np.int64)
            sigs = np.concatenate(sig_parts, axis=1)[:, sig_index]
        del sig_parts
        edges = verify_pairs(pairs, plan, sets, sigs, sig_index)
        clock.lap("verify")
    result = finish(status, rep, edges, plan, stats)
    clock.lap("cluster")
    result.stats["seconds"] = clock.laps
    return result


def _shingle_sets(reader, column, sizes, pairs, plan) -> list[ShingleSets]:
    wanted = np.unique(np.concatenate([pairs >> np.uint64(32), pairs & np.uint64(0xFFFFFFFF)])).astype(
        np.int64
    )
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    found = []
    for k, batch in enumerate(reader()):
        if k >= len(sizes):
            raise BadInputError("the source returned more parts on its second pass", subject="source")
        values = column_values(batch, column)
        if len(values) != sizes[k]:
            raise BadInputError(
                f"part {k} had {sizes[k]} records on the first pass and {len(values)} on the second",
                subject="source",
                hint="the source must return the same data each time it is read",
            )
        lo, hi = np.searchsorted(wanted, [bounds[k], bounds[k + 1]])
        if hi > lo:
            found.append(shingle_sets(values, wanted[lo:hi] - bounds[k], int(bounds[k]), plan))
    return found


def iter_part(part: Part) -> Iterator[pa.Table | pa.RecordBatch]:
    """The tables/batches of one part of a source (calling it if it is a callable)."""
    if callable(part) and not isinstance(part, (pa.Table, pa.RecordBatch)):
        part = part()
    if isinstance(part, (pa.Table, pa.RecordBatch)):
        yield part
        return
    if isinstance(part, Iterable):
        for item in part:
            if not isinstance(item, (pa.Table, pa.RecordBatch)):
                raise BadInputError(
                    f"expected Arrow tables or record batches, got {type(item).__name__}", subject="source"
                )
            yield item
        return
    raise BadInputError(
        f"expected an Arrow table, record batch or callable, got {type(part).__name__}", subject="source"
    )


def _reader(source: Source, *, needs_second_pass: bool) -> Callable[[], Iterator[pa.Table | pa.RecordBatch]]:
    """A function that starts a new pass over the source."""
    if isinstance(source, pa.Table):
        return lambda: iter(source.to_batches())
    if isinstance(source, pa.RecordBatch):
        return lambda: iter([source])
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return lambda: (item for part in source for item in iter_part(part))
    if callable(source):
        return lambda: iter_part(source)
    if isinstance(source, Iterable):
        if needs_second_pass:
            raise BadInputError(
                "a one-shot iterator cannot be read twice for exact verification",
                subject="source",
                hint="pass a list, a table or a callable that returns the batches",
            )
        return lambda: iter_part(source)
    raise BadInputError(f"unsupported source type {type(source).__name__}", subject="source")


class _Clock:
    """Wall and CPU seconds of consecutive stages."""

    def __init__(self) -> None:
        self.laps: dict[str, dict[str, float]] = {}
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        self.laps[name] = {"wall": round(wall - self._wall, 4), "cpu": round(cpu - self._cpu, 4)}
        self._wall, self._cpu = wall, cpu
