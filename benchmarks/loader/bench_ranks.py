"""What each rank fetches from the object store: shards and bytes, W ranks with caches of their own.

Each rank stands for a training node: it streams one shuffled epoch of a local repository
through an empty cache of its own, and we count the shards it read and the bytes the
object store served it. With ranks reading contiguous sections of the epoch, a rank
fetches about ``1/W`` of the data; interleaving ranks batch by batch made every rank
fetch all of it.

Usage::

    .venv/bin/python -m benchmarks.loader.bench_ranks [--records 200000] [--shard-size 2MiB]

Prints a Markdown table and writes ``benchmarks/loader/results/ranks.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ranks.json"


def make_repo(root: Path, records: int, shard_size: int) -> Path:
    """A local repository of ``records`` text records cut into shards of ``shard_size``."""
    from datastore import Repo

    src = root / "data.jsonl"
    with src.open("w") as f:
        for i in range(records):
            f.write(json.dumps({"id": i, "text": f"record {i} " * 12}) + "\n")
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(src, shard_size=shard_size)
    repo.commit("data")
    return root / "repo"


def rank_epoch(repo: Path, rank: int, world: int, cache_root: Path) -> dict[str, Any]:
    """Stream one shuffled epoch as ``rank`` of ``world``; what it read and fetched."""
    from cachetier.config import CacheConfig
    from loaders import StreamingDataset

    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    cache = CacheConfig(
        dir=cache_root / "ssd", ram_dir=cache_root / "ram", ram_bytes=256 << 20, ssd_bytes=1 << 30
    )
    ds = StreamingDataset(str(repo), shuffle=True, seed=1, batch_size=64, cache=cache)
    read: set[str] = set()
    inner = ds.source.read_shard

    def counting(shard_id: str, columns: Any = None) -> Any:
        read.add(shard_id)
        return inner(shard_id, columns)

    ds.source.read_shard = counting  # type: ignore[method-assign]
    samples = sum(len(batch["id"]) for batch in ds)
    stored = {entry.hash: entry.bytes for entry in ds.source.repo.shard_table(ds.version_id)}
    return {"samples": samples, "shards_read": len(read), "stored_bytes_read": sum(stored[s] for s in read)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shard-size", default="2MiB")
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    from cachetier.config import parse_size

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        root = Path(tmp)
        repo = make_repo(root, args.records, parse_size(args.shard_size, name="--shard-size"))
        for world in (int(w) for w in args.worlds.split(",")):
            for rank in range(world):
                result = rank_epoch(repo, rank, world, root / f"cache-{world}-{rank}")
                rows.append({"world": world, "rank": rank, **result})
                print(json.dumps(rows[-1]), flush=True)
    total = max(r["shards_read"] for r in rows if r["world"] == 1)
    print(f"\n| ranks | rank | samples | shards read (of {total}) | stored MB fetched |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        mb = r["stored_bytes_read"] / 1e6
        print(f"| {r['world']} | {r['rank']} | {r['samples']} | {r['shards_read']} | {mb:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"records": args.records, "shard_size": args.shard_size, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
