"""Feeding a GPU: the loader's batches through ``DevicePrefetcher`` against a plain copy loop.

Runs on a machine with CUDA (it refuses to run without). The data are the loader issue's
(``benchmarks/loader/data.py``: {id, 512 int32 tokens, ~1 KB text}), ingested into a
local repository and read warm through the tiered cache (``TierdataRepo``). For each
``num_workers`` and each way of reaching the GPU, one epoch is timed, ``--repeats``
times (median reported):

- ``sync``: the usual loop, ``batch["tokens"].to("cuda")`` from pageable memory, which
  waits for the GPU's queued work before it copies;
- ``prefetcher``: ``DevicePrefetcher`` (pinning on the main thread, a side stream,
  one batch ahead);
- ``prefetcher+pin``: the same with the DataLoader's ``pin_memory=True`` (its pin thread
  pins, the prefetcher only copies).

Two workloads over the loader: ``feed`` (the step reads the batch on the GPU and nothing else: how fast
data reach the device) and ``train`` (a small transformer step in bf16, a few ms, so
copies can hide behind compute). ``compute only`` is the train step on one resident
batch: the bound a loader can at best reach. Reported: samples/s, the fraction of the
epoch's wall time the host spent getting the next batch onto the device (``wait``), and
for ``train`` the fraction of the compute-only speed reached. Then, without the loader,
image-sized batches (38.5 MB) against a fixed 3 ms GPU step (:func:`large_batches`): the
case where the copy itself, not the loader, costs as much as the step.

Usage (on the GPU machine)::

    python -m benchmarks.loader.bench_gpu --out benchmarks/loader/results --stem loader-gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.loader.candidates import RunConfig, TierdataRepo
from benchmarks.loader.data import TOKENS, ensure_dataset

METHODS = ("sync", "prefetcher", "prefetcher+pin")
WORKLOADS = ("feed", "train")


class TinyModel(torch.nn.Module):
    """Embedding, two encoder layers and a mean-pooled head: a few ms per batch of 64 x 512."""

    def __init__(self, vocab: int = 50_304, width: int = 256) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens.long())).mean(dim=1))


def _trainer(device: torch.device) -> Any:
    model = TinyModel().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict[str, Any]) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(batch["tokens"]), batch["id"] % 2)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _feed(batch: dict[str, Any]) -> None:
    batch["tokens"].sum()  # queued on the current stream: must see the copied values


def _epoch(cfg: RunConfig, method: str, step: Any, device: torch.device) -> dict[str, float]:
    from loaders import DevicePrefetcher, StreamingDataLoader

    dataset = TierdataRepo().make(cfg).streaming_dataset  # the benchmark's repository and cache
    loader = StreamingDataLoader(dataset, num_workers=cfg.num_workers, pin_memory=method == "prefetcher+pin")
    batches = iter(loader) if method == "sync" else iter(DevicePrefetcher(loader, device))
    samples, waited = 0, 0.0
    _sync(device)
    t0 = time.perf_counter()
    while True:
        w0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        if method == "sync":
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        waited += time.perf_counter() - w0
        step(batch)
        samples += len(batch["id"])
    _sync(device)
    wall = time.perf_counter() - t0
    return {"samples": samples, "wall_s": wall, "samples_per_s": samples / wall, "wait": waited / wall}


def _compute_only(cfg: RunConfig, step: Any, device: torch.device, samples: int) -> float:
    """Samples/s of the train step alone, on one batch already on the GPU."""
    tokens = torch.randint(0, 50_257, (cfg.batch_size, TOKENS), dtype=torch.int32, device=device)
    batch = {"tokens": tokens, "id": torch.arange(cfg.batch_size, device=device)}
    steps = samples // cfg.batch_size
    for _ in range(10):
        step(batch)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(batch)
    _sync(device)
    return steps * cfg.batch_size / (time.perf_counter() - t0)


LARGE_SHAPE = (64, 3, 224, 224)  # an image batch: 38.5 MB of float32
LARGE_STEP_MS = 3.0


def _gpu_wait(ms: float) -> Any:
    """A stand-in train step: ``ms`` of GPU time on the current stream, then a read of the batch."""
    probe = 50_000_000
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    cycles = int(probe * ms / 1e3 / (time.perf_counter() - t0))

    def step(batch: dict[str, Any]) -> None:
        torch.cuda._sleep(cycles)
        batch["x"].sum()

    return step


def large_batches(device: torch.device, repeats: int, steps: int = 100) -> dict[str, list[float]]:
    """Steps/s of a fixed 3 ms GPU step fed image-sized batches from host memory (no loader).

    Where the copy (about as long as the step), not the loader, is the cost: ``sync``
    copies pageable memory on the current stream; ``prefetcher`` copies the same batches
    one ahead, pinning them on the consumer thread; ``prefetcher+pinned`` gets batches
    already pinned (as a DataLoader with ``pin_memory=True`` hands them over). ``step
    only`` is the bound.
    """
    from loaders import DevicePrefetcher

    pageable = [{"x": torch.rand(LARGE_SHAPE)} for _ in range(4)]
    pinned = [{"x": b["x"].pin_memory()} for b in pageable]
    step = _gpu_wait(LARGE_STEP_MS)
    resident = {"x": pageable[0]["x"].to(device)}

    def ahead(batches: list[dict[str, torch.Tensor]]) -> Any:
        return DevicePrefetcher((batches[i % 4] for i in range(steps)), device)

    loops = {
        "sync": lambda: (step({"x": pageable[i % 4]["x"].to(device)}) for i in range(steps)),
        "prefetcher": lambda: (step(b) for b in ahead(pageable)),
        "prefetcher+pinned": lambda: (step(b) for b in ahead(pinned)),
        "step only": lambda: (step(resident) for _ in range(steps)),
    }
    return {name: [steps / t for t in times] for name, times in _time_loops(loops, repeats, device).items()}


def _time_loops(loops: dict[str, Any], repeats: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds each loop takes to run to its end, ``repeats`` rounds of all of them in turn
    (after one warm-up round, dropped)."""
    out: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats + 1):
        for name, loop in loops.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in loop():
                pass
            _sync(device)
            out[name].append(time.perf_counter() - t0)
    return {name: times[1:] for name, times in out.items()}


