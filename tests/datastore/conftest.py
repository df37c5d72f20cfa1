"""Fixtures for the Repo and CLI tests: a repository URL (local or on the real S3 server)
and a way to run the ``dataset`` CLI in-process or as a separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from datastore.cli import main


@dataclass
class CliResult:
    """What one CLI run gave: exit code, stdout, stderr, and stdout parsed as JSON if it is."""

    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture(params=["local", "s3"])
def repo_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh repository URL: a local folder, or a prefix on the real S3 server."""
    if request.param == "local":
        return str(tmp_path / "repo")
    request.getfixturevalue("s3_env")
    return request.getfixturevalue("s3_url")


@pytest.fixture
def local_url(tmp_path: Path) -> str:
    """A fresh local repository path."""
    return str(tmp_path / "repo")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Run ``dataset ARGS...`` in-process in a project folder; returns a CliResult."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)

    def run(*args: str, cwd: Path | None = None) -> CliResult:
        capsys.readouterr()
        monkeypatch.chdir(cwd or project)
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    run.project = project  # type: ignore[attr-defined]
    return run


def run_cli_process(*args: str, cwd: Path, timeout: float = 120) -> CliResult:
    """Run ``dataset ARGS...`` in a separate Python process."""
    proc = subprocess.run(
        [sys.executable, "-m", "datastore.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
