"""Acceptance 8: bad input exits 1 with one line naming the file and line, stages and commits
nothing; --on-error skip keeps the good records; a files checkout never writes outside --to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from datastore.repo import Repo, schema_to_dict
from datastore.shards import write_shards
from versioning import ShardEntry, make_operation


def _assert_one_line_error(result, *needles: str) -> None:
    assert result.code == 1, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert "Traceback" not in result.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _nothing_staged(cli) -> None:
    status = cli("status", "--json").json
    assert status["staged"]["ingests"] == 0


BAD_SOURCES = {
    "bad.jsonl": (b'{"a": 1}\n{"a": 2}\n{"a": 3,,}\n{"a": 4}\n', ":3"),
    "bad.csv": (b"a,b\n1,2\n3,4\n5,6,7\n", ":4"),
    "bad.parquet": (b"PAR1" + os.urandom(200), "bad.parquet"),
    "garbage.jsonl": (os.urandom(3000), "garbage.jsonl"),
}


@pytest.mark.parametrize("name", sorted(BAD_SOURCES))
def test_malformed_sources(cli, local_url: str, tmp_path: Path, name: str) -> None:
    data, where = BAD_SOURCES[name]
    src = tmp_path / name
    src.write_bytes(data)
    assert cli("init", local_url).code == 0
    result = cli("ingest", src)
    _assert_one_line_error(result, name, where)
    _nothing_staged(cli)
    assert cli("log", "--json").json == []


def test_missing_path_and_json_error(cli, local_url: str, tmp_path: Path) -> None:
    assert cli("init", local_url).code == 0
    result = cli("ingest", tmp_path / "nope.jsonl", "--json")
    _assert_one_line_error(result, "nope.jsonl")
    assert "nope.jsonl" in result.json["error"]
    _nothing_staged(cli)


def test_second_source_failing_stages_nothing(cli, local_url: str, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"a": 1}\n{"a": 2}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    assert cli("init", local_url).code == 0
    _assert_one_line_error(cli("ingest", good, bad), "bad.jsonl:2")
    _nothing_staged(cli)


def test_on_error_skip_keeps_good_records(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "mixed.jsonl"
    lines = [json.dumps({"a": i}) for i in range(100)]
    lines[10] = "{broken"
    lines[50] = "[1, 2"
    src.write_text("\n".join(lines) + "\n")
    assert cli("init", local_url).code == 0
    result = cli("ingest", src, "--on-error", "skip", "--json")
    assert result.code == 0, result.err
    assert result.json["records"] == 98 and result.json["skipped"] == 2


def test_files_checkout_never_writes_outside_target(cli, local_url: str, tmp_path: Path) -> None:
    assert cli("init", local_url).code == 0
    repo = Repo.open(workspace=cli.project)
    evil = ["../escape.txt", "/tmp/abs-escape.txt", "ok/../../escape2.txt", "fine.txt"]
    batch = pa.record_batch(
        {
            "path": pa.array(evil, pa.string()),
            "size": pa.array([1] * len(evil), pa.int64()),
            "data": pa.array([b"x"] * len(evil), pa.large_binary()),
            "chunks": pa.array([None] * len(evil), pa.list_(pa.string())),
        }
    )
    entries = []
    for shard in write_shards([batch]):
        repo.objects.put(shard.data, shard.hash)
        entries.append(
            ShardEntry(shard.hash, shard.records, shard.bytes, shard.uncompressed_bytes, 0, shard.chunks)
        )
    repo.commit_table(
        entries,
        schema=schema_to_dict(batch.schema),
        base=None,
        message="evil",
        operation=make_operation("ingest", params={"format": "files"}),
    )
    out = tmp_path / "box" / "out"
    result = cli("checkout", "main", "--to", out)
    _assert_one_line_error(result, "..")
    assert not (tmp_path / "box" / "escape.txt").exists()
    assert not Path("/tmp/abs-escape.txt").exists()
    assert not list((tmp_path / "box").rglob("escape*"))
