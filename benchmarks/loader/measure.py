"""Measuring helpers shared by the warm and the cold (S3) loader benchmarks.

Everything here runs inside a benchmark child process (memory, CPU, disk) or spawns one.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DiskSampler",
    "MemorySampler",
    "code_state",
    "cpu_seconds",
    "disk_bytes",
    "median",
    "spawn",
]

ROOT = Path(__file__).resolve().parents[2]


class MemorySampler:
    """Peak summed RSS / PSS of this process and its children, sampled on a thread.

    Both are sampled every ``interval`` (10 Hz): PSS comes from ``smaps_rollup``, about
    1.3 ms per process here, so the thread costs about 4 % of one core with three
    processes; ``cpu_s`` is its own CPU time, which a caller measuring CPU can subtract.
    """

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self._me = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak_rss = 0
        self.peak_pss = 0
        self.cpu_s = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        procs = [self._me, *self._me.children(recursive=True)]
        rss = pss = 0
        for p in procs:
            try:
                info = p.memory_full_info()
            except Exception:
                continue
            rss += info.rss
            pss += info.pss
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            start = time.thread_time()
            self._sample()
            self.cpu_s += time.thread_time() - start

    def reset(self) -> tuple[int, int]:
        """Return the peaks (RSS, PSS) in bytes since the last reset, and start over."""
        self._sample()
        peaks = (self.peak_rss, self.peak_pss)
        self.peak_rss = self.peak_pss = 0
        return peaks

    def stop(self) -> None:
        """Stop the sampling thread."""
        self._stop.set()
        self._thread.join()


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (``st_blocks``, so sparse files count as written)."""
    total = 0
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_blocks * 512
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except FileNotFoundError:  # a loader removed it while we walked
                continue
    return total


class DiskSampler:
    """Peak bytes allocated under each of some folders, sampled on a thread."""

    def __init__(self, folders: Mapping[str, Path], interval: float = 0.5) -> None:
        self._folders = dict(folders)
        self._interval = interval
        self.peak = dict.fromkeys(self._folders, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[str, int]:
        now = {name: disk_bytes(path) for name, path in self._folders.items()}
        for name, size in now.items():
            self.peak[name] = max(self.peak[name], size)
        return now

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def stop(self) -> dict[str, int]:
        """Stop sampling; return the bytes under each folder now (the peaks stay in ``peak``)."""
        self._stop.set()
        self._thread.join()
        return self._sample()


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def cpu_seconds() -> float:
    """CPU time of this process and its waited-for children (DataLoader workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def spawn(
    module: str, spec: dict[str, Any], timeout: float = 1800, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m module _child SPEC`` in a fresh process; return the JSON it prints last."""
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, "_child", json.dumps(spec)],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['loader']} {spec['mode']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    """The median of ``key`` over the runs that have it (None when none has)."""
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


_PACKAGES = ("loaders", "datastore", "cachetier", "versioning")


def code_state() -> dict[str, str]:
    """The commit and a hash of the loader stack's sources as they are now (edits included).

    Recorded at the start and the end of a run: when they differ, the code under test
    changed while the benchmark ran (the tree is shared).
    """
    import hashlib

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return {"commit": head, "sources": digest.hexdigest()[:16]}


def write_results(
    out: Path,
    stem: str,
    args: Any,
    results: Any,
    code_at_start: dict[str, str],
    table: Callable[[], str],
    plot: Callable[[Path], None],
) -> None:
    """Write ``stem.{json,md,png}`` under ``out`` and print the table.

    The JSON records the code state at the start and now; a warning goes to stderr
    when they differ (the code under test changed during the run).
    """
    out.mkdir(parents=True, exist_ok=True)
    code = {"at_start": code_at_start, "at_end": code_state()}
    if code["at_start"] != code["at_end"]:
        print("warning: the loader stack's sources changed during the run", file=sys.stderr)
    (out / f"{stem}.json").write_text(
        json.dumps({"args": vars(args), "code": code, "results": results}, indent=1)
    )
    text = table()
    (out / f"{stem}.md").write_text(text)
    plot(out / f"{stem}.png")
    print(text)
