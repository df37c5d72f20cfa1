"""Reading a CSV into typed columns: tierdata's CSV reader vs pyarrow's own inference.

Data (generated, fixed seed): ``--rows`` rows (default 2,000,000, ~150 MB) of a
numbers-heavy table: an int id, three floats, two small ints, a five-digit code, a
boolean and a short text. No field has a leading zero, so both readers give the same
types and values; the figure is what typing the fields ourselves costs.

* ``pyarrow``   ``pyarrow.csv.read_csv`` with its inference (what pandas' pyarrow engine
                and most loaders do; it turns ``00501`` into 501)
* ``tierdata``  ``datastore.sources.read_table``: pyarrow splits the fields, we type them

Each run is a fresh process; CPU seconds (all threads) and wall seconds, median of ``--runs``.
Run::

    .venv/bin/python -m benchmarks.bench_csv_read --runs 5 --out benchmarks/results/csv-read.json

A copy of this file in another checkout measures that checkout's reader.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_csv(path: Path, rows: int) -> None:
    """The benchmark's CSV (fixed seed)."""
    rng = random.Random(0)
    with path.open("w") as f:
        f.write("id,x,y,z,a,b,code,flag,name\n")
        for i in range(rows):
            f.write(
                f"{i},{rng.random():.6f},{rng.uniform(-1e3, 1e3):.3f},{rng.gauss(0, 1):.5g},"
                f"{rng.randrange(100)},{rng.randrange(-50, 50)},{rng.randrange(10000, 99999)},"
                f"{'true' if rng.random() < 0.5 else 'false'},user {rng.randrange(1 << 20)}\n"
            )


def _child(reader: str, path: str) -> dict[str, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    if reader == "pyarrow":
        import pyarrow.csv as pcsv

        table = pcsv.read_csv(path)
    else:
        from datastore.sources import read_table

        table = read_table([path])[0]
    return {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - t0,
        "rows": table.num_rows,
        "types": [str(f.type) for f in table.schema],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(*args.child)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.csv"
        write_csv(path, args.rows)
        runs: dict[str, list[dict]] = {"pyarrow": [], "tierdata": []}
        for _ in range(args.runs):  # interleaved, so both see the machine of that moment
            for reader in runs:
                proc = subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_csv_read", "--child", reader, str(path)],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[reader].append(json.loads(proc.stdout.splitlines()[-1]))
        mib = path.stat().st_size / 2**20
    result = {"rows": args.rows, "mib": round(mib, 1), "runs": args.runs, "readers": {}}
    for reader, got in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in got)
        wall = statistics.median(r["wall_s"] for r in got)
        result["readers"][reader] = {
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "mib_per_s": round(mib / wall, 1),
            "types": got[0]["types"],
        }
    base = result["readers"]["pyarrow"]
    for r in result["readers"].values():
        r["cpu_x_pyarrow"] = round(r["cpu_s"] / base["cpu_s"], 2)
        r["wall_x_pyarrow"] = round(r["wall_s"] / base["wall_s"], 2)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
