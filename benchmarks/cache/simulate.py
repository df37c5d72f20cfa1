"""Replay read traces through simulated caches and print the policy table.

    python -m benchmarks.cache.simulate                 # both tables, JSON + PNG in benchmarks/cache/results
    python -m benchmarks.cache.simulate --quick         # smaller traces, for a smoke run
    python -m benchmarks.cache.simulate --trace-file t.json --capacity 300   # replay a saved trace

The epoch table reports hits over epochs 2.. (the first epoch is all misses for
everyone); the Zipf table reports hits over the whole trace, as in issue 3.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.cache import baselines as b
from benchmarks.cache import traces
from cachetier.policy import FrequencyHintPolicy, get_policy

RESULTS = Path(__file__).parent / "results"


def caches(capacity: int, keys: list[int]) -> dict[str, Callable[[], b.SimCache]]:
    """Every policy of the table, by name, as factories."""
    return {
        "lru": lambda: b.LruCache(capacity),
        "lfu": lambda: b.LfuCache(capacity),
        "no-eviction": lambda: b.NoEvictionCache(capacity),
        "arc": lambda: b.ArcCache(capacity),
        "s3-fifo": lambda: b.S3FifoCache(capacity),
        "w-tinylfu": lambda: b.WTinyLfuCache(capacity),
        "ours (no hints)": lambda: b.PolicyCache(capacity, FrequencyHintPolicy(), epochs_ahead=0),
        "ours (hints: this epoch)": lambda: b.PolicyCache(capacity, FrequencyHintPolicy(), epochs_ahead=1),
        "ours (hints: 2 epochs)": lambda: b.PolicyCache(capacity, FrequencyHintPolicy(), epochs_ahead=2),
        "lru (cachetier policy)": lambda: b.PolicyCache(capacity, get_policy("lru"), epochs_ahead=0),
        "belady": lambda: b.BeladyCache(capacity, keys),
    }


def replay(trace: traces.Trace, cache: b.SimCache, *, from_epoch: int = 0) -> float:
    """Return the hit ratio of ``cache`` on ``trace`` over reads of epochs >= ``from_epoch``."""
    positions = [0] * trace.jobs
    epochs = [-1] * trace.jobs
    hits = total = 0
    for (job, key), epoch in zip(trace.reads, trace.epoch_of_read):
        if epochs[job] != epoch:
            epochs[job], positions[job] = epoch, 0
            cache.start_epoch(job, trace.plans[job][epoch:])
        hit = cache.access(job, key, positions[job])
        positions[job] += 1
        if epoch >= from_epoch:
            hits += hit
            total += 1
    return hits / total


def table(
    make_trace: Callable[[int], traces.Trace],
    capacity: int,
    seeds: list[int],
    from_epoch: int,
    only: list[str] | None = None,
) -> dict[str, dict]:
    """Median (and every value) of each policy's hit ratio over ``seeds``."""
    out: dict[str, dict] = {}
    for seed in seeds:
        trace = make_trace(seed)
        keys = [k for _, k in trace.reads]
        for name, factory in caches(capacity, keys).items():
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            ratio = replay(trace, factory(), from_epoch=from_epoch)
            row = out.setdefault(name, {"runs": [], "seconds": 0.0})
            row["runs"].append(ratio)
            row["seconds"] += time.perf_counter() - t0
    for row in out.values():
        row["median"] = statistics.median(row["runs"])
    return out


ISSUE_EPOCH = {"lru": 4.8, "arc": 10.9, "s3-fifo": 14.5, "w-tinylfu": 9.9, "ceiling C/N": 30.0}
ISSUE_ZIPF = {
    "w-tinylfu": 56.0,
    "lfu": 53.7,
    "no-eviction": 46.3,
    "furthest next use (hints: this epoch)": 65.3,
    "belady": 69.4,
}


def plot(results: dict, path: Path) -> None:
    """Bar charts of both tables, ours highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, (name, res) in zip(axes, (("epoch", results["epoch"]), ("zipf", results["zipf"]))):
        rows = res["policies"]
        names = list(rows)
        values = [100 * rows[n]["median"] for n in names]
        colors = ["tab:green" if n.startswith("ours") else "tab:gray" for n in names]
        ax.barh(names, values, color=colors)
        for y, v in enumerate(values):
            ax.text(v + 0.5, y, f"{v:.1f}", va="center", fontsize=8)
        if name == "epoch":
            ax.axvline(100 * res["ceiling"], color="tab:red", ls="--")
        title = res["title"] + ("\n(dashed: the C/N ceiling)" if name == "epoch" else "")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("hit ratio (%)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small traces, one seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trace-file", help="replay this saved trace instead of generating")
    parser.add_argument("--capacity", type=int, help="cache capacity in objects (with --trace-file)")
    parser.add_argument("--save-traces", action="store_true", help="also save the generated traces")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args.trace_file:
        trace = traces.load(args.trace_file)
        res = table(lambda seed: trace, args.capacity, [0], from_epoch=0)
        print(json.dumps({n: round(100 * r["median"], 1) for n, r in res.items()}, indent=1))
        return 0

    seeds = [0] if args.quick else list(range(args.seeds))
    n = 300 if args.quick else 1000
    epochs = 4 if args.quick else 10
    cap = int(0.3 * n)
    results: dict = {}
    epoch_res = table(lambda s: traces.epoch_trace(shards=n, epochs=epochs, seed=s), cap, seeds, from_epoch=1)
    results["epoch"] = {
        "title": f"1 job, {n} shards, {epochs} epochs, cache 30%: hits over epochs 2..{epochs}",
        "params": {"shards": n, "epochs": epochs, "capacity": cap, "seeds": seeds},
        "ceiling": cap / n,
        "issue": ISSUE_EPOCH,
        "policies": epoch_res,
    }
    zipf_kw = {"shards": n, "per_job": int(0.35 * n), "epochs": 5}
    zipf_res = table(lambda s: traces.zipf_jobs_trace(seed=s, **zipf_kw), cap, seeds, from_epoch=0)
    results["zipf"] = {
        "title": f"4 jobs, Zipf 1.0 over {n} shards, {zipf_kw['per_job']} per job, 5 epochs, cache 30%",
        "params": {**zipf_kw, "capacity": cap, "seeds": seeds},
        "issue": ISSUE_ZIPF,
        "policies": zipf_res,
    }
    if args.save_traces:
        traces.save(traces.epoch_trace(shards=n, epochs=epochs, seed=0), out / "trace-epoch-seed0.json")
        traces.save(traces.zipf_jobs_trace(seed=0, **zipf_kw), out / "trace-zipf-seed0.json")
    for key in ("epoch", "zipf"):
        print(f"\n{results[key]['title']}")
        for name, row in results[key]["policies"].items():
            runs = " ".join(f"{100 * r:.1f}" for r in row["runs"])
            print(f"  {name:<24} {100 * row['median']:5.1f}%   (runs: {runs})")
    (out / "policy_table.json").write_text(json.dumps(results, indent=1))
    try:
        plot(results, out / "policy_table.png")
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
