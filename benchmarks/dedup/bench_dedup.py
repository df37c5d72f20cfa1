"""Dedup benchmark: tierdata vs datasketch vs rensa on one generated corpus, in one run.

Run it from the repository root with the benchmark environment
(``bash benchmarks/setup_bench_env.sh`` once)::

    .bench-venv/bin/python -m benchmarks.dedup.bench_dedup run            # 100k docs, 3 repeats
    .bench-venv/bin/python -m benchmarks.dedup.bench_dedup memory         # 1M docs, peak RSS, once
    .bench-venv/bin/python -m benchmarks.dedup.bench_dedup plot           # PNG from the JSON

``run --docs 5000 --repeats 1`` is a quick smoke run. What is measured:

- quality: pair precision/recall/F1 against the exact truth (:mod:`truth`) and clusters
  that merge unrelated documents (:mod:`quality`);
- speed: each method end to end (from the Arrow table to its pairs, shingling included)
  in a fresh process; documents per CPU-second (= per core), process CPU and wall
  seconds, peak RSS; medians of the repeats. The machine is shared, so CPU time is the
  figure to compare, not wall time;
- dask: the same corpus on a LocalCluster of 1 and 2 worker processes (default dask
  malloc settings and ours), parts read from the corpus file on the workers; wall time,
  task CPU per document next to the single process's, and equality of the results;
- memory: 1M documents streamed from an Arrow file; peak RSS and resident bytes per
  document above the process's baseline.

Results go to ``benchmarks/dedup/results.json`` and ``benchmarks/dedup/results.png``;
corpora and truth are cached in ``benchmarks/_work/dedup/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "benchmarks" / "_work" / "dedup"
RESULTS = ROOT / "benchmarks" / "dedup" / "results.json"
PLOT = ROOT / "benchmarks" / "dedup" / "results.png"
SEED = 20240601


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """VmHWM: unlike ru_maxrss, it is not inherited from the parent across exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def corpus_path(docs: int) -> Path:
    return WORK / f"corpus-{docs}-{SEED}.arrow"


def prepare(docs: int) -> None:
    """Generate the corpus file and (up to 200k docs) the exact truth, if missing."""
    from benchmarks.dedup.corpus import generate, write_ipc
    from benchmarks.dedup.truth import exact_truth

    WORK.mkdir(parents=True, exist_ok=True)
    path = corpus_path(docs)
    truth_path = path.with_suffix(".truth.npz")
    if path.exists() and (truth_path.exists() or docs > 200_000):
        return
    start = time.perf_counter()
    if docs > 200_000:  # the memory run: generated in slices, no truth needed
        _write_large(docs, path)
    else:
        corpus = generate(docs, seed=SEED)
        write_ipc(corpus, str(path))
        truth = exact_truth(corpus, 0.8)
        np.savez(
            truth_path,
            left=truth.left,
            right=truth.right,
            jaccard=truth.jaccard,
            checked_jaccard=truth.checked_jaccard,
            family=corpus.family,
        )
    print(f"prepared {path.name} in {time.perf_counter() - start:.1f}s", file=sys.stderr)


def _write_large(docs: int, path: Path, slice_docs: int = 100_000) -> None:
    from benchmarks.dedup.corpus import generate

    schema = pa.schema([("id", pa.int64()), ("text", pa.large_string())])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for k, lo in enumerate(range(0, docs, slice_docs)):
            corpus = generate(min(slice_docs, docs - lo), seed=SEED + k)
            table = corpus.table()
            table = table.set_column(0, "id", pa.array(np.arange(lo, lo + table.num_rows), pa.int64()))
            for batch in table.to_batches(max_chunksize=10_000):
                writer.write_batch(batch)


def _read_table(path: Path) -> pa.Table:
    with pa.OSFile(str(path), "rb") as f:
        return pa.ipc.open_file(f).read_all()


# ------------------------------------------------------------------ children (fresh processes)


