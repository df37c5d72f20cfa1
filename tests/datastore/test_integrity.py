"""Acceptance 7: verify names every corrupt or missing object and exits 1; a checkout that meets
corruption fails loudly and writes no wrong record."""

from __future__ import annotations

import json
from pathlib import Path

from cachetier.objects import object_key
from datastore.repo import Repo
from datastore.sample import write_sample_jsonl


def test_verify_and_checkout_detect_corruption(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    write_sample_jsonl(src, 20000, seed=4)
    assert cli("init", local_url).code == 0
    cli("ingest", src, "--shard-size", "256KB")
    assert cli("version", "-m", "v").code == 0
    assert cli("verify", "--json").json["ok"]
    repo = Repo.open(workspace=cli.project)
    shards = repo.shard_table().hashes()
    assert len(shards) >= 3
    corrupt, missing = shards[1], shards[2]
    path = Path(local_url) / object_key(corrupt)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    (Path(local_url) / object_key(missing)).unlink()

    result = cli("verify", "--json")
    assert result.code == 1
    problems = {p["object"]: p["problem"] for p in result.json["problems"]}
    assert problems == {corrupt: "corrupt", missing: "missing"}
    assert corrupt in result.err and missing in result.err

    out = tmp_path / "out"
    failed = cli("checkout", "main", "--to", out, "--format", "jsonl")
    assert failed.code == 1 and ("corrupt" in failed.err or "no such key" in failed.err)

    # whatever was written before the failure holds only original records
    def canon(line: str) -> str:
        return json.dumps(json.loads(line), sort_keys=True)

    original = {canon(line) for line in src.read_text().splitlines()}
    for part in out.glob("*.jsonl"):
        assert all(canon(line) in original for line in part.read_text().splitlines())
    assert not list(out.glob(".*.tmp"))
