"""The training example: killed with SIGKILL mid-epoch, resumed, every sample exactly once per epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_tiny.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if alive:
            time.sleep(0.2)
    return alive


@pytest.mark.slow
def test_killed_training_resumes_and_sees_every_sample_once(tmp_path):
    data, run, pids = tmp_path / "data", tmp_path / "run", tmp_path / "pids"
    assert _run("--data", str(data), "--make-data").returncode == 0
    common = [
        "--data",
        str(data),
        "--run",
        str(run),
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--num-workers",
        "2",
        "--checkpoint-every",
        "4",
        "--pid-file",
        str(pids),
    ]

    report = tmp_path / "shm.json"
    crashed = _run(*common, "--crash-after", "10", "--shm-report", str(report))
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    # the crash came after step 8's checkpoint: steps 9 and 10 are in the log but not in the model
    assert len((run / "seen.txt").read_text().splitlines()) == 10 * 16

    orphans = [int(p) for p in pids.read_text().split()]
    assert orphans and not _wait_gone(orphans, timeout=20), "DataLoader workers outlived the killed trainer"
    # everything in /dev/shm the trainer and its workers held at the crash is gone now
    held = json.loads(report.read_text())
    assert [p for p in held if os.path.exists(p)] == [], "the crash left shared memory behind"

    resumed = _run(*common)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    seen = Counter(tuple(map(int, line.split())) for line in (run / "seen.txt").read_text().splitlines())
    records = 6 * 50
    for epoch in (0, 1):
        ids = sorted(i for (e, i), n in seen.items() if e == epoch for _ in range(n))
        assert ids == list(range(records)), f"epoch {epoch}: a sample was repeated or lost"