#: Batches of small tensors (each under PIN_MIN_BYTES): (shape, dtype) per column.
SMALL_BATCHES = {
    "tokens": {
        "tokens": ((64, TOKENS), torch.int32),
        "id": ((64,), torch.int64),
        "length": ((64,), torch.int32),
        "weight": ((64,), torch.float32),
    },
    "wide": {f"c{k}": ((64, 64), torch.float32) for k in range(16)},
}


def small_batches(
    device: torch.device, repeats: int, steps: int = 400, prefetcher: Any = None
) -> dict[str, dict[str, list[float]]]:
    """Host µs per batch of small tensors fed to a near-empty step (a sum of one column).

    The loader's own batches are like ``tokens`` (one 128 KB column and three tiny ones);
    ``wide`` has 16 columns of 16 KB. Here the copies are short and what counts is what
    the host spends per batch: ``sync`` is ``.to(device, non_blocking=True)`` for each
    tensor in the loop, ``prefetcher`` is :class:`~loaders.DevicePrefetcher` (or the class
    given), ``step only`` the step on a batch already on the device.
    """
    if prefetcher is None:
        from loaders import DevicePrefetcher as prefetcher

    out: dict[str, dict[str, list[float]]] = {}
    for kind, columns in SMALL_BATCHES.items():
        host = [{name: torch.ones(shape, dtype=dtype) for name, (shape, dtype) in columns.items()}] * 4
        first = next(iter(columns))
        resident = {k: v.to(device) for k, v in host[0].items()}

        def step(batch: dict[str, torch.Tensor], first: str = first) -> None:
            batch[first].sum()

        def sync(host: list[dict[str, torch.Tensor]] = host) -> Iterator[None]:
            for i in range(steps):
                yield step({k: v.to(device, non_blocking=True) for k, v in host[i % 4].items()})

        def ahead(host: list[dict[str, torch.Tensor]] = host) -> Iterator[None]:
            for batch in prefetcher((host[i % 4] for i in range(steps)), device):
                yield step(batch)

        def alone(resident: dict[str, torch.Tensor] = resident) -> Iterator[None]:
            for _ in range(steps):
                yield step(resident)

        loops = {"sync": sync, "prefetcher": ahead, "step only": alone}
        times = _time_loops(loops, repeats, device)
        out[kind] = {name: [t / steps * 1e6 for t in values] for name, values in times.items()}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (workers, workload, method) cell, ``args.repeats`` epochs each, interleaved."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_gpu needs a CUDA device (--device cpu runs the same loops as a dry run)")
    work = Path(args.work)
    paths = ensure_dataset(work / "data", args.samples, args.shards)
    cells: dict[str, list[dict[str, float]]] = {}
    bound: list[float] = []
    for workers in args.workers:
        cfg = RunConfig(tuple(str(p) for p in paths), str(work), workers, shuffle=True)
        TierdataRepo().prepare(cfg)  # ingest once, warm the cache
        steps = {"feed": _feed, "train": _trainer(device)}
        _epoch(cfg, "prefetcher", steps["train"], device)  # warm-up: CUDA kernels, page cache
        for _ in range(args.repeats):
            for workload in WORKLOADS:
                for method in METHODS:
                    key = f"{workers}|{workload}|{method}"
                    cells.setdefault(key, []).append(_epoch(cfg, method, steps[workload], device))
                    print(key, cells[key][-1], file=sys.stderr, flush=True)
            bound.append(_compute_only(cfg, steps["train"], device, args.samples))
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "compute_only_samples_per_s": statistics.median(bound),
        "cells": cells,
        "large_steps_per_s": large_batches(device, args.repeats) if device.type == "cuda" else {},
        "small_us_per_batch": small_batches(device, args.repeats) if device.type == "cuda" else {},
    }


