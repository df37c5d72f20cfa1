"""Commands that run at once in one workspace neither lose nor repeat staged data: the
staging area is read again and rewritten under the workspace's lock. A named pipe
holds an ingest open while the other command runs, so the overlap is certain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.datastore.conftest import run_cli_process

_ROOT = Path(__file__).resolve().parents[2]


def _rows(path: Path, start: int, n: int) -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(start, start + n))
    )
    return path


def _ingest_from_pipe(project: Path, pipe: Path) -> subprocess.Popen:
    """Start `dataset ingest PIPE` (it waits for the pipe's writer)."""
    os.mkfifo(pipe)
    return subprocess.Popen(
        [sys.executable, "-m", "datastore.cli", "ingest", str(pipe), "--format", "jsonl"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _feed(pipe: Path, start: int, n: int) -> None:
    with open(pipe, "w") as f:
        f.write("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(start, start + n)))


def test_an_ingest_that_ends_after_another_keeps_both(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    assert run_cli_process("init", tmp_path / "repo", cwd=project).code == 0
    slow = _ingest_from_pipe(project, tmp_path / "slow.jsonl")
    fast = run_cli_process("ingest", _rows(tmp_path / "fast.jsonl", 0, 300), cwd=project)
    assert fast.code == 0, fast.err
    _feed(tmp_path / "slow.jsonl", 1000, 200)
    assert slow.wait(timeout=60) == 0, slow.stderr.read()
    status = run_cli_process("status", "--json", cwd=project).json
    assert status["staged"]["records"] == 500 and status["staged"]["ingests"] == 2
    version = run_cli_process("version", "-m", "both", "--json", cwd=project).json
    assert version["records"] == 500


def test_an_ingest_that_ends_after_a_commit_does_not_bring_it_back(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    assert run_cli_process("init", tmp_path / "repo", cwd=project).code == 0
    assert run_cli_process("ingest", _rows(tmp_path / "x.jsonl", 0, 100), cwd=project).code == 0
    slow = _ingest_from_pipe(project, tmp_path / "slow.jsonl")
    assert run_cli_process("version", "-m", "x", cwd=project).code == 0
    _feed(tmp_path / "slow.jsonl", 1000, 50)
    assert slow.wait(timeout=60) == 0, slow.stderr.read()
    status = run_cli_process("status", "--json", cwd=project).json
    assert status["staged"]["records"] == 50  # only the pipe's records: x is committed
    assert run_cli_process("version", "-m", "more", "--json", cwd=project).json["records"] == 150


def test_two_commits_at_once_commit_the_staged_data_once(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    assert run_cli_process("init", tmp_path / "repo", cwd=project).code == 0
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    for round_ in range(4):
        assert (
            run_cli_process(
                "ingest", _rows(tmp_path / f"{round_}.jsonl", round_ * 100, 100), cwd=project
            ).code
            == 0
        )
        both = [
            subprocess.Popen(
                [sys.executable, "-m", "datastore.cli", "version", "-m", f"{round_}{who}"],
                cwd=project,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for who in "ab"
        ]
        codes = sorted(p.wait(timeout=60) for p in both)
        errors = [p.stderr.read() for p in both]
        assert codes == [0, 1], errors
        assert any("nothing staged" in e for e in errors)
        shown = run_cli_process("show", "--json", cwd=project).json
        assert shown["records"] == 100 * (round_ + 1)
