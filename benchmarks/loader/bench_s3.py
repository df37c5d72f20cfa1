"""Cold start from S3: samples/s, first batch, consumer wait and local disk, ours vs the peers.

Starts the test S3 server (``tests/s3server.py``: SeaweedFS on loopback, or the server in
``TIERDATA_TEST_S3_ENDPOINT``), uploads each loader's copy of the benchmark records once
(:mod:`benchmarks.loader.cold`), then measures every run in a fresh process with empty
local folders (cache dirs, ``TMPDIR``, our RAM tier), ``--workers`` DataLoader workers,
batch 64, shuffle off, median of ``--repeats``. Two passes per loader:

- **throughput**: the consumer takes batches as fast as they come: samples/s (delivered
  samples / wall time from constructing the loader), time to the first batch, CPU µs per
  sample (process + workers), peak RSS of the process and its workers.
- **fed**: the consumer "trains" ``--step-ms`` per batch (a sleep, like waiting on a GPU):
  the fraction of wall time it waited on data (making the loader + time blocked in
  ``next()``, over the wall time), and the same after the first batch (prefetch keeping
  the consumer fed once the first shards are in).

Local disk: bytes allocated under the loader's own folders, the peak while it ran and
what is left when the process has exited; plus what any run left elsewhere (new entries
in /dev/shm, ~/.lightning, ~/.cache). Our RAM tier is on tmpfs (memory, not disk) and is
reported apart; our SSD tier holds the fetched (compressed) objects within its budget.

Usage (the peers live in the benchmark venv, see ``benchmarks/setup_bench_env.sh``)::

    .bench-venv/bin/python -m benchmarks.loader.bench_loader s3
    .bench-venv/bin/python -m benchmarks.loader.bench_loader s3 --samples 20000 --repeats 1   # quick

Results go to ``benchmarks/loader/results/loader-s3.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from benchmarks.bytecode import compile_bytecode
from benchmarks.loader.measure import (
    DiskSampler,
    MemorySampler,
    code_state,
    cpu_seconds,
    disk_bytes,
    median,
    pyplot,
    spawn,
    write_results,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORK = ROOT / "benchmarks" / "_work" / "loader"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
_BUCKET = "loader-bench"
# Places where a loader could leave files outside the folders it was given.
_ELSEWHERE = (Path("/dev/shm"), Path.home() / ".lightning", Path.home() / ".cache")


# -- measuring, inside a child process ---------------------------------------------------


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.loader.candidates import batch_len
    from benchmarks.loader.cold import COLD, ColdConfig

    warnings.filterwarnings("ignore")
    cand = COLD[spec["loader"]]
    cfg = ColdConfig(**spec["cfg"])
    step = spec["step_ms"] / 1000
    cand.preload()
    folders = cand.local_dirs(cfg)
    disk = DiskSampler({**folders, "TMPDIR": Path(os.environ["TMPDIR"])})
    memory = MemorySampler()
    gc.collect()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    loader = cand.make(cfg)
    it = iter(loader)
    waited = time.perf_counter() - t0  # building the loader is waiting, too
    first_batch_s = waited_after_first = None
    samples = 0
    while True:
        a = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        b = time.perf_counter()
        waited += b - a
        if first_batch_s is None:
            first_batch_s, waited_after_first = b - t0, 0.0
        else:
            waited_after_first += b - a
        samples += batch_len(batch)
        del batch
        if step:
            time.sleep(step)
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    del it, loader
    gc.collect()
    rss, _pss = memory.reset()
    memory.stop()
    disk.stop()
    assert first_batch_s is not None and waited_after_first is not None
    return {
        "samples": samples,
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "first_batch_s": first_batch_s,
        "cpu_us_per_sample": 1e6 * cpu / max(1, samples),
        "wait_fraction": waited / wall,
        "wait_fraction_after_first": waited_after_first / max(1e-9, wall - first_batch_s),
        "peak_rss_mb": rss / 2**20,
        "disk_peak_bytes": disk.peak,
    }


# -- orchestrating, in the parent ----------------------------------------------------------


def _entries(folders: tuple[Path, ...]) -> set[Path]:
    # Python's multiprocessing semaphores (sem.mp-*) can come from any process on the
    # machine; they cannot be told apart, so they are not counted.
    return {p for f in folders if f.is_dir() for p in f.iterdir() if not p.name.startswith("sem.mp-")}


def _cold_run(name: str, base: dict[str, Any], args: argparse.Namespace, step_ms: float) -> dict[str, Any]:
    """One run in a fresh process with empty local folders; removes them afterwards."""
    run_id = uuid.uuid4().hex[:8]
    local = Path(args.work) / "cold" / f"{name}-{run_id}"
    ram_dir = Path(args.ram_root) / f"tierdata-bench-{run_id}"
    tmp = local / "tmp"
    tmp.mkdir(parents=True)
    cfg = {**base, "local": str(local), "ram_dir": str(ram_dir)}
    before = _entries(_ELSEWHERE)
    try:
        out = spawn(
            "benchmarks.loader.bench_s3",
            {"loader": name, "mode": "cold", "cfg": cfg, "step_ms": step_ms},
            env={"TMPDIR": str(tmp)},
        )
        from benchmarks.loader.cold import COLD, ColdConfig

        folders = COLD[name].local_dirs(ColdConfig(**cfg))
        out["report"] = COLD[name].report(ColdConfig(**cfg))
        out["disk_left_bytes"] = {k: disk_bytes(p) for k, p in {**folders, "TMPDIR": tmp}.items()}
        new = _entries(_ELSEWHERE) - before - set(folders.values())
        out["elsewhere_left"] = {str(p): disk_bytes(p) for p in sorted(new)}
    finally:
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(ram_dir, ignore_errors=True)
    print(json.dumps({"loader": name, "step_ms": step_ms, **out}), file=sys.stderr)
    return out


def _s3_env(endpoint: Any) -> dict[str, str]:
    env = {**endpoint.env(), "S3_ENDPOINT_URL": endpoint.url}  # MDS reads S3_ENDPOINT_URL
    return env


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the server, upload every loader's data, then time cold runs (interleaved)."""
    from benchmarks.loader.cold import COLD
    from benchmarks.loader.data import ensure_dataset
    from tests.s3server import start_s3_server

    work = Path(args.work)
    paths = ensure_dataset(work / f"data-{args.samples}-{args.shards}", args.samples, args.shards)
    names = [n for n in args.loaders.split(",") if COLD[n].available() or _skip(n)]
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
        os.environ.pop(var, None)
    server = start_s3_server()
    try:
        os.environ.update(_s3_env(server.endpoint))
        from benchmarks.loader.cold import minio_client

        minio_client().make_bucket(_BUCKET)
        base = {
            "paths": [str(p) for p in paths],
            "work": str(work),
            "bucket": _BUCKET,
            "num_workers": args.workers,
            "batch_size": args.batch_size,
            "ssd_bytes": args.ssd_bytes,
        }
        uploads = {}
        for name in names:
            from benchmarks.loader.cold import ColdConfig

            t = time.perf_counter()
            staging = work / "cold" / f"upload-{name}"
            COLD[name].upload(ColdConfig(**base, local=str(staging), ram_dir=str(staging / "ram")))
            shutil.rmtree(staging, ignore_errors=True)
            uploads[name] = time.perf_counter() - t
            print(f"uploaded {name} in {uploads[name]:.1f} s", file=sys.stderr)
        fast: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        fed: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for _ in range(args.repeats):
            for name in names:
                fast[name].append(_cold_run(name, base, args, 0.0))
                fed[name].append(_cold_run(name, base, args, args.step_ms))
    finally:
        server.stop()
    return [_row(name, fast[name], fed[name], args) for name in names]