def child_method(method: str, docs: int, out: Path) -> None:
    """One method, end to end, in this (fresh) process."""
    from benchmarks.dedup.peers import run_method

    table = _read_table(corpus_path(docs))
    import dedup  # noqa: F401  (imports outside the timed region, as for the peers)

    if method == "datasketch":
        import datasketch  # noqa: F401
    elif method == "rensa":
        import rensa  # noqa: F401
    baseline = _rss()
    wall, cpu = time.perf_counter(), time.process_time()
    pairs, extra = run_method(method, table)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    info: dict[str, Any] = {
        "method": method,
        "docs": docs,
        "cpu_s": cpu,
        "wall_s": wall,
        "peak_rss": _peak_rss(),
        "baseline_rss": baseline,
    }
    if method == "tierdata":
        info["stats"] = extra.stats
        info["params"] = {k: extra.params[k] for k in ("bands", "rows", "threshold", "num_perm", "verify")}
        np.save(out.with_suffix(".removed.npy"), extra.removed_indices())
        np.save(out.with_suffix(".roots.npy"), _roots(extra))
    else:
        info["params"] = extra
    np.save(out.with_suffix(".pairs.npy"), pairs)
    out.write_text(json.dumps(info))


def _roots(result) -> np.ndarray:
    roots = np.arange(result.records)
    roots[result.removed.column("record").to_numpy()] = result.removed.column("representative").to_numpy()
    return roots


def _part(path: str, lo: int, hi: int) -> pa.Table:
    """A row range of the corpus file, read on the worker (as a shard would be)."""
    source = pa.memory_map(path)  # zero-copy: the slice keeps the mapping alive
    return pa.ipc.open_file(source).read_all().slice(lo, hi - lo)


def child_dask(workers: int, malloc: str, docs: int, repeats: int, out: Path) -> None:
    """LocalCluster runs (``malloc``: ``dask`` defaults or ``tuned``)."""
    import functools

    from distributed import Client, LocalCluster

    from dedup import find_duplicates, local_cluster

    path = str(corpus_path(docs))
    per_part = 10_000
    parts = [functools.partial(_part, path, lo, min(lo + per_part, docs)) for lo in range(0, docs, per_part)]
    if malloc == "tuned":
        cluster = local_cluster(workers)
    else:
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )
    runs = []
    with cluster, Client(cluster) as client:
        for _ in range(repeats):
            wall = time.perf_counter()
            result = find_duplicates(parts, client=client)
            runs.append(
                {"wall_s": time.perf_counter() - wall, "worker_cpu_s": result.stats["worker_cpu_seconds"]}
            )
        np.save(out.with_suffix(".removed.npy"), result.removed_indices())
    out.write_text(json.dumps({"workers": workers, "malloc": malloc, "docs": docs, "runs": runs}))