def table(result: dict[str, Any]) -> str:
    """The medians as a Markdown table."""
    bound = result["compute_only_samples_per_s"]
    lines = [
        f"{result['device']}, torch {result['torch']}; train step alone: {bound:,.0f} samples/s",
        "",
        "| workers | workload | method | samples/s | wait (share of wall) | x compute only |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, runs in result["cells"].items():
        workers, workload, method = key.split("|")
        rate = statistics.median(r["samples_per_s"] for r in runs)
        wait = statistics.median(r["wait"] for r in runs)
        share = f"{rate / bound:.2f}" if workload == "train" else ""
        lines.append(f"| {workers} | {workload} | {method} | {rate:,.0f} | {wait:.0%} | {share} |")
    large = result.get("large_steps_per_s") or {}
    if large:
        shape = " x ".join(map(str, LARGE_SHAPE))
        lines += [
            "",
            f"Image-sized batches ({shape} float32) from host memory, a {LARGE_STEP_MS:g} ms GPU step:",
            "",
            "| method | steps/s | x step only |",
            "| --- | --- | --- |",
        ]
        bound_steps = statistics.median(large["step only"])
        for name, rates in large.items():
            rate = statistics.median(rates)
            lines.append(f"| {name} | {rate:,.0f} | {rate / bound_steps:.2f} |")
    small = result.get("small_us_per_batch") or {}
    if small:
        lines += ["", "Batches of small tensors, host µs per batch (median):", ""]
        lines += ["| batch | " + " | ".join(next(iter(small.values()))) + " |", "| --- |" + " --- |" * 3]
        for kind, cells in small.items():
            medians = " | ".join(f"{statistics.median(v):.0f}" for v in cells.values())
            lines.append(f"| {kind} | {medians} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Parse the arguments, run, write ``STEM.json`` and ``STEM.md`` under ``--out``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--work", default="/tmp/tierdata-bench-gpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--stem", default="loader-gpu")
    args = parser.parse_args()
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.json").write_text(
        json.dumps({"args": {**vars(args), "out": str(args.out)}, **result}, indent=1)
    )
    text = table(result)
    (args.out / f"{args.stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
