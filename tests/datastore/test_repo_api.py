"""The Repo API and CLI around HEAD and URLs: `checkout HEAD` stays on the branch, every
spelling of a local path names one repository, and a wrong argument type or a ref past
the first version is a one-line error naming what was given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cachetier.errors import BadInputError, NotFoundError
from datastore.repo import Repo


def _jsonl(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(n)))
    return path


def test_checkout_head_stays_on_the_branch(cli, local_url: str, tmp_path: Path) -> None:
    assert cli("init", local_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", 5))
    cli("version", "-m", "one")
    out = cli("checkout", "HEAD", "--to", tmp_path / "out", "--json")
    assert out.code == 0 and (tmp_path / "out").is_dir()
    status = cli("status", "--json").json
    assert status["branch"] == "main" and not status["detached"]
    cli("ingest", _jsonl(tmp_path / "b.jsonl", 3))
    assert cli("version", "-m", "two", "--json").json["records"] == 8
    repo = Repo.open(workspace=cli.project)
    repo.checkout(None)
    assert repo.head.branch == "main"


def test_each_spelling_of_a_local_path_is_one_repository(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path / "ws")
    repo = Repo.init("../repo", workspace=".")
    assert repo.url == (tmp_path / "repo").as_uri()
    repo.ingest([_jsonl(tmp_path / "a.jsonl", 4)])
    for spelling in (tmp_path / "repo", "../repo", "../ws/../repo", f"{tmp_path}/./repo"):
        again = Repo.open(os.fspath(spelling), workspace=".")
        assert again.workspace is not None and again.status()["staged"]["records"] == 4
    Repo.init(tmp_path / "repo", workspace=".")  # the same repository: its staged data stays
    assert Repo.open(workspace=".").status()["staged"]["records"] == 4
    # A workspace written before URLs were normalized keeps working.
    config = Path(".dataset/config.json")
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "repo": (tmp_path / "ws").as_uri() + "/../repo"}))
    assert Repo.open(os.fspath(tmp_path / "repo"), workspace=".").status()["staged"]["records"] == 4
    Repo.init(tmp_path / "repo", workspace=".")
    assert Repo.open(workspace=".").status()["staged"]["records"] == 4


def test_wrong_argument_types_and_refs_past_the_root_name_what_was_given(
    cli, local_url: str, tmp_path: Path
) -> None:
    assert cli("init", local_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", 2))
    cli("version", "-m", "one")
    repo = Repo.open(workspace=cli.project)
    for call in (repo.log, repo.show, repo.diff, repo.checkout, repo.verify):
        with pytest.raises(BadInputError, match="ref"):
            call(5)
    with pytest.raises(BadInputError, match="path or URL"):
        Repo.open(5)
    with pytest.raises(NotFoundError) as info:
        repo.resolve("HEAD~9")
    assert str(info.value).startswith("HEAD~9:")
    failed = cli("log", "HEAD~9")
    assert failed.code == 1 and failed.err.startswith("error: HEAD~9:")
