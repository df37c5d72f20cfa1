"""Ingest / checkout / S3 push-pull: tierdata vs DVC, side by side on the same generated data.

Data (generated, fixed seed): 20,000 small files of 8-12 KB (~195 MB) in 100 folders,
and one 1 GiB file. Steps, each timed as wall seconds, median of ``--runs``:

* ``add``        ``dataset ingest + version`` vs ``dvc add`` (copy mode) of the small files
* ``checkout``   materialize into an empty folder vs ``dvc checkout`` after deleting the workspace
* ``readd``      re-ingest after 1% of the files changed (200 files in 2 of the 100 folders) vs ``dvc add``
* ``readd_spread`` the same with the 200 changed files spread over every folder (reported for honesty:
                 a shard-based store rewrites every shard an edit touches)
* ``big_add``    the 1 GiB file; ``big_edit``: 1 MiB overwritten in its middle, re-ingested (new bytes stored)
* ``push``       into a repository on the S3 server (SeaweedFS on loopback) vs ``dvc push``
* ``pull``       checkout from S3 into a fresh workspace vs ``dvc pull`` into a fresh clone

Run (after ``bash benchmarks/setup_dvc_env.sh``)::

    .venv/bin/python -m benchmarks.bench_ingest --runs 3 --out benchmarks/results/ingest.json

Writes JSON (and a PNG next to it when matplotlib is importable).

Clean-up waits for the end. On ext4 without a journal (as here), creating files soon
after many were deleted is several times slower for any tool: the kernel's inode
allocator skips over recently freed inode slots (``recently_deleted()`` in
fs/ext4/ialloc.c) at a cost per creation, until they are reused. Deleting a run's
60,000-100,000 files between runs made the next tool's file creation pay for it, so the
working folders are set aside (their big files deleted at once: few inodes) and deleted
after the last run. ``dvc checkout`` still follows the deletion of DVC's workspace, as
DVC's workflow requires. Before the first run, 200,000 empty files take the slots that an
earlier clean-up freed, and the tools take turns going first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATASET = [str(ROOT / ".venv" / "bin" / "dataset")]
DVC = str(ROOT / ".bench-venv-dvc" / "bin" / "dvc")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    """Run a command; return its wall time; raise with its stderr on failure.

    Dirty pages of the previous step are flushed first (for both tools alike), so one
    step's writeback does not land in the next step's time. DVC's usage analytics are off:
    by default every ``dvc`` command forks a daemon that tries to send a report (no network
    here), which would compete with the timed work for the two cores.
    """
    os.sync()
    start = time.perf_counter()
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", **(env or {})}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


class Trash:
    """Folders set aside now and deleted by :meth:`empty` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def discard(self, path: Path) -> None:
        """Delete the big files under ``path`` now and move the rest aside."""
        for folder, _, names in os.walk(path):
            for name in names:
                file = Path(folder) / name
                if file.stat().st_size > 1 << 20:
                    file.unlink()
        path.rename(self.root / uuid.uuid4().hex)

    def empty(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def absorb_freed_inodes(root: Path, n: int = 200_000) -> Path:
    """Create ``n`` empty files under ``root`` (kept until the end) before anything is timed.

    They take the inode slots that earlier deletes (a previous benchmark's clean-up)
    freed, so the first timed step does not pay ext4's recently-deleted penalty (see the
    module docstring) and the later ones do not either.
    """
    for start in range(0, n, 10_000):
        folder = root / f"a{start // 10_000:03d}"
        folder.mkdir(parents=True)
        for i in range(10_000):
            os.close(os.open(folder / f"{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    return root


def make_small_files(root: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(n):
        folder = root / f"d{i % 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:06d}.bin").write_bytes(rng.randbytes(rng.randint(8 << 10, 12 << 10)))


def edit_files(root: Path, fraction: float, seed: int, spread: bool) -> int:
    files = sorted(root.rglob("*.bin"))
    k = int(len(files) * fraction)
    rng = random.Random(seed)
    chosen = rng.sample(files, k) if spread else [f for f in files if f.parent.name in ("d040", "d041")][:k]
    for f in chosen:
        data = bytearray(f.read_bytes())
        data[rng.randrange(len(data))] ^= 0xFF
        f.write_bytes(bytes(data))
    return len(chosen)


def make_big_file(path: Path, size: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(size // (16 << 20)):
            f.write(rng.randbytes(16 << 20))


def overwrite_middle(path: Path, size: int, seed: int) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(random.Random(seed).randbytes(size))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def repo_bytes(path: Path) -> int:
    """Stored data bytes: objects, packs and deltas of a tierdata repository, else the whole folder."""
    parts = [path / "objects", path / "packs", path / "deltas"]
    if not parts[0].exists():
        return dir_bytes(path)
    return sum(dir_bytes(p) for p in parts if p.exists())


def bench_tierdata(
    work: Path, small: Path, big: Path, s3: Any, shard_args: list[str], trash: Trash
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    proj = work / "td"
    proj.mkdir()
    repo = work / "td-repo"
    run([*DATASET, "init", str(repo)], proj)
    out["add"] = run([*DATASET, "ingest", str(small), *shard_args], proj) + run(
        [*DATASET, "version", "-m", "small"], proj
    )
    out["add_repo_bytes"] = repo_bytes(repo)
    target = work / "td-out"
    out["checkout"] = run([*DATASET, "checkout", "main", "--to", str(target)], proj)
    trash.discard(target)
    for label, spread in (("readd", False), ("readd_spread", True)):
        before = repo_bytes(repo)
        edit_files(small, 0.01, seed=7 if spread else 8, spread=spread)
        out[f"{label}_ingest"] = run([*DATASET, "ingest", str(small), *shard_args], proj)
        out[label] = out[f"{label}_ingest"] + run([*DATASET, "version", "-m", label, "--replace"], proj)
        out[f"{label}_new_bytes"] = repo_bytes(repo) - before
    before = repo_bytes(repo)
    out["big_add"] = run([*DATASET, "ingest", str(big), "--format", "files"], proj) + run(
        [*DATASET, "version", "-m", "big", "--replace"], proj
    )
    out["big_add_bytes"] = repo_bytes(repo) - before
    overwrite_middle(big, 1 << 20, seed=9)
    before = repo_bytes(repo)
    out["big_edit"] = run([*DATASET, "ingest", str(big), "--format", "files"], proj) + run(
        [*DATASET, "version", "-m", "edit", "--replace"], proj
    )
    out["big_edit_new_bytes"] = repo_bytes(repo) - before
    if s3 is not None:
        proj_s3 = work / "td-s3"
        proj_s3.mkdir()
        url = s3.unique_url()
        env = s3.env()
        run([*DATASET, "init", url], proj_s3, env)
        out["push"] = run([*DATASET, "ingest", str(small), *shard_args], proj_s3, env) + run(
            [*DATASET, "version", "-m", "s"], proj_s3, env
        )
        fresh = work / "td-s3-fresh"
        fresh.mkdir()
        run([*DATASET, "init", url], fresh, env)
        out["pull"] = run([*DATASET, "checkout", "main", "--to", str(work / "td-s3-out")], fresh, env)
    return out


def bench_dvc(work: Path, small: Path, big: Path, s3: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    proj = work / "dvc"
    proj.mkdir()
    data = proj / "small"
    shutil.copytree(small, data)
    run([DVC, "init", "--no-scm", "-q"], proj)
    run([DVC, "config", "cache.type", "copy"], proj)
    out["add"] = run([DVC, "add", "-q", "small"], proj)
    out["add_repo_bytes"] = dir_bytes(proj / ".dvc" / "cache")
    shutil.rmtree(data)
    out["checkout"] = run([DVC, "checkout", "-q"], proj)
    for label, spread in (("readd", False), ("readd_spread", True)):
        before = dir_bytes(proj / ".dvc" / "cache")
        edit_files(data, 0.01, seed=7 if spread else 8, spread=spread)
        out[label] = run([DVC, "add", "-q", "small"], proj)
        out[f"{label}_new_bytes"] = dir_bytes(proj / ".dvc" / "cache") - before
    shutil.copy(big, proj / "big.bin")
    before = dir_bytes(proj / ".dvc" / "cache")
    out["big_add"] = run([DVC, "add", "-q", "big.bin"], proj)
    out["big_add_bytes"] = dir_bytes(proj / ".dvc" / "cache") - before
    overwrite_middle(proj / "big.bin", 1 << 20, seed=9)
    before = dir_bytes(proj / ".dvc" / "cache")
    out["big_edit"] = run([DVC, "add", "-q", "big.bin"], proj)
    out["big_edit_new_bytes"] = dir_bytes(proj / ".dvc" / "cache") - before
    if s3 is not None:
        env = s3.env()
        pproj = work / "dvc-s3"
        pproj.mkdir()
        shutil.copytree(small, pproj / "small")
        run([DVC, "init", "--no-scm", "-q"], pproj)
        run([DVC, "config", "cache.type", "copy"], pproj)
        bucket_url = s3.unique_url()
        run([DVC, "remote", "add", "-d", "s3", bucket_url], pproj)
        run([DVC, "remote", "modify", "s3", "endpointurl", env["AWS_ENDPOINT_URL"]], pproj)
        run([DVC, "add", "-q", "small"], pproj)
        out["push"] = run([DVC, "push", "-q"], pproj, env)
        clone = work / "dvc-s3-clone"
        clone.mkdir()
        run([DVC, "init", "--no-scm", "-q"], clone)
        shutil.copy(pproj / ".dvc" / "config", clone / ".dvc" / "config")
        shutil.copy(pproj / "small.dvc", clone / "small.dvc")
        out["pull"] = run([DVC, "pull", "-q"], clone, env)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--no-dvc", action="store_true")
    parser.add_argument("--shard-size", help="tierdata's --shard-size for the small files (default: its own)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ingest.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.bytecode import compile_bytecode
    from tests.s3server import start_s3_server

    compile_bytecode()

    server = None if args.no_s3 else start_s3_server()
    s3 = server.endpoint if server else None
    runs: dict[str, list[dict[str, Any]]] = {"tierdata": [], "dvc": []}
    # absolute: the tools run in folders of their own
    bench_tmp = os.path.abspath(os.environ["BENCH_TMP"]) if os.environ.get("BENCH_TMP") else None
    trash = Trash(Path(tempfile.mkdtemp(prefix="bench-trash-", dir=bench_tmp)))
    trash.discard(absorb_freed_inodes(Path(tempfile.mkdtemp(prefix="bench-absorb-", dir=bench_tmp))))
    try:
        for i in range(args.runs):
            # Alternate which tool goes first, so neither always follows the other's writeback.
            for tool in ("tierdata", "dvc") if i % 2 == 0 else ("dvc", "tierdata"):
                if tool == "dvc" and args.no_dvc:
                    continue
                work = Path(tempfile.mkdtemp(prefix=f"bench-{tool}-", dir=bench_tmp))
                try:
                    small, big = work / "src-small", work / "src-big.bin"
                    make_small_files(small, args.files, seed=i)
                    make_big_file(big, args.big_mib << 20, seed=i)
                    subprocess.run(["sync"], check=False)
                    if tool == "tierdata":
                        shard_args = ["--shard-size", args.shard_size] if args.shard_size else []
                        result = bench_tierdata(work, small, big, s3, shard_args, trash)
                    else:
                        result = bench_dvc(work, small, big, s3)
                finally:
                    trash.discard(work)
                runs[tool].append(result)
                print(json.dumps({"run": i, "tool": tool, **result}), file=sys.stderr)
    finally:
        trash.empty()
        if server:
            server.stop()
    medians = {
        tool: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for tool, rs in runs.items() if rs
    }
    ratios = {}
    if medians.get("dvc"):
        for k, v in medians["tierdata"].items():
            if not k.endswith(("bytes", "_ingest")) and medians["dvc"].get(k):
                ratios[k] = round(medians["dvc"][k] / v, 2)
    report = {
        "runs": runs,
        "median": medians,
        "speedup_vs_dvc": ratios,
        "files": args.files,
        "big_mib": args.big_mib,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({"median": medians, "speedup_vs_dvc": ratios}, indent=1))
    try:
        plot(report, args.out.with_suffix(".png"))
    except ImportError:
        pass


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [
        k
        for k in ("add", "checkout", "readd", "big_add", "big_edit", "push", "pull")
        if k in report["median"]["tierdata"]
    ]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for j, tool in enumerate(("tierdata", "dvc")):
        if tool in report["median"]:
            vals = [report["median"][tool].get(s, 0) for s in steps]
            ax.bar([i + j * width for i in range(len(steps))], vals, width, label=tool)
    ax.set_xticks([i + width / 2 for i in range(len(steps))], steps)
    ax.set_ylabel("wall seconds (median)")
    ax.set_title("ingest / checkout / S3: tierdata vs DVC")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
