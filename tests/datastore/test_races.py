"""Acceptance 5: two processes committing to one branch at once never lose an update."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from datastore.repo import Repo
from tests.datastore.race_worker import commit_after_barrier, write_rows

ROUNDS = 20


@pytest.mark.slow
def test_racing_commits_lose_nothing(repo_url: str, tmp_path: Path) -> None:
    projects = []
    for name in ("a", "b"):
        project = tmp_path / name
        project.mkdir()
        Repo.init(repo_url, workspace=project)
        projects.append(project)
    ctx = mp.get_context("fork")  # the children open their own Repo; fork starts them fast
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    landed: list[dict] = []
    for round_no in range(ROUNDS):
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = []
        for project in projects:
            src = tmp_path / f"{project.name}-{round_no}.jsonl"
            write_rows(src, f"{project.name}{round_no}", 10 + round_no)
            procs.append(
                ctx.Process(
                    target=commit_after_barrier,
                    args=(str(project), str(src), f"{project.name} {round_no}", barrier, results, env),
                )
            )
        for p in procs:
            p.start()
        outcomes = [__import__("json").loads(results.get(timeout=120)) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        for outcome in outcomes:
            if outcome["ok"]:
                landed.append(outcome)
            else:
                assert "conflict" in outcome["error"], outcome
    repo = Repo.open(repo_url)
    history = {info.version for info in repo.log("main")}
    assert all(o["version"] in history for o in landed)
    expected_records = sum(10 + int(Path(o["source"]).stem.split("-")[1]) for o in landed)
    assert repo.show("main").record.records == expected_records
    # appends are rebased when safe, so every racing append lands
    assert len(landed) == 2 * ROUNDS
