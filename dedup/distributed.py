"""The dedup pipeline on a dask.distributed cluster: same stages, same result.

Given a ``distributed.Client``, :func:`find_duplicates_distributed` runs:

1. one task per source part: normalize, shingle, sign, band (``sketch``); the band keys
   stay on the workers, only status bytes and 16-byte content keys come back;
2. exact groups on the client (16 bytes per record), then a **hash shuffle of the band
   keys**: each sketch is split into ``R`` pieces by key, and reducer ``r`` gathers
   piece ``r`` of every part, so each LSH bucket lands whole on one reducer, which turns
   buckets into candidate pairs with the same function as the single-process run;
3. one task per part that holds candidate records: their exact shingle sets;
4. verification, connected components and the keep rule on the client (edges only).

Parts are a sequence of Arrow tables/batches or zero-argument callables that return
one (a callable runs on the worker, so a part can be read there from storage); a table
given whole is cut into parts of about equal size. Results equal the single-process
ones for the same records, parameters and order, whatever the partitioning.

**Worker memory settings.** dask's nanny exports ``MALLOC_TRIM_THRESHOLD_=65536`` to its
workers; that also freezes glibc's mmap threshold at 128 KiB, so every larger numpy
temporary is a fresh ``mmap`` with page faults, measured here at up to 2x the CPU of the
same task in a plain process. :func:`local_cluster` starts a ``LocalCluster`` whose
workers get ``MALLOC_TRIM_THRESHOLD_``/``MALLOC_MMAP_THRESHOLD_`` of
:data:`MALLOC_ENV`; for an existing cluster, :func:`tune_worker_malloc` applies the same
settings to running workers through ``mallopt`` (opt-in: it changes the worker processes).
"""

from __future__ import annotations

import ctypes
import operator
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cachetier.errors import BadInputError
from dedup.config import DedupConfig
from dedup.exact import exact_eligible, exact_representatives
from dedup.lsh import band_pairs, decode_pairs
from dedup.pipeline import iter_part
from dedup.result import DedupResult
from dedup.shingle import fmix64
from dedup.stages import (
    BatchSketch,
    RunPlan,
    column_values,
    finish,
    near_active,
    shingle_sets,
    sketch_values,
    verify_pairs,
)
from dedup.verify import ShingleSets

__all__ = ["MALLOC_ENV", "find_duplicates_distributed", "local_cluster", "tune_worker_malloc"]

MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def local_cluster(n_workers: int = 2, *, threads_per_worker: int = 1, processes: bool = True, **kwargs: Any):
    """A ``distributed.LocalCluster`` (127.0.0.1 only) whose workers get :data:`MALLOC_ENV`."""
    import dask
    from distributed import LocalCluster

    environ = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in MALLOC_ENV.items()}
    with dask.config.set(environ):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=processes,
            host="127.0.0.1",
            dashboard_address=None,
            **kwargs,
        )


def _mallopt() -> bool:
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, int(MALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]))
        ok &= libc.mallopt(_M_TRIM_THRESHOLD, int(MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]))
        return bool(ok)
    except (OSError, AttributeError):
        return False


def tune_worker_malloc(client: Any) -> dict[str, bool]:
    """Apply :data:`MALLOC_ENV` to every running worker of ``client`` (glibc ``mallopt``);
    returns, per worker address, whether it took effect."""
    return client.run(_mallopt)


# ----------------------------------------------------------------------------- tasks


def _load(part: Any) -> pa.Table:
    items = list(iter_part(part))
    if len(items) == 1 and isinstance(items[0], pa.Table):
        return items[0]
    return pa.Table.from_batches(
        [b for t in items for b in (t.to_batches() if isinstance(t, pa.Table) else [t])]
    )


def _sketch_task(part: Any, column: str, plan: RunPlan) -> tuple[BatchSketch, float, float]:
    """Stage 1 on a worker; also returns the CPU seconds of loading and of sketching."""
    start = time.thread_time()
    table = _load(part)
    loaded = time.thread_time()
    sketch = sketch_values(column_values(table, column), plan)
    return sketch, loaded - start, time.thread_time() - loaded


