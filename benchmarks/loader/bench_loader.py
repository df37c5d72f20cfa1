"""Loader benchmark: CPU per delivered sample, first batch, resume, memory; ours vs the limit and peers.

Every measurement runs in a fresh Python process (the median of ``--repeats`` of them
is reported), because first-batch latency and memory are properties of a fresh start:

- **epoch**: build the loader, read one epoch; CPU time of the process and all its
  DataLoader workers (``RUSAGE_SELF + RUSAGE_CHILDREN``) per delivered sample, wall
  samples/s, time to the first batch (from constructing the loader).
- **resume**: a first process reads half an epoch and saves the loader's state; a fresh
  one loads it and times the first batch (a loader without resume replays the half).
- **memory**: ``--memory-epochs`` epochs; the peak over each epoch of the summed RSS and
  PSS of the process and its workers (PSS splits pages shared after fork fairly).

Usage (full run, the figures of the issue; about an hour on 2 shared cores)::

    python -m benchmarks.loader.bench_loader run
    .bench-venv/bin/python -m benchmarks.loader.bench_loader run   # with the peers installed
    .bench-venv/bin/python -m benchmarks.loader.bench_loader s3    # cold from S3 (bench_s3)

Quick check while developing::

    python -m benchmarks.loader.bench_loader run --samples 20000 --repeats 1 --memory-epochs 2

Results go to ``benchmarks/loader/results/loader.{json,md}`` (and ``.png`` when
matplotlib is importable).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.bytecode import compile_bytecode
from benchmarks.loader.measure import (
    MemorySampler,
    code_state,
    cpu_seconds,
    median,
    pyplot,
    spawn,
    write_results,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORK = ROOT / "benchmarks" / "_work" / "loader"
DEFAULT_OUT = Path(__file__).resolve().parent / "results"


# -- measuring, inside a child process ---------------------------------------------------


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.loader.candidates import CANDIDATES, RunConfig, batch_len

    warnings.filterwarnings("ignore")
    cand = CANDIDATES[spec["loader"]]
    cfg = RunConfig(**spec["cfg"])
    mode = spec["mode"]
    out: dict[str, Any] = {}
    if mode == "save_half":
        loader = cand.make(cfg)
        delivered, it = 0, iter(loader)
        for batch in it:
            delivered += batch_len(batch)
            if delivered >= spec["half"]:
                break
        out = {"delivered": delivered, "state": cand.state(loader, delivered)}
        Path(spec["state_file"]).write_text(json.dumps(out))
        del it
        return {"delivered": delivered}

    cand.preload()
    sampler = MemorySampler() if mode in ("epoch", "memory") else None
    gc.collect()
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    loader = cand.make(cfg)
    if mode == "resume":
        saved = json.loads(Path(spec["state_file"]).read_text())
        it = cand.resume(loader, saved["state"])
        first = next(it)
        out["first_batch_s"] = time.perf_counter() - t0
        rest = batch_len(first) + sum(batch_len(b) for b in it)
        out["resumed_samples"] = rest
        out["saved_delivered"] = saved["delivered"]
        return out

    epochs = spec.get("epochs", 1)
    samples, per_epoch = 0, []
    for epoch in range(epochs):
        if hasattr(loader, "streaming_dataset"):
            loader.streaming_dataset.set_epoch(epoch)
        it = iter(loader)
        first = next(it)
        if epoch == 0:
            out["first_batch_s"] = time.perf_counter() - t0
        n = batch_len(first)
        for batch in it:
            n += batch_len(batch)
        del it, first
        gc.collect()
        samples += n
        if sampler is not None and mode == "memory":
            per_epoch.append(sampler.reset())
    del loader
    gc.collect()
    wall = time.perf_counter() - t0
    cpu = cpu_seconds() - cpu0
    out.update(
        {
            "samples": samples,
            "wall_s": wall,
            "cpu_s": cpu,
            "cpu_us_per_sample": 1e6 * cpu / max(1, samples),
            "samples_per_s": samples / wall,
        }
    )
    if sampler is not None:
        rss, pss = sampler.reset()
        sampler.stop()
        out["peak_rss_mb"] = rss / 2**20
        out["peak_pss_mb"] = pss / 2**20
        if per_epoch:
            out["epoch_peak_rss_mb"] = [r / 2**20 for r, _ in per_epoch]
            out["epoch_peak_pss_mb"] = [p / 2**20 for _, p in per_epoch]
    return out


# -- orchestrating, in the parent ----------------------------------------------------------


def _measure(base: dict[str, Any], mode: str, **extra: Any) -> dict[str, Any]:
    return spawn("benchmarks.loader.bench_loader", {**base, "mode": mode, **extra})


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every loader on every setting. Within a worker count, each repeat runs every loader
    with the shuffle off and then on, so settings compared side by side (the loaders, and
    a loader's shuffle on against off) share the machine's conditions of that moment; the
    shuffle's cost is also reported paired, as the median over repeats of on / off."""
    from benchmarks.loader.candidates import CANDIDATES, RunConfig
    from benchmarks.loader.data import ensure_dataset

    work = Path(args.work)
    paths = ensure_dataset(work / f"data-{args.samples}-{args.shards}", args.samples, args.shards)
    names = []
    for name in args.loaders.split(","):
        if CANDIDATES[name].available():
            names.append(name)
        else:
            print(f"skip {name}: {', '.join(CANDIDATES[name].requires)} not importable", file=sys.stderr)
    results = []
    for workers in (int(w) for w in args.workers.split(",")):
        bases, states = {}, {}
        for shuffle in (False, True):
            cfg = RunConfig(
                paths=tuple(map(str, paths)),
                work=str(work),
                num_workers=workers,
                shuffle=shuffle,
                batch_size=args.batch_size,
                shuffle_window=args.shuffle_window,
            )
            for name in names:
                CANDIDATES[name].prepare(cfg)
                bases[name, shuffle] = {"loader": name, "cfg": cfg.__dict__}
                states[name, shuffle] = str(work / f"state-{name}-{workers}-{int(shuffle)}.json")
                _measure(
                    bases[name, shuffle],
                    "save_half",
                    half=args.samples // 2,
                    state_file=states[name, shuffle],
                )
        epochs: dict[tuple[str, bool], list[dict[str, Any]]] = {key: [] for key in bases}
        resumes: dict[tuple[str, bool], list[dict[str, Any]]] = {key: [] for key in bases}
        for _ in range(args.repeats):
            for shuffle in (False, True):
                for name in names:
                    key = (name, shuffle)
                    epochs[key].append(_measure(bases[key], "epoch"))
                    resumes[key].append(_measure(bases[key], "resume", state_file=states[key]))
        for (name, shuffle), base in bases.items():
            memory = _measure(base, "memory", epochs=args.memory_epochs) if args.memory_epochs else {}
            ep, rs = epochs[name, shuffle], resumes[name, shuffle]
            paired = [
                on["cpu_us_per_sample"] / off["cpu_us_per_sample"]
                for off, on in zip(epochs[name, False], epochs[name, True])
            ]
            row = {
                "loader": name,
                "workers": workers,
                "shuffle": shuffle,
                "repeats": args.repeats,
                "samples": ep[0]["samples"],
                "cpu_us_per_sample": median(ep, "cpu_us_per_sample"),
                "cpu_us_per_sample_runs": [e["cpu_us_per_sample"] for e in ep],
                "shuffle_cost_paired": statistics.median(paired) if shuffle else None,
                "samples_per_s": median(ep, "samples_per_s"),
                "first_batch_s": median(ep, "first_batch_s"),
                "resume_first_batch_s": median(rs, "first_batch_s"),
                "resumed_samples": rs[0]["resumed_samples"],
                "resume_saved_after": rs[0]["saved_delivered"],
                "peak_rss_mb": median(ep, "peak_rss_mb"),
                "peak_pss_mb": median(ep, "peak_pss_mb"),
                "epoch_peak_pss_mb": memory.get("epoch_peak_pss_mb"),
                "epoch_peak_rss_mb": memory.get("epoch_peak_rss_mb"),
            }
            print(json.dumps(row), file=sys.stderr)
            results.append(row)
    results.sort(key=lambda r: (names.index(r["loader"]), r["workers"], r["shuffle"]))
    return results


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    limit = {
        (r["workers"]): r["cpu_us_per_sample"] for r in results if r["loader"] == "limit" and not r["shuffle"]
    }
    lines = [
        f"Loader benchmark: {args.samples} samples, {args.shards} shards, batch {args.batch_size}, "
        f"median of {args.repeats} fresh processes; CPU = process + workers.",
        "",
        "| loader | workers | shuffle | CPU µs/sample | x limit | shuffle on / off (paired) | samples/s "
        "| first batch s | resume first batch s | resumed samples | peak RSS MB | peak PSS MB "
        "| PSS per epoch MB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        ratio = r["cpu_us_per_sample"] / limit[r["workers"]] if r["workers"] in limit else None
        epochs = r["epoch_peak_pss_mb"]
        cells = [
            r["loader"],
            str(r["workers"]),
            "on" if r["shuffle"] else "off",
            f"{r['cpu_us_per_sample']:.1f}",
            "" if ratio is None else f"{ratio:.2f}",
            "" if r.get("shuffle_cost_paired") is None else f"{r['shuffle_cost_paired']:.2f}",
            f"{r['samples_per_s']:.0f}",
            f"{r['first_batch_s']:.3f}",
            f"{r['resume_first_batch_s']:.3f}",
            f"{r['resumed_samples']} of {r['samples'] - r['resume_saved_after']}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['peak_pss_mb']:.0f}",
            "" if not epochs else " ".join(f"{x:.0f}" for x in epochs),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(results: list[dict[str, Any]], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    labels = [f"{r['loader']}\nw{r['workers']} {'shuf' if r['shuffle'] else 'seq'}" for r in results]
    fig, ax = plt.subplots(figsize=(max(6, len(results) * 0.9), 4))
    ax.bar(range(len(results)), [r["cpu_us_per_sample"] for r in results])
    ax.set_xticks(range(len(results)), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("CPU µs per delivered sample (log)")
    fig.tight_layout()
    fig.savefig(path)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark")
    r.add_argument("--samples", type=int, default=100_000)
    r.add_argument("--shards", type=int, default=10)
    r.add_argument("--batch-size", type=int, default=64)
    r.add_argument("--shuffle-window", type=int, default=2, help="tierdata's shuffle window, in shards")
    r.add_argument("--workers", default="0,2")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--memory-epochs", type=int, default=5)
    r.add_argument("--loaders", default="limit,tierdata,tierdata-repo,litdata,mds,wds")
    r.add_argument("--work", default=str(DEFAULT_WORK))
    r.add_argument("--out", default=str(DEFAULT_OUT))
    from benchmarks.loader import bench_s3

    bench_s3.add_arguments(sub.add_parser("s3", help="cold start from the S3 test server (see bench_s3)"))
    c = sub.add_parser("_child")
    c.add_argument("spec")
    args = parser.parse_args()
    if args.cmd == "_child":
        print(json.dumps(_child(json.loads(args.spec))))
        return
    if args.cmd == "s3":
        bench_s3.main_s3(args)
        return
    compile_bytecode()
    code_at_start = code_state()
    results = run(args)
    write_results(
        Path(args.out),
        "loader",
        args,
        results,
        code_at_start,
        lambda: _table(results, args),
        lambda path: _plot(results, path),
    )


if __name__ == "__main__":
    main()