def _spawn(args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.dedup.bench_dedup", "_child", *args, str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(out.read_text())


# ------------------------------------------------------------------ the run


def run(docs: int, repeats: int, methods: list[str], with_dask: bool) -> dict[str, Any]:
    """The side-by-side run; merges its results into results.json."""
    from benchmarks.dedup.quality import cluster_scores, pair_scores

    prepare(docs)
    truth = np.load(corpus_path(docs).with_suffix(".truth.npz"))
    truth_codes = (truth["left"].astype(np.uint64) << np.uint64(32)) | truth["right"].astype(np.uint64)
    out_dir = WORK / f"run-{docs}"
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {
        "docs": docs,
        "repeats": repeats,
        "true_pairs": len(truth_codes),
        "methods": {},
    }
    for rep in range(repeats):  # interleaved, so load changes hit every method alike
        for method in methods:
            info = _spawn(["method", method, str(docs)], out_dir / f"{method}-{rep}.json")
            section["methods"].setdefault(method, {"runs": []})["runs"].append(info)
            speed = docs / info["cpu_s"]
            print(
                f"{method:10s} rep {rep}: {speed:9.0f} docs/s per core, cpu {info['cpu_s']:.2f}s "
                f"wall {info['wall_s']:.2f}s peak {info['peak_rss'] / 2**20:.0f} MiB",
                file=sys.stderr,
            )
    for method, entry in section["methods"].items():
        runs = entry["runs"]
        pairs = np.load(out_dir / f"{method}-0.pairs.npy")
        roots = np.load(out_dir / f"{method}-0.roots.npy") if method == "tierdata" else None
        entry["median"] = {
            "docs_per_cpu_s": round(statistics.median(docs / r["cpu_s"] for r in runs)),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in runs), 3),
            "wall_s": round(statistics.median(r["wall_s"] for r in runs), 3),
            "peak_rss_mib": round(statistics.median(r["peak_rss"] for r in runs) / 2**20, 1),
            "rss_above_input_mib": round(
                statistics.median(r["peak_rss"] - r["baseline_rss"] for r in runs) / 2**20, 1
            ),
        }
        entry["params"] = runs[0]["params"]
        entry["quality"] = pair_scores(pairs, truth_codes)
        entry["quality"].update(cluster_scores(docs, pairs, truth["family"], roots))
        if method == "tierdata":
            stages = runs[0]["stats"]["seconds"]
            entry["stage_cpu_s"] = {
                k: round(statistics.median(r["stats"]["seconds"][k]["cpu"] for r in runs), 4) for k in stages
            }
            entry["candidate_pairs"] = runs[0]["stats"]["candidate_pairs"]
        for r in runs:
            r.pop("stats", None)
    if "tierdata" in section["methods"] and with_dask:
        section["dask"] = _dask_section(docs, repeats, out_dir, section["methods"]["tierdata"])
    _merge({"side_by_side": section, "environment": _environment()})
    return section


def _dask_section(docs: int, repeats: int, out_dir: Path, single: dict[str, Any]) -> dict[str, Any]:
    single_removed = np.load(out_dir / "tierdata-0.removed.npy")
    single_sketch = single["stage_cpu_s"]["sketch"]
    single_cpu = single["median"]["cpu_s"]
    rows = []
    for malloc in ("dask", "tuned"):
        for workers in (1, 2):
            info = _spawn(
                ["dask", str(workers), malloc, str(docs), str(repeats)],
                out_dir / f"dask-{workers}-{malloc}.json",
            )
            removed = np.load(out_dir / f"dask-{workers}-{malloc}.removed.npy")
            sketch = statistics.median(r["worker_cpu_s"]["sketch"] for r in info["runs"])
            total = statistics.median(
                sum(v for k, v in r["worker_cpu_s"].items() if k != "load") for r in info["runs"]
            )
            wall = statistics.median(r["wall_s"] for r in info["runs"])
            rows.append(
                {
                    "workers": workers,
                    "malloc": malloc,
                    "wall_s": round(wall, 3),
                    "sketch_cpu_us_per_doc": round(sketch / docs * 1e6, 2),
                    "single_sketch_cpu_us_per_doc": round(single_sketch / docs * 1e6, 2),
                    "sketch_cpu_ratio_to_single": round(sketch / single_sketch, 3),
                    "worker_cpu_us_per_doc": round(total / docs * 1e6, 2),
                    "single_cpu_us_per_doc": round(single_cpu / docs * 1e6, 2),
                    "same_removed_set_as_single": bool(np.array_equal(removed, single_removed)),
                }
            )
            print(
                f"dask {workers} worker(s), {malloc:5s}: wall {wall:.2f}s, sketch CPU "
                f"x{sketch / single_sketch:.2f} of single, equal={rows[-1]['same_removed_set_as_single']}",
                file=sys.stderr,
            )
    return {"single_wall_s": single["median"]["wall_s"], "rows": rows}


def memory(docs: int) -> dict[str, Any]:
    """Peak RSS of one tierdata run over ``docs`` documents streamed from a file."""
    prepare(docs)
    out = WORK / f"memory-{docs}.json"
    info = _spawn(["memory", str(docs)], out)
    _merge({"memory": info})
    print(json.dumps(info, indent=1), file=sys.stderr)
    return info


