"""Scale: ingest streams a large JSONL in bounded memory, on both cores.

Generates a JSONL file of ``--gib`` GiB (default 2) from the sample corpus (records
repeated with fresh ids, so every line differs), then runs ``dataset ingest`` and
``dataset version`` in a fresh process, measuring wall time, CPU time (user + sys:
a ratio above 1 means more than one core busy) and peak RSS of the process.

    .venv/bin/python -m benchmarks.bench_scale --gib 2 --out benchmarks/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_jsonl(path: Path, target_bytes: int) -> int:
    from datastore.sample import sample_records

    base = [json.dumps({k: v for k, v in r.items() if k != "id"}) for r in sample_records(20000, seed=11)]
    written = records = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target_bytes:
            lines = [f'{{"id": {records + i}, {line[1:]}\n' for i, line in enumerate(base)]
            block = "".join(lines)
            f.write(block)
            written += len(block)
            records += len(base)
    return records


def measure(cmd: list[str], cwd: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "cores_busy": round(cpu / wall, 2),
        "peak_rss_mib": round(after.ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale.json")
    args = parser.parse_args()
    dataset = str(ROOT / ".venv" / "bin" / "dataset")
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        src = work / "big.jsonl"
        records = make_jsonl(src, int(args.gib * (1 << 30)))
        subprocess.run([dataset, "init", str(work / "repo")], cwd=work, check=True, capture_output=True)
        ingest = measure([dataset, "ingest", str(src)], work)
        version = measure([dataset, "version", "-m", "scale"], work)
        report = {
            "input_bytes": src.stat().st_size,
            "records": records,
            "ingest": ingest,
            "version": version,
            "throughput_mib_s": round(src.stat().st_size / (1 << 20) / ingest["wall_s"], 1),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    sys.exit(0 if ingest["peak_rss_mib"] < 1024 else 1)


if __name__ == "__main__":
    main()
