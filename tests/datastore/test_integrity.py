"""Acceptance 7: verify names every corrupt or missing object and exits 1; a checkout that meets
corruption fails loudly and writes no wrong record."""

from __future__ import annotations

import json
from pathlib import Path

from cachetier.packs import index_key, pack_key
from datastore.repo import Repo
from datastore.sample import write_sample_jsonl


def test_verify_and_checkout_detect_corruption(cli, local_url: str, tmp_path: Path) -> None:
    # Two ingests, two versions: the small shards of each ingest share one pack.
    src = tmp_path / "d.jsonl"
    write_sample_jsonl(src, 20000, seed=4)
    more = tmp_path / "e.jsonl"
    write_sample_jsonl(more, 5000, seed=5)
    assert cli("init", local_url).code == 0
    cli("ingest", src, "--shard-size", "256KB")
    assert cli("version", "-m", "v").code == 0
    first = set(Repo.open(workspace=cli.project).shard_table().hashes())
    cli("ingest", more, "--shard-size", "256KB")
    assert cli("version", "-m", "w").code == 0
    assert cli("verify", "--json").json["ok"]
    repo = Repo.open(workspace=cli.project)
    shards = repo.shard_table().hashes()
    second = [h for h in shards if h not in first]
    assert len(first) >= 3 and second
    corrupt = shards[1]
    where = repo.objects.packs.locate(corrupt)
    gone = repo.objects.packs.locate(second[0])
    assert where is not None and gone is not None and where.packid != gone.packid
    path = Path(local_url) / pack_key(where.packid)
    data = bytearray(path.read_bytes())
    data[where.offset + where.length // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    (Path(local_url) / pack_key(gone.packid)).unlink()
    (Path(local_url) / index_key(gone.packid)).unlink()
    missing = [h for h in shards if (m := repo.objects.packs.locate(h)) and m.packid == gone.packid]

    result = cli("verify", "--json")
    assert result.code == 1
    problems = {p["object"]: p["problem"] for p in result.json["problems"]}
    assert problems == {corrupt: "corrupt", **{m: "missing" for m in missing}}
    assert corrupt in result.err and all(m in result.err for m in missing)

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


def test_verify_all_lists_every_problem_of_every_ref(cli, local_url: str, tmp_path: Path) -> None:
    # A corrupt shard table, a corrupt shard elsewhere and a ref that holds no version id:
    # verify --all names all three (it stopped at the first unreadable shard table).
    assert cli("init", local_url).code == 0
    for name, tag in (("a", ["--tag", "first"]), ("b", [])):
        write_sample_jsonl(tmp_path / f"{name}.jsonl", 3000, seed=ord(name))
        cli("ingest", tmp_path / f"{name}.jsonl", "--shard-size", "64KB")
        assert cli("version", "-m", name, *tag).code == 0
    repo = Repo.open(workspace=cli.project)
    first, second = repo.resolve("first"), repo.resolve("main")
    table_hash = repo.show(second).record.data_hash
    table_path = Path(local_url) / "objects" / table_hash[:2] / table_hash
    data = bytearray(table_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table_path.write_bytes(bytes(data))
    shard = repo.shard_table(first).hashes()[0]
    where = repo.objects.packs.locate(shard)
    shard_path = Path(local_url) / (pack_key(where.packid) if where else f"objects/{shard[:2]}/{shard}")
    data = bytearray(shard_path.read_bytes())
    data[(where.offset + where.length // 2) if where else len(data) // 2] ^= 0xFF
    shard_path.write_bytes(bytes(data))
    (Path(local_url) / "refs" / "heads" / "broken").write_text("not a version id\n")

    result = cli("verify", "--all", "--json")
    assert result.code == 1
    found = {(p["kind"], p["object"], p["problem"]) for p in result.json["problems"]}
    assert found == {
        ("shard table", table_hash, "corrupt"),
        ("shard", shard, "corrupt"),
        ("ref", "refs/heads/broken", "corrupt"),
    }
    assert result.json["versions"] == 2