def _meta_task(result: tuple[BatchSketch, float, float]) -> tuple[np.ndarray, np.ndarray, float, float]:
    sketch, load_cpu, cpu = result
    return sketch.status, sketch.keys, load_cpu, cpu


def _bucket_of(keys: np.ndarray, reducers: int) -> np.ndarray:
    return (fmix64(keys.copy()) % np.uint64(reducers)).astype(np.int64)


def _split_task(
    result: tuple[BatchSketch, float, float], active: np.ndarray, first: int, reducers: int
) -> list:
    """Band keys of the active records, cut into ``reducers`` pieces by key."""
    start = time.thread_time()
    keys = result[0].band_keys[:, active]
    records = np.flatnonzero(active).astype(np.int64) + first
    bands = np.broadcast_to(np.arange(keys.shape[0], dtype=np.int16)[:, None], keys.shape)
    flat_keys, flat_bands = keys.ravel(), bands.ravel()
    flat_records = np.broadcast_to(records[None, :], keys.shape).ravel()
    target = _bucket_of(flat_keys, reducers)
    order = np.argsort(target, kind="stable")
    bounds = np.searchsorted(target[order], np.arange(reducers + 1))
    pieces = []
    for r in range(reducers):
        sel = order[bounds[r] : bounds[r + 1]]
        pieces.append((flat_bands[sel], flat_keys[sel], flat_records[sel]))
    return [pieces, time.thread_time() - start]


def _piece(split: list, r: int) -> tuple:
    return split[0][r]


def _reduce_task(pieces: list, max_neighbors: int) -> tuple[np.ndarray, float]:
    """Candidate pairs of the buckets in these pieces (band by band, records ascending)."""
    start = time.thread_time()
    bands = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, np.int16)
    keys = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, np.uint64)
    records = np.concatenate([p[2] for p in pieces]) if pieces else np.zeros(0, np.int64)
    out = []
    # Pieces arrive in part order and records ascend inside each: a stable sort by band
    # keeps every band's records ascending, as band_pairs requires.
    order = np.argsort(bands, kind="stable")
    bands, keys, records = bands[order], keys[order], records[order]
    bounds = np.flatnonzero(np.diff(bands)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(bands)]])):
        if hi - lo > 1:
            out.append(band_pairs(keys[lo:hi], records[lo:hi], max_neighbors))
    pairs = np.unique(np.concatenate(out)) if out else np.zeros(0, np.uint64)
    return pairs, time.thread_time() - start


def _sets_task(
    part: Any, column: str, rows: np.ndarray, first: int, plan: RunPlan
) -> tuple[ShingleSets, float]:
    table = _load(part)
    start = time.thread_time()
    sets = shingle_sets(column_values(table, column), rows, first, plan)
    return sets, time.thread_time() - start


def _sigs_task(result: tuple[BatchSketch, float, float], rows: np.ndarray) -> np.ndarray:
    return result[0].sigs[:, rows]


# ----------------------------------------------------------------------------- driver


