"""Ingest throughput of the datastore core (no CLI, no DVC): files, one big file, re-ingest.

    python benchmarks/datastore_ingest.py [--files 20000] [--big-mb 1024] [--work DIR]

Generates 20,000 files of 8-12 KB (random-ish: a random 256-byte alphabet per file, so
zstd finds a little to do) and one big random file, ingests each into a fresh local
repository, then changes 1% of the small files (and 1 MiB inside the big file) and
re-ingests with the ingest index. Prints wall and CPU seconds and the bytes stored; the
``--json`` flag writes them as JSON too. ``--edit scattered`` (default) changes files
picked at random, ``--edit contiguous`` a run of neighbouring files: with scattered edits
only shards of a few files each keep the new bytes under 10% (see datastore/shards.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore.ingest import ingest


def make_files(root: Path, n: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(n):
        folder = root / f"d{i // 1000:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        size = int(rng.integers(8000, 12001))
        alphabet = rng.integers(0, 256, 64, dtype=np.uint8)
        data = alphabet[rng.integers(0, 64, size)].tobytes()
        (folder / f"f{i:06d}.bin").write_bytes(data)
        total += size
    return total


def edit_files(root: Path, fraction: float, *, scattered: bool, seed: int = 1) -> int:
    rng = np.random.default_rng(seed)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    count = max(1, int(len(files) * fraction))
    if scattered:
        picked = rng.choice(len(files), count, replace=False)
    else:  # one run of neighbouring files, e.g. a folder that was regenerated
        start = int(rng.integers(0, len(files) - count))
        picked = range(start, start + count)
    for k in picked:
        path = files[int(k)]
        data = bytearray(path.read_bytes())
        data[:64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(data))
    return len(picked)


def timed(label: str, fn, results: dict) -> object:
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    extra = {}
    if hasattr(out, "records"):
        extra = {
            "records": out.records,
            "shards": len(out.shards),
            "bytes": out.bytes,
            "new_bytes": out.new_bytes,
            "files_read": out.files_read,
            "reused_shards": out.reused_shards,
        }
    results[label] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), **extra}
    print(f"{label:32s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  {extra}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20_000)
    ap.add_argument("--big-mb", type=int, default=1024)
    ap.add_argument("--shard-size", type=int, default=None, help="bytes (default: the library default)")
    ap.add_argument(
        "--edit",
        choices=["scattered", "contiguous"],
        default="scattered",
        help="which 1%% of the files change",
    )
    ap.add_argument("--work", default="benchmarks/_work/datastore")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict[str, dict] = {}

    small = work / "small"
    total = make_files(small, args.files)
    print(f"{args.files} files, {total / 1e6:.0f} MB")
    time.sleep(0.2)  # let the mtimes age past the racy window
    objects = ObjectStore(LocalStore(work / "repo-small"))
    index = work / "index-small.json"
    kw = {"shard_size": args.shard_size} if args.shard_size else {}
    first = timed("ingest files", lambda: ingest([small], objects, index=index, **kw), results)
    timed("re-ingest files, unchanged", lambda: ingest([small], objects, index=index, **kw), results)
    edit_files(small, 0.01, scattered=args.edit == "scattered")
    time.sleep(0.2)
    again = timed("re-ingest files, 1% changed", lambda: ingest([small], objects, index=index, **kw), results)
    results["re-ingest files, 1% changed"]["new_shard_fraction"] = round(
        again.new_bytes / max(first.bytes, 1), 4
    )

    if args.big_mb:
        big_dir = work / "big"
        big_dir.mkdir()
        big = big_dir / "big.bin"
        with open(big, "wb") as f:
            for _ in range(args.big_mb):
                f.write(os.urandom(1 << 20))
        time.sleep(0.2)
        objects = ObjectStore(LocalStore(work / "repo-big"))
        index = work / "index-big.json"
        timed("ingest 1 big file", lambda: ingest([big_dir], objects, index=index, **kw), results)
        with open(big, "r+b") as f:
            f.seek(big.stat().st_size // 2)
            f.write(os.urandom(1 << 20))
        time.sleep(0.2)
        timed(
            "re-ingest big file, 1 MiB edit", lambda: ingest([big_dir], objects, index=index, **kw), results
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
