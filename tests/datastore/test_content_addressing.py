"""Acceptance 3: identical data stores nothing new; a 1% edit stores at most 10% new bytes
(records edited in one region, and small files edited at random over every folder);
the same input gives the same data hash in separate processes. Small shards are stored
in packs, so a files dataset is a few store objects, not one per shard."""

from __future__ import annotations

import json
import random
from pathlib import Path

from datastore.repo import Repo
from datastore.sample import sample_records
from tests.datastore.conftest import run_cli_process


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_reingest_identical_stores_nothing(cli, repo_url: str, tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    _write(src, list(sample_records(3000)))
    assert cli("init", repo_url).code == 0
    first = cli("ingest", src, "--json").json
    assert first["new_bytes"] > 0
    cli("version", "-m", "one")
    again = cli("ingest", src, "--json").json
    assert again["new_bytes"] == 0 and again["bytes"] == first["bytes"]


def test_one_percent_edit_stores_at_most_ten_percent(cli, local_url: str, tmp_path: Path) -> None:
    # A 1% edit of one region of the data (records revised in place, some removed and
    # re-added elsewhere would be the same): only the shards holding it are rewritten.
    # Edits spread at random over every shard necessarily rewrite every shard they touch.
    rows = list(sample_records(20000, seed=3))
    src = tmp_path / "d.jsonl"
    _write(src, rows)
    assert cli("init", local_url).code == 0
    first = cli("ingest", src, "--shard-size", "128KB", "--json").json
    assert first["shards"] >= 20
    cli("version", "-m", "base")
    start = random.Random(7).randrange(len(rows) - 200)
    for i in range(start, start + len(rows) // 100):
        rows[i] = {**rows[i], "text": rows[i]["text"] + " edited"}
    _write(src, rows)
    second = cli("ingest", src, "--shard-size", "128KB", "--json").json
    assert second["records"] == 20000
    assert second["new_bytes"] <= 0.10 * first["bytes"], (second, first)
    v2 = cli("version", "-m", "edit", "--replace", "--json").json
    diff = cli("diff", "main~1", "main", "--json").json
    assert diff["added_records"] == 200 and diff["removed_records"] == 200, diff
    assert v2["records"] == 20000


def test_same_input_same_data_hash_in_two_processes(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    _write(src, list(sample_records(2000, seed=5)))
    hashes = []
    for name in ("p1", "p2"):
        project = tmp_path / name
        project.mkdir()
        assert run_cli_process("init", tmp_path / f"repo-{name}", cwd=project).code == 0
        assert run_cli_process("ingest", src, cwd=project).code == 0
        result = run_cli_process("version", "-m", "same", "--json", cwd=project)
        assert result.code == 0, result.err
        hashes.append(result.json["data_hash"])
    assert hashes[0] == hashes[1]


def _small_files(root: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(n):
        folder = root / f"d{i % 20:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}.bin").write_bytes(rng.randbytes(rng.randint(8 << 10, 12 << 10)))


def _stored_bytes(repo: Repo) -> int:
    return sum(info.size for prefix in ("objects/", "packs/", "deltas/") for info in repo.store.list(prefix))


def test_small_files_are_stored_in_a_few_packs(cli, repo_url: str, tmp_path: Path) -> None:
    src = tmp_path / "files"
    _small_files(src, 2000, seed=1)
    assert cli("init", repo_url).code == 0
    first = cli("ingest", src, "--json").json
    assert first["shards"] >= 100 and first["new_bytes"] >= first["bytes"] > 0
    repo = Repo.open(workspace=cli.project)
    keys = [info.key for info in repo.store.list("")]
    packs = [k for k in keys if k.startswith("packs/")]
    assert not [k for k in keys if k.startswith("objects/")]  # no shard stored on its own
    assert 2 <= len(packs) <= 6, packs  # ~21 MB: two packs, each with its index
    cli("version", "-m", "files")
    assert cli("verify", "--json").json["ok"]
    again = cli("ingest", src, "--json").json
    assert again["new_bytes"] == 0 and again["bytes"] == first["bytes"]
    before = _stored_bytes(repo)
    cli("version", "-m", "same", "--replace")
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out).code == 0
    assert sorted(p.read_bytes() for p in out.rglob("*.bin")) == sorted(
        p.read_bytes() for p in src.rglob("*.bin")
    )
    assert _stored_bytes(repo) - before < 4096  # a version record and a shard table at most


def test_scattered_one_percent_edit_of_small_files_stores_at_most_ten_percent(
    cli, local_url: str, tmp_path: Path
) -> None:
    # 1% of 2,000 small files, each changed by one byte, spread over every folder.
    src = tmp_path / "files"
    _small_files(src, 2000, seed=2)
    assert cli("init", local_url).code == 0
    first = cli("ingest", src, "--json").json
    cli("version", "-m", "base")
    repo = Repo.open(workspace=cli.project)
    before = _stored_bytes(repo)
    rng = random.Random(3)
    files = sorted(src.rglob("*.bin"))
    for path in rng.sample(files, len(files) // 100):
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0xFF
        path.write_bytes(bytes(data))
    second = cli("ingest", src, "--json").json
    assert second["records"] == 2000
    assert 0 < second["new_bytes"] <= 0.10 * first["bytes"], (second, first)
    assert _stored_bytes(repo) - before <= 0.10 * first["bytes"]  # what the store really grew by
    cli("version", "-m", "edit", "--replace")
    diff = cli("diff", "main~1", "main", "--json").json
    assert diff["added_records"] == 20 and diff["removed_records"] == 20, diff