def _parts(source: Any, workers: int) -> list[Any]:
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        count = max(1, min(source.num_rows, 2 * workers))
        step = -(-source.num_rows // count) if source.num_rows else 1
        return [source.slice(lo, step) for lo in range(0, max(source.num_rows, 1), step)]
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return list(source)
    if callable(source):
        return [source]
    raise BadInputError(
        f"a distributed run needs a table, a record batch, a sequence of parts or a callable; "
        f"got {type(source).__name__}",
        subject="source",
    )


def find_duplicates_distributed(
    source: Any, *, column: str = "text", config: DedupConfig | None = None, client: Any
) -> DedupResult:
    """:func:`dedup.find_duplicates` with its stages on the workers of ``client``."""
    config = config or DedupConfig()
    plan = RunPlan.create(config)
    wall = time.perf_counter()
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    parts = _parts(source, workers)
    tag = uuid.uuid4().hex[:8]
    # hash=False: dask's token of an Arrow table does not tell slices of one table apart.
    handles = [
        client.scatter(p, hash=False) if isinstance(p, (pa.Table, pa.RecordBatch)) else p for p in parts
    ]
    sketches = [
        client.submit(_sketch_task, h, column, plan, key=f"dedup-sketch-{tag}-{k}", pure=False)
        for k, h in enumerate(handles)
    ]
    meta = client.gather(
        [client.submit(_meta_task, s, key=f"dedup-meta-{tag}-{k}") for k, s in enumerate(sketches)]
    )
    cpu = {"load": sum(m[2] for m in meta), "sketch": sum(m[3] for m in meta)}
    sizes = [len(m[0]) for m in meta]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    status = np.concatenate([m[0] for m in meta]) if meta else np.zeros(0, np.uint8)
    keys = np.concatenate([m[1] for m in meta]) if meta else np.zeros((0, 2), np.uint64)
    del meta
    rep = exact_representatives(keys, exact_eligible(status))
    stats: dict[str, Any] = {"records": len(status), "parts": len(parts), "workers": workers}
    edges = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    if config.method == "minhash":
        edges = _near(client, plan, column, handles, sketches, status, rep, bounds, workers, tag, cpu, stats)
    del sketches, handles  # releasing the futures frees the workers' memory
    result = finish(status, rep, edges, plan, stats)
    result.stats["worker_cpu_seconds"] = {k: round(v, 4) for k, v in cpu.items()}
    result.stats["wall_seconds"] = round(time.perf_counter() - wall, 4)
    return result


def _near(client, plan, column, handles, sketches, status, rep, bounds, workers, tag, cpu, stats):
    config = plan.config
    active = near_active(status, rep)
    reducers = max(1, min(len(handles), 2 * workers))
    splits = [
        client.submit(
            _split_task,
            s,
            active[bounds[k] : bounds[k + 1]],
            int(bounds[k]),
            reducers,
            key=f"dedup-split-{tag}-{k}",
        )
        for k, s in enumerate(sketches)
    ]
    reduced = []
    for r in range(reducers):
        pieces = [client.submit(_piece, s, r, key=f"dedup-piece-{tag}-{k}-{r}") for k, s in enumerate(splits)]
        reduced.append(
            client.submit(_reduce_task, pieces, config.max_bucket_neighbors, key=f"dedup-reduce-{tag}-{r}")
        )
    out = client.gather(reduced)
    cpu["split"] = sum(client.gather([client.submit(operator.itemgetter(1), s) for s in splits]))
    cpu["reduce"] = sum(o[1] for o in out)
    del splits, reduced
    pairs = np.unique(np.concatenate([o[0] for o in out])) if out else np.zeros(0, np.uint64)
    stats.update(compared_records=int(active.sum()), candidate_pairs=len(pairs))
    i, j = decode_pairs(pairs)
    wanted = np.unique(np.concatenate([i, j]))
    sets = sigs = None
    lo_hi = np.searchsorted(wanted, bounds)
    if config.verify == "exact":
        futures = [
            client.submit(
                _sets_task,
                handles[k],
                column,
                wanted[lo_hi[k] : lo_hi[k + 1]] - bounds[k],
                int(bounds[k]),
                plan,
                key=f"dedup-sets-{tag}-{k}",
                pure=False,
            )
            for k in range(len(handles))
            if lo_hi[k + 1] > lo_hi[k]
        ]
        got = client.gather(futures)
        cpu["shingle_sets"] = sum(g[1] for g in got)
        sets = [g[0] for g in got]
    elif config.verify == "signature":
        futures = [
            client.submit(
                _sigs_task,
                sketches[k],
                wanted[lo_hi[k] : lo_hi[k + 1]] - bounds[k],
                key=f"dedup-sigs-{tag}-{k}",
            )
            for k in range(len(handles))
            if lo_hi[k + 1] > lo_hi[k]
        ]
        got = client.gather(futures)
        sigs = np.concatenate(got, axis=1) if got else None
    return verify_pairs(pairs, plan, sets, sigs, wanted)