def child_memory(docs: int, out: Path) -> None:
    from dedup import find_duplicates

    path = str(corpus_path(docs))

    def batches():
        with pa.OSFile(path, "rb") as f:  # read, not mapped: only the current batch is resident
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    baseline = _rss()
    wall, cpu = time.perf_counter(), time.process_time()
    result = find_duplicates(batches)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    peak = _peak_rss()
    info = {
        "docs": docs,
        "peak_rss_mib": round(peak / 2**20, 1),
        "baseline_rss_mib": round(baseline / 2**20, 1),
        "resident_bytes_per_doc": round((peak - baseline) / docs, 1),
        "signature_bytes_per_doc": 128 * 4,
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "docs_per_cpu_s": round(docs / cpu),
        "removed_records": result.removed_records,
        "candidate_pairs": result.stats.get("candidate_pairs"),
    }
    out.write_text(json.dumps(info))


def _environment() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for name in ("numpy", "pyarrow", "datasketch", "rensa", "dask", "distributed"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "versions": versions,
    }


def _merge(update: dict[str, Any]) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.update(update)
    RESULTS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def plot() -> None:
    """results.png from results.json."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(RESULTS.read_text())
    sbs = data["side_by_side"]
    names = list(sbs["methods"])
    med = [sbs["methods"][n]["median"] for n in names]
    qual = [sbs["methods"][n]["quality"] for n in names]
    colors = ["#1f77b4" if n == "tierdata" else "#999999" for n in names]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    ax = axes[0]
    ax.bar(names, [m["docs_per_cpu_s"] for m in med], color=colors)
    ax.axhline(20_000, color="red", ls="--", lw=1, label="target 20,000")
    ax.set_title(f"Speed, end to end ({sbs['docs']:,} docs)")
    ax.set_ylabel("documents / CPU-second")
    ax.legend()
    ax = axes[1]
    x = np.arange(len(names))
    ax.bar(x - 0.2, [q["precision"] for q in qual], 0.4, label="precision")
    ax.bar(x + 0.2, [q["recall"] for q in qual], 0.4, label="recall")
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.05)
    ax.set_title("Pair quality at Jaccard 0.8")
    ax.legend(loc="lower right")
    ax = axes[2]
    ax.bar(names, [m["peak_rss_mib"] for m in med], color=colors)
    ax.set_title("Peak RSS (corpus included)")
    ax.set_ylabel("MiB")
    ax = axes[3]
    if "dask" in sbs:
        rows = sbs["dask"]["rows"]
        labels = ["single"] + [f"{r['workers']}w {r['malloc']}" for r in rows]
        walls = [sbs["dask"]["single_wall_s"]] + [r["wall_s"] for r in rows]
        ax.bar(
            labels,
            walls,
            color=["#1f77b4"] + ["#ff7f0e" if r["malloc"] == "tuned" else "#bbbbbb" for r in rows],
        )
        for k, r in enumerate(rows, start=1):
            ax.text(
                k,
                walls[k],
                f"CPU x{r['sketch_cpu_ratio_to_single']:.2f}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title("dask LocalCluster: wall time")
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def main() -> None:
    """CLI."""
    parser = argparse.ArgumentParser(description="tierdata dedup benchmark")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--docs", type=int, default=100_000)
    p = sub.add_parser("run")
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", default="tierdata,datasketch,rensa")
    p.add_argument("--no-dask", action="store_true")
    p = sub.add_parser("memory")
    p.add_argument("--docs", type=int, default=1_000_000)
    sub.add_parser("plot")
    p = sub.add_parser("_child")
    p.add_argument("args", nargs="+")
    args = parser.parse_args()
    if args.cmd == "prepare":
        prepare(args.docs)
    elif args.cmd == "run":
        run(args.docs, args.repeats, args.methods.split(","), not args.no_dask)
        plot()
    elif args.cmd == "memory":
        memory(args.docs)
    elif args.cmd == "plot":
        plot()
    else:
        kind, *rest = args.args
        out = Path(rest[-1])
        if kind == "method":
            child_method(rest[0], int(rest[1]), out)
        elif kind == "dask":
            child_dask(int(rest[0]), rest[1], int(rest[2]), int(rest[3]), out)
        elif kind == "memory":
            child_memory(int(rest[0]), out)


if __name__ == "__main__":
    main()
