"""One shuffled epoch of the warm benchmark repository as rank ``$RANK`` of ``$WORLD_SIZE``.

Start one process per rank at once to see ranks on one node share the warm RAM tier::

    for r in 0 1; do RANK=$r WORLD_SIZE=2 .venv/bin/python -m benchmarks.loader.two_ranks_epoch & done; wait

The repository is the one ``bench_loader run`` prepares under ``benchmarks/_work/loader``
(or give its folder as the argument). Prints rank, samples, wall and CPU seconds.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> None:
    from cachetier.config import CacheConfig
    from loaders import StreamingDataset

    if len(sys.argv) > 1:
        work = Path(sys.argv[1])
    else:
        work = next((Path(__file__).resolve().parents[1] / "_work" / "loader").glob("repo-10-*"))
    cache = CacheConfig(dir=work / "cache", ram_dir=work / "ram", ram_bytes=1 << 30, ssd_bytes=1 << 30)
    ds = StreamingDataset(str(work / "repo"), batch_size=64, shuffle=True, seed=1, cache=cache)
    wall, cpu = time.perf_counter(), time.process_time()
    samples = sum(len(batch["id"]) for batch in ds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rank = os.environ.get("RANK", "0")
    print(f"rank {rank}: {samples} samples, {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)


if __name__ == "__main__":
    main()
