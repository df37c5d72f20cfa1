"""Stream one epoch of a repository's version through the tiered cache (used by scripts/demo.sh).

python examples/stream_epoch.py --repo data-repo [--ref main] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cachetier.config import CacheConfig
from loaders import StreamingDataLoader, StreamingDataset


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True)
    parser.add_argument("--ref", default="main")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    cache = (
        CacheConfig(dir=args.cache_dir, ram_bytes=256 << 20, ssd_bytes=1 << 30) if args.cache_dir else None
    )
    dataset = StreamingDataset(
        args.repo,
        args.ref,
        columns=["id", "label"],
        shuffle=True,
        seed=0,
        batch_size=args.batch_size,
        cache=cache,
    )
    loader = StreamingDataLoader(dataset, batch_size=None, num_workers=args.workers)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        start = time.perf_counter()
        seen = 0
        label_sum = torch.zeros((), dtype=torch.int64)
        for batch in loader:
            seen += len(batch["id"])
            label_sum += batch["label"].sum()
        elapsed = time.perf_counter() - start
        print(
            json.dumps(
                {"epoch": epoch, "samples": seen, "seconds": round(elapsed, 3), "label_sum": int(label_sum)}
            )
        )


if __name__ == "__main__":
    main()