def _skip(name: str) -> bool:
    print(f"skip {name}: not importable", file=sys.stderr)
    return False


def _row(
    name: str, fast: list[dict[str, Any]], fed: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    def disk(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
        return {k: median([{"v": r[key][k]} for r in runs], "v") or 0 for k in runs[0][key]}

    runs = fast + fed
    elsewhere: dict[str, int] = {}
    for r in runs:
        for path, size in r["elsewhere_left"].items():
            elsewhere[path] = max(elsewhere.get(path, 0), size)
    return {
        "loader": name,
        "workers": args.workers,
        "repeats": args.repeats,
        "samples": fast[0]["samples"],
        "samples_per_s": median(fast, "samples_per_s"),
        "samples_per_s_runs": [r["samples_per_s"] for r in fast],
        "first_batch_s": median(fast, "first_batch_s"),
        "cpu_us_per_sample": median(fast, "cpu_us_per_sample"),
        "peak_rss_mb": median(fast, "peak_rss_mb"),
        "step_ms": args.step_ms,
        "fed_samples_per_s": median(fed, "samples_per_s"),
        "wait_fraction": median(fed, "wait_fraction"),
        "wait_fraction_after_first": median(fed, "wait_fraction_after_first"),
        "wait_fraction_unfed": median(fast, "wait_fraction"),
        "disk_peak_bytes": disk(runs, "disk_peak_bytes"),
        "disk_left_bytes": disk(runs, "disk_left_bytes"),
        "elsewhere_left_bytes": elsewhere,
        "reports": [r["report"] for r in runs if r.get("report")],
    }


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown table of a cold run."""
    lit = next((r["samples_per_s"] for r in results if r["loader"] == "litdata"), None)
    lines = [
        f"Cold start from S3 (SeaweedFS on loopback): {args.samples} samples, batch {args.batch_size}, "
        f"{args.workers} workers, shuffle off, median of {args.repeats} fresh processes with empty local "
        f"folders. Consumer wait: fraction of wall time spent building the loader or blocked in "
        f"`next()` while the consumer trains {args.step_ms:g} ms per batch. Disk: MB allocated "
        f"under the loader's local folders, peak during the run / left after it.",
        "",
        "| loader | samples/s | x LitData | first batch s | CPU µs/sample | consumer wait | "
        "wait after first batch | peak RSS MB | local disk peak / left MB | where |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        where = "; ".join(
            f"{k}: {_mb(r['disk_peak_bytes'][k])} / {_mb(r['disk_left_bytes'].get(k, 0))}"
            for k in r["disk_peak_bytes"]
            if r["disk_peak_bytes"][k] or r["disk_left_bytes"].get(k)
        )
        on_disk = {k: v for k, v in r["disk_peak_bytes"].items() if "tmpfs" not in k}
        left = {k: v for k, v in r["disk_left_bytes"].items() if "tmpfs" not in k}
        elsewhere = sum(r["elsewhere_left_bytes"].values())
        if elsewhere:
            where += f"; elsewhere: {_mb(elsewhere)}"
        cells = [
            r["loader"],
            f"{r['samples_per_s']:.0f}",
            "" if not lit else f"{r['samples_per_s'] / lit:.2f}",
            f"{r['first_batch_s']:.2f}",
            f"{r['cpu_us_per_sample']:.0f}",
            f"{r['wait_fraction']:.0%}",
            f"{r['wait_fraction_after_first']:.0%}",
            f"{r['peak_rss_mb']:.0f}",
            f"{_mb(sum(on_disk.values()))} / {_mb(sum(left.values()))}",
            where or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> bool:
    """samples/s and local disk per loader, side by side (needs matplotlib)."""
    plt = pyplot()
    if plt is None:
        return False
    names = [r["loader"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(names, [r["samples_per_s"] for r in results])
    a.set_ylabel("samples/s, cold from S3")
    disk = [sum(v for k, v in r["disk_peak_bytes"].items() if "tmpfs" not in k) / 1e6 for r in results]
    b.bar(names, disk)
    b.set_ylabel("local disk peak, MB")
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the ``s3`` mode."""
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=10.0, help="the fed pass: consumer time per batch")
    parser.add_argument("--ssd-bytes", type=int, default=1 << 30, help="our SSD tier's budget")
    parser.add_argument("--loaders", default="limit,tierdata-repo,litdata,mds,wds")
    parser.add_argument("--work", default=str(DEFAULT_WORK))
    parser.add_argument("--ram-root", default="/dev/shm", help="where our fresh RAM tiers go (tmpfs)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))


def main_s3(args: argparse.Namespace) -> None:
    """Run the cold benchmark and write ``loader-s3.{json,md,png}``."""
    compile_bytecode()
    code_at_start = code_state()
    results = run(args)
    write_results(
        Path(args.out),
        "loader-s3",
        args,
        results,
        code_at_start,
        lambda: table(results, args),
        lambda path: plot(results, path),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_arguments(sub.add_parser("run", help="run the cold benchmark"))
    c = sub.add_parser("_child")
    c.add_argument("spec")
    args = parser.parse_args()
    if args.cmd == "_child":
        print(json.dumps(_child(json.loads(args.spec))))
        return
    main_s3(args)


if __name__ == "__main__":
    main()
