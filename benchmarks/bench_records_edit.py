"""Editing records of a tabular dataset: tierdata vs DVC, side by side on the same data.

Data (generated, fixed seed): one JSONL file of ``--records`` records of
``datastore.sample`` (default 200,000, ~140 MB). Default options throughout (tierdata:
16 MiB shards; DVC 3, copy mode). Steps, each timed as wall seconds, median of ``--runs``:

* ``add``             ``dataset ingest + version`` vs ``dvc add``
* ``checkout``        into an empty folder vs ``dvc checkout`` after deleting the file
* ``edit_scattered``  re-ingest + ``version --replace`` after 1% of the records, at
                      random, got a few more characters, vs ``dvc add``; with the new
                      bytes the store grew by
* ``checkout_edited`` the edited version (tierdata rebuilds shards stored as deltas)
* ``edit_clustered``  the same for 1% of the records in one run
* ``edit_elsewhere``  another scattered 1% edit, ingested from a second workspace (a
                      clone, a CI job) that did not write the version it edits; DVC:
                      ``dvc add`` again (it stores the whole file wherever it runs)

Run (after ``bash benchmarks/setup_dvc_env.sh``)::

    .venv/bin/python -m benchmarks.bench_records_edit --runs 3 --out benchmarks/results/records-edit.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.bench_ingest import DATASET, DVC, dir_bytes, repo_bytes, run
from datastore.sample import sample_records


def write_rows(path: Path, rows: list[dict]) -> None:
    with path.open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def edit(rows: list[dict], seed: int, clustered: bool) -> None:
    rng = random.Random(seed)
    n = len(rows) // 100
    if clustered:
        start = rng.randrange(len(rows) - n)
        picked = range(start, start + n)
    else:
        picked = rng.sample(range(len(rows)), n)
    for i in picked:
        rows[i] = {**rows[i], "text": rows[i]["text"] + f" edited {seed}"}


def bench_tierdata(work: Path, rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    proj, repo = work / "td", work / "td-repo"
    proj.mkdir()
    src = proj / "d.jsonl"
    write_rows(src, rows)
    run([*DATASET, "init", str(repo)], proj)
    out["add"] = run([*DATASET, "ingest", str(src)], proj) + run([*DATASET, "version", "-m", "a"], proj)
    out["add_bytes"] = repo_bytes(repo)
    out["checkout"] = run([*DATASET, "checkout", "main", "--to", str(work / "td-out")], proj)
    for label, clustered in (("edit_scattered", False), ("edit_clustered", True)):
        edit(rows, seed=3 if clustered else 2, clustered=clustered)
        write_rows(src, rows)
        before = repo_bytes(repo)
        out[label] = run([*DATASET, "ingest", str(src)], proj) + run(
            [*DATASET, "version", "-m", label, "--replace"], proj
        )
        out[f"{label}_new_bytes"] = repo_bytes(repo) - before
        if not clustered:
            target = work / "td-out-edited"
            out["checkout_edited"] = run([*DATASET, "checkout", "main", "--to", str(target)], proj)
    # the next scattered edit, ingested from another workspace (a clone, a CI job)
    elsewhere = work / "td-elsewhere"
    elsewhere.mkdir()
    edit(rows, seed=4, clustered=False)
    write_rows(elsewhere / "d.jsonl", rows)
    run([*DATASET, "init", str(repo)], elsewhere)
    before = repo_bytes(repo)
    out["edit_elsewhere"] = run([*DATASET, "ingest", "d.jsonl"], elsewhere) + run(
        [*DATASET, "version", "-m", "elsewhere", "--replace"], elsewhere
    )
    out["edit_elsewhere_new_bytes"] = repo_bytes(repo) - before
    return out


def bench_dvc(work: Path, rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    proj = work / "dvc"
    proj.mkdir()
    src = proj / "d.jsonl"
    write_rows(src, rows)
    cache = proj / ".dvc" / "cache"
    run([DVC, "init", "--no-scm", "-q"], proj)
    run([DVC, "config", "cache.type", "copy"], proj)
    out["add"] = run([DVC, "add", "-q", "d.jsonl"], proj)
    out["add_bytes"] = dir_bytes(cache)
    src.unlink()
    out["checkout"] = run([DVC, "checkout", "-q"], proj)
    for label, clustered in (("edit_scattered", False), ("edit_clustered", True)):
        edit(rows, seed=3 if clustered else 2, clustered=clustered)
        write_rows(src, rows)
        before = dir_bytes(cache)
        out[label] = run([DVC, "add", "-q", "d.jsonl"], proj)
        out[f"{label}_new_bytes"] = dir_bytes(cache) - before
        if not clustered:
            src.unlink()
            out["checkout_edited"] = run([DVC, "checkout", "-q"], proj)
    edit(rows, seed=4, clustered=False)  # DVC stores the whole file wherever it is added
    write_rows(src, rows)
    before = dir_bytes(cache)
    out["edit_elsewhere"] = run([DVC, "add", "-q", "d.jsonl"], proj)
    out["edit_elsewhere_new_bytes"] = dir_bytes(cache) - before
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/records-edit.json"))
    parser.add_argument("--no-dvc", action="store_true", help="tierdata only")
    args = parser.parse_args()
    from benchmarks.bytecode import compile_bytecode

    compile_bytecode()  # as pip does for the peers (see benchmarks/bytecode.py)
    rows = list(sample_records(args.records, seed=1))
    tools = {"tierdata": bench_tierdata} if args.no_dvc else {"tierdata": bench_tierdata, "dvc": bench_dvc}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    base = Path(os.environ.get("BENCH_TMP", tempfile.gettempdir())).resolve()
    base.mkdir(parents=True, exist_ok=True)
    for i in range(args.runs):
        order = list(tools) if i % 2 == 0 else list(reversed(tools))
        for name in order:
            work = Path(tempfile.mkdtemp(prefix=f"records-edit-{name}-", dir=base))
            try:
                runs[name].append(tools[name](work, [dict(r) for r in rows]))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print(name, i, json.dumps(runs[name][-1]), flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    report = {"records": args.records, "runs": args.runs, "median": medians, "all": runs}
    if "dvc" in medians:
        report["ratio_dvc_over_tierdata"] = {
            k: medians["dvc"][k] / medians["tierdata"][k]
            for k in medians["tierdata"]
            if not k.endswith("bytes") and medians["tierdata"][k] > 0
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"median": medians, "ratio": report.get("ratio_dvc_over_tierdata")}, indent=2))


if __name__ == "__main__":
    main()
