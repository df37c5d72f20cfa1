"""Issue 3's acceptance benchmarks, run on the real tiers (LMDB, tmpfs, S3 server).

    python -m benchmarks.cache.acceptance all             # full sizes
    python -m benchmarks.cache.acceptance all --quick     # small sizes, a smoke run
    python -m benchmarks.cache.acceptance budgets epochs  # some of: budgets epochs zipf warm cold

1. budgets: RAM (tmpfs blocks) and SSD (LMDB pages in use) sampled every few ms while
   3 processes read at random; the LMDB file after 20 evict/refill cycles.
2. epochs: one job, data 3x the SSD budget, 5 shuffled epochs: byte hit ratio per epoch
   for our policy (without and with hints) and LRU, against the C/N ceiling.
3. zipf: the simulator's 4-job Zipf trace replayed through one real TieredStore.
4. warm: a second epoch served by the tiers against reading the same shards from the S3
   server; a RAM hit's allocations.
5. cold: a cold LMDB read (page cache dropped for the file) against a plain file read.

Timings are medians of 3 runs. The machine is a shared 2-core VM: other jobs run beside
these, so absolute figures move between runs; ratios measured within one run hold better.
Results go to ``results/acceptance.json`` and ``results/acceptance.png``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cache import traces
from cachetier.config import CacheConfig
from cachetier.lmdbtier import LmdbTier, SharedEnv
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore, object_key
from cachetier.tiered import TieredStore

HERE = Path(__file__).parent
RESULTS = HERE / "results"
WORK = HERE.parent / "_work" / "cache"
MiB = 1 << 20


def median_of(runs: int, fn: Callable[[], float]) -> tuple[float, list[float]]:
    """Run ``fn`` ``runs`` times; return the median and every value."""
    values = [fn() for _ in range(runs)]
    return statistics.median(values), values


class Workspace:
    """A fresh folder for one benchmark (repo, cache) and a RAM folder on tmpfs."""

    def __init__(self, name: str):
        self.root = WORK / f"{name}-{uuid.uuid4().hex[:8]}"
        self.root.mkdir(parents=True)
        shm = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else self.root
        self.ram = shm / f"tierdata-bench-{uuid.uuid4().hex[:8]}"
        self.objects = ObjectStore(LocalStore(self.root / "repo"))

    def config(self, name: str = "cache", **fields: Any) -> CacheConfig:
        ram = self.ram.with_name(f"{self.ram.name}-{name}")
        return CacheConfig(dir=self.root / name, ram_dir=ram, prefetch_depth=0, **fields)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        for path in self.ram.parent.glob(f"{self.ram.name}*"):
            shutil.rmtree(path, ignore_errors=True)


def put_random(objects: ObjectStore, sizes: list[int], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [objects.put(rng.randbytes(n)) for n in sizes]


# -- 1. budgets ---------------------------------------------------------------------------


def _random_reader(repo: str, config: CacheConfig, ids: list[str], seed: int, reads: int) -> None:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(ids))]
    with TieredStore(ObjectStore(LocalStore(repo)), config) as store:
        for oid in rng.choices(ids, weights, k=reads):
            store.read(oid)


def bench_budgets(quick: bool) -> dict[str, Any]:
    ws = Workspace("budgets")
    try:
        n, reads = (40, 150) if quick else (120, 400)
        rng = random.Random(0)
        ids = put_random(ws.objects, [rng.randrange(64 << 10, MiB) for _ in range(n)], seed=1)
        config = ws.config(
            ram_bytes=(2 if quick else 8) * MiB, ssd_bytes=(4 if quick else 16) * MiB, policy="lru"
        )
        monitor = TieredStore(None, config)
        peaks = {"ram": 0, "ssd": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                values = monitor.ram.values
                if values.exists():
                    ram = 0
                    for p in list(values.iterdir()):
                        try:
                            ram += p.stat().st_blocks * 512
                        except FileNotFoundError:
                            pass
                    peaks["ram"] = max(peaks["ram"], ram)
                with monitor.ssd.env.read() as txn:
                    peaks["ssd"] = max(peaks["ssd"], monitor.ssd.env.used_bytes(txn))
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        ctx = multiprocessing.get_context("fork")
        procs = [
            ctx.Process(target=_random_reader, args=(str(ws.root / "repo"), config, ids, s, reads))
            for s in range(3)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        stop.set()
        sampler.join()
        file_sizes = _evict_refill_cycles(ws, config, ids, monitor)
        monitor.close()
        return {
            "ram_budget": config.ram_bytes,
            "ssd_budget": config.ssd_bytes,
            "ram_peak": peaks["ram"],
            "ssd_peak_pages_in_use": peaks["ssd"],
            "ram_peak_ratio": peaks["ram"] / config.ram_bytes,
            "ssd_peak_ratio": peaks["ssd"] / config.ssd_bytes,
            "lmdb_file_after_cycles": file_sizes,
            "lmdb_file_ratio_after_20_cycles": file_sizes[-1] / config.ssd_bytes,
            "readers": 3,
            "reads_per_reader": reads,
            "objects": n,
        }
    finally:
        ws.close()


def _evict_refill_cycles(
    ws: Workspace, config: CacheConfig, ids: list[str], monitor: TieredStore
) -> list[int]:
    """20 times: evict half the SSD tier, refill it by reading other objects (LRU: churn)."""
    rng = random.Random(7)
    sizes = []
    with TieredStore(ws.objects, config.replace(ram_bytes=0)) as store:
        for _ in range(20):
            held = [r.key for r in store.ssd.residents()]
            store.evict(rng.sample(held, len(held) // 2), tier="ssd")
            for oid in rng.sample(ids, len(ids) // 2):
                store.read(oid)
            sizes.append(store.ssd.env.file_bytes())
    return sizes


# -- 2. one job, epochs -------------------------------------------------------------------


def bench_epochs(quick: bool) -> dict[str, Any]:
    ws = Workspace("epochs")
    try:
        n, mean = (60, 256 << 10) if quick else (300, MiB)
        rng = random.Random(2)
        sizes = [int(mean * rng.uniform(0.75, 1.25)) for _ in range(n)]
        ids = put_random(ws.objects, sizes, seed=3)
        size_of = dict(zip(ids, sizes))
        data = sum(sizes)
        budget = data // 3
        plans = [random.Random(100 + e).sample(ids, n) for e in range(6)]
        out: dict[str, Any] = {
            "shards": n,
            "data_bytes": data,
            "ssd_budget": budget,
            "ceiling": budget / data,
        }
        for label, policy, hints in (
            ("ours", "freq-hint", False),
            ("ours+hints", "freq-hint", True),
            ("lru", "lru", False),
        ):
            config = ws.config(label, ram_bytes=0, ssd_bytes=budget, policy=policy)
            per_epoch = []
            with TieredStore(ws.objects, config) as store:
                for e in range(5):
                    if hints:
                        store.announce(plans[e] + plans[e + 1], reader="job")
                    fetched = store.counters.store.bytes_fetched
                    for oid in plans[e]:
                        store.read(oid, reader="job")
                    per_epoch.append(1 - (store.counters.store.bytes_fetched - fetched) / data)
                ssd = store.counters.ssd
            later = statistics.fmean(per_epoch[1:])
            out[label] = {
                "byte_hit_ratio_per_epoch": per_epoch,
                "epochs_2_to_5": later,
                "of_ceiling": later / (budget / data),
                "evictions": ssd.evictions,
                "map_full": ssd.map_full,
                "resident_bytes_fraction": _resident_fraction(store, data),
            }
        out["shard_size_mean"] = statistics.fmean(size_of.values())
        return out
    finally:
        ws.close()


def _resident_fraction(store: TieredStore, data: int) -> float:
    return sum(info.size for info in store.ssd.list()) / data


# -- 3. four jobs, Zipf -------------------------------------------------------------------


def bench_zipf(quick: bool) -> dict[str, Any]:
    ws = Workspace("zipf")
    try:
        shards, per_job, size = (300, 105, 64 << 10) if quick else (1000, 350, 512 << 10)
        trace = traces.zipf_jobs_trace(shards=shards, per_job=per_job, epochs=5, seed=0)
        rng = random.Random(4)
        used = sorted({k for _, k in trace.reads})
        ids = {k: ws.objects.put(rng.randbytes(size - 7) + k.to_bytes(7, "little")) for k in used}
        budget = int(0.3 * shards * size)
        out: dict[str, Any] = {
            "shards": shards,
            "shard_bytes": size,
            "ssd_budget": budget,
            "reads": len(trace.reads),
        }
        for label, policy, hints in (
            ("ours+hints", "freq-hint", True),
            ("ours", "freq-hint", False),
            ("lru", "lru", False),
        ):
            config = ws.config(label, ram_bytes=0, ssd_bytes=budget, policy=policy)
            epochs = [-1] * trace.jobs
            started = time.perf_counter()
            with TieredStore(ws.objects, config) as store:
                for (job, key), epoch in zip(trace.reads, trace.epoch_of_read):
                    if hints and epochs[job] != epoch:
                        plan = [ids[k] for p in trace.plans[job][epoch : epoch + 2] for k in p]
                        store.announce(plan, reader=f"job-{job}")
                    epochs[job] = epoch
                    store.read(ids[key], reader=f"job-{job}")
                fetches = store.counters.store.fetches
                ssd = store.counters.ssd
            out[label] = {
                "hit_ratio": 1 - fetches / len(trace.reads),
                "seconds": time.perf_counter() - started,
                "evictions": ssd.evictions,
                "map_full": ssd.map_full,
            }
        return out
    finally:
        ws.close()


# -- 4. warm epoch against the S3 server ----------------------------------------------------


def bench_warm(quick: bool) -> dict[str, Any]:
    from tests.s3server import start_s3_server

    server = start_s3_server()
    ws = Workspace("warm")
    try:
        count, size = (8, 4 * MiB) if quick else (32, 4 * MiB)
        s3 = server.endpoint.store(server.endpoint.unique_url())
        objects = ObjectStore(s3)
        ids = put_random(objects, [size] * count, seed=5)

        def direct() -> float:
            started = time.perf_counter()
            for oid in ids:
                s3.get(object_key(oid))
            return time.perf_counter() - started

        def verified() -> float:
            started = time.perf_counter()
            for oid in ids:
                objects.get(oid)
            return time.perf_counter() - started

        out: dict[str, Any] = {"shards": count, "shard_bytes": size, "server": server.endpoint.kind}
        out["direct_s3_epoch_s"], out["direct_runs"] = median_of(3, direct)
        out["direct_s3_verified_epoch_s"], _ = median_of(3, verified)
        layouts = {"ram_half_ssd_all": (count // 2) * size + MiB, "ram_all": count * size + 2 * MiB}
        for label, ram_bytes in layouts.items():
            config = ws.config(label, ram_bytes=ram_bytes, ssd_bytes=2 * count * size)
            with TieredStore(objects, config) as store:
                started = time.perf_counter()
                for oid in ids:
                    store.read(oid)
                cold = time.perf_counter() - started

                def warm(store: TieredStore = store) -> float:
                    started = time.perf_counter()
                    for oid in ids:
                        store.read(oid)
                    return time.perf_counter() - started

                warm_s, warm_runs = median_of(3, warm)
                out[label] = {
                    "ram_bytes": ram_bytes,
                    "cold_epoch_s": cold,
                    "warm_epoch_s": warm_s,
                    "warm_runs": warm_runs,
                    "speedup": out["direct_s3_epoch_s"] / warm_s,
                    "hits_by_tier": {t: store.stats()["tiers"][t]["hits"] for t in ("ram", "ssd")},
                }
                if label == "ram_all":
                    out.update(_ram_hit_allocations(store, ids))
        s3.close()
        return out
    finally:
        ws.close()
        server.stop()


def _ram_hit_allocations(store: TieredStore, ids: list[str]) -> dict[str, Any]:
    oid = next(o for o in ids if store.contains(o)[:1] == ["ram"])
    tracemalloc.start()
    view = store.read(oid)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "ram_hit_peak_alloc_bytes": peak,
        "ram_hit_view_of": type(view.obj).__name__,
        "ram_hit_shard_bytes": view.nbytes,
    }


# -- 5. cold LMDB read against a plain file -------------------------------------------------


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_cold(quick: bool) -> dict[str, Any]:
    ws = Workspace("cold")
    try:
        count, size = (16, 4 * MiB) if quick else (64, 4 * MiB)
        rng = random.Random(6)
        values = {f"v{i}": rng.randbytes(size) for i in range(count)}
        plain = ws.root / "plain"
        plain.mkdir()
        for key, value in values.items():
            (plain / key).write_bytes(value)
        budget = 2 * count * size
        tier = LmdbTier(SharedEnv(ws.root / "lmdb", map_size=int(budget * 1.1), budget=budget), budget=budget)
        for key, value in values.items():
            tier.put(key, value)
        tier.close()
        total = count * size

        def lmdb_read() -> float:
            _drop(ws.root / "lmdb" / "data.mdb")
            t = LmdbTier(
                SharedEnv(ws.root / "lmdb", map_size=int(budget * 1.1), budget=budget), budget=budget
            )
            started = time.perf_counter()
            for key in values:
                t.read(key, bytes)
            elapsed = time.perf_counter() - started
            t.close()
            return total / elapsed / MiB

        def file_read() -> float:
            for key in values:
                _drop(plain / key)
            started = time.perf_counter()
            for key in values:
                (plain / key).read_bytes()
            return total / (time.perf_counter() - started) / MiB

        lmdb_runs, file_runs = [], []
        for _ in range(3):  # interleaved, so both see the same background load
            lmdb_runs.append(lmdb_read())
            file_runs.append(file_read())
        lmdb_mbs, file_mbs = statistics.median(lmdb_runs), statistics.median(file_runs)
        return {
            "values": count,
            "value_bytes": size,
            "lmdb_cold_MiB_s": lmdb_mbs,
            "file_cold_MiB_s": file_mbs,
            "ratio": lmdb_mbs / file_mbs,
            "lmdb_runs": lmdb_runs,
            "file_runs": file_runs,
        }
    finally:
        ws.close()


# -- report -------------------------------------------------------------------------------

BENCHES = {
    "budgets": bench_budgets,
    "epochs": bench_epochs,
    "zipf": bench_zipf,
    "warm": bench_warm,
    "cold": bench_cold,
}


def verdicts(results: dict[str, Any]) -> dict[str, bool]:
    """Each acceptance criterion measured here, true when met."""
    out = {}
    if "budgets" in results:
        b = results["budgets"]
        out["1 budgets hold"] = b["ram_peak_ratio"] <= 1 and b["ssd_peak_ratio"] <= 1
        out["1 LMDB file <= 1.1x budget after 20 cycles"] = b["lmdb_file_ratio_after_20_cycles"] <= 1.1
    if "epochs" in results:
        out["2 epochs 2-5 >= 98% of C/N"] = results["epochs"]["ours"]["of_ceiling"] >= 0.98
    if "zipf" in results:
        out["3 four jobs Zipf >= 65%"] = results["zipf"]["ours+hints"]["hit_ratio"] >= 0.65
    if "warm" in results:
        w = results["warm"]
        out["4 warm epoch >= 10x faster than S3 (RAM half, SSD all)"] = w["ram_half_ssd_all"]["speedup"] >= 10
        out["4 warm epoch >= 10x faster than S3 (RAM all)"] = w["ram_all"]["speedup"] >= 10
        out["4 RAM hit copies nothing"] = (
            w["ram_hit_view_of"] == "mmap" and w["ram_hit_peak_alloc_bytes"] < 64 << 10
        )
    if "cold" in results:
        out["5 cold LMDB >= 0.8x plain file"] = results["cold"]["ratio"] >= 0.8
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    if "budgets" in results:
        b = results["budgets"]
        axes[0].bar(
            ["RAM peak", "SSD peak", "LMDB file\nafter 20 cycles"],
            [b["ram_peak_ratio"], b["ssd_peak_ratio"], b["lmdb_file_ratio_after_20_cycles"]],
        )
        axes[0].axhline(1.0, color="tab:red", ls="--")
        axes[0].axhline(1.1, color="tab:orange", ls=":")
        axes[0].set_title("1. use / budget")
    if "epochs" in results:
        e = results["epochs"]
        for label in ("ours", "ours+hints", "lru"):
            axes[1].plot(
                range(1, 6), [100 * r for r in e[label]["byte_hit_ratio_per_epoch"]], marker="o", label=label
            )
        axes[1].axhline(100 * e["ceiling"], color="tab:red", ls="--", label="C/N")
        axes[1].set_title("2. one job: SSD byte hits per epoch (%)")
        axes[1].legend()
    if "zipf" in results:
        z = results["zipf"]
        labels = ["ours+hints", "ours", "lru"]
        axes[2].bar(labels, [100 * z[k]["hit_ratio"] for k in labels])
        axes[2].axhline(65, color="tab:red", ls="--")
        axes[2].set_title("3. four jobs, Zipf: hits (%)")
    if "warm" in results or "cold" in results:
        names, values = [], []
        if "warm" in results:
            w = results["warm"]
            total = w["shards"] * w["shard_bytes"] / MiB
            names += ["S3 direct", "warm\nRAM/2+SSD", "warm\nRAM all"]
            values += [
                total / w["direct_s3_epoch_s"],
                total / w["ram_half_ssd_all"]["warm_epoch_s"],
                total / w["ram_all"]["warm_epoch_s"],
            ]
        if "cold" in results:
            names += ["LMDB cold", "file cold"]
            values += [results["cold"]["lmdb_cold_MiB_s"], results["cold"]["file_cold_MiB_s"]]
        axes[3].bar(names, values)
        axes[3].set_yscale("log")
        axes[3].set_title("4/5. read throughput (MiB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", nargs="+", choices=[*BENCHES, "all"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    names = list(BENCHES) if "all" in args.which else args.which
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"quick": args.quick, "machine": f"{os.cpu_count()} CPUs, shared VM"}
    for name in names:
        started = time.perf_counter()
        results[name] = BENCHES[name](args.quick)
        results[name]["bench_seconds"] = time.perf_counter() - started
        print(name, json.dumps(results[name], indent=1, default=str), flush=True)
    results["verdicts"] = verdicts(results)
    print(json.dumps(results["verdicts"], indent=1))
    suffix = "-quick" if args.quick else ""
    (out / f"acceptance{suffix}.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        plot(results, out / f"acceptance{suffix}.png")
    except ImportError:
        print("matplotlib is not installed: no PNG (run with .bench-venv/bin/python)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
