"""Acceptance 4: version (append / --replace), log, show, diff, tag, branch, checkout, with --json."""

from __future__ import annotations

import json
from pathlib import Path

VERSION_KEYS = {"version", "records", "shards", "bytes", "parents", "message", "created"}


def _jsonl(path: Path, start: int, n: int) -> Path:
    path.write_text(
        "".join(json.dumps({"id": i, "text": f"record {i}"}) + "\n" for i in range(start, start + n))
    )
    return path


def test_history_commands(cli, repo_url: str, tmp_path: Path) -> None:
    assert cli("init", repo_url).code == 0
    refused = cli("version", "-m", "empty", "--json")
    assert refused.code == 1 and "nothing staged" in refused.json["error"]

    assert cli("ingest", _jsonl(tmp_path / "a.jsonl", 0, 100)).code == 0
    v1 = cli("version", "-m", "first", "--tag", "v1", "--json").json
    assert set(v1) >= VERSION_KEYS and v1["records"] == 100 and v1["parents"] == []

    assert cli("ingest", _jsonl(tmp_path / "b.jsonl", 100, 50)).code == 0
    v2 = cli("version", "-m", "append", "--json").json
    assert v2["records"] == 150 and v2["parents"] == [v1["version"]]

    assert cli("ingest", _jsonl(tmp_path / "c.jsonl", 1000, 30)).code == 0
    v3 = cli("version", "-m", "replace", "--replace", "--json").json
    assert v3["records"] == 30 and v3["parents"] == [v2["version"]]

    log = cli("log", "--json").json
    assert [e["version"] for e in log] == [v3["version"], v2["version"], v1["version"]]
    assert all(set(e) >= VERSION_KEYS for e in log)
    assert cli("version", "list", "--json").json == log
    assert [e["version"] for e in cli("log", "v1", "--json").json] == [v1["version"]]

    shown = cli("show", v2["version"][:10], "--json").json
    assert shown["version"] == v2["version"] and shown["message"] == "append"
    assert cli("show", "main~1", "--json").json["version"] == v2["version"]

    d12 = cli("diff", "v1", v2["version"], "--json").json
    assert {"added_records", "removed_records", "added_shards", "removed_shards"} <= set(d12)
    assert d12["added_records"] == 50 and d12["removed_records"] == 0
    d23 = cli("diff", v2["version"], "main", "--json").json
    assert d23["added_records"] == 30 and d23["removed_records"] == 150

    assert cli("branch", "exp", "v1", "--json").json == {"branch": "exp", "version": v1["version"]}
    assert cli("tag", "v1", "main").code == 1  # tags never move
    assert cli("tag", "--json").json == {"v1": v1["version"]}

    # checkout by branch attaches HEAD; commits land on that branch
    assert cli("checkout", "exp", "--json").json["head"] == {"branch": "exp"}
    assert cli("ingest", _jsonl(tmp_path / "d.jsonl", 5000, 10)).code == 0
    v4 = cli("version", "-m", "on exp", "--json").json
    assert v4["parents"] == [v1["version"]] and v4["records"] == 110
    assert cli("branch", "--json").json == {"exp": v4["version"], "main": v3["version"]}

    # checkout by tag or id detaches; committing there is refused
    assert cli("checkout", "v1", "--json").json["head"] == {"version": v1["version"]}
    status = cli("status", "--json").json
    assert status["detached"] and status["version"] == v1["version"]
    assert cli("ingest", _jsonl(tmp_path / "e.jsonl", 9000, 5)).code == 0
    detached = cli("version", "-m", "nope")
    assert detached.code == 1 and "detached" in detached.err
    assert cli("checkout", "main").code == 0
    assert cli("status", "--json").json["branch"] == "main"


def test_unknown_refs_are_named(cli, local_url: str) -> None:
    assert cli("init", local_url).code == 0
    for args in (("show", "nosuchref"), ("checkout", "nosuchref"), ("diff", "a", "b"), ("log", "deadbeef")):
        result = cli(*args)
        assert result.code == 1, args
        assert args[1] in result.err and "Traceback" not in result.err
        assert len(result.err.strip().splitlines()) == 1
