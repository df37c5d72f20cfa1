"""Dedup as a recorded version: `dataset dedup` and `dataset ingest --dedup`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import distributed
import pyarrow.parquet as pq

from datastore.repo import Repo
from datastore.sample import write_sample_jsonl


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dedup_makes_an_audited_version(cli, repo_url: str, tmp_path: Path, caplog) -> None:
    src = tmp_path / "c.jsonl"
    write_sample_jsonl(src, 3000, seed=2, duplicate_rate=0.2)
    assert cli("init", repo_url).code == 0
    cli("ingest", src, "--shard-size", "64KB")
    raw = cli("version", "-m", "raw", "--json").json
    result = cli("dedup", "--json").json
    assert {"removed_records", "clusters", "version"} <= set(result)
    assert result["removed_records"] > 0 and result["clusters"] > 0
    shown = cli("show", "--json").json
    assert shown["version"] == result["version"] and shown["parents"] == [raw["version"]]
    assert shown["records"] == raw["records"] - result["removed_records"]
    op = shown["operation"]
    assert (
        op["op"] == "dedup"
        and op["params"]["threshold"] == 0.8
        and op["result"]["removed_records"] == result["removed_records"]
    )

    repo = Repo.open(workspace=cli.project)
    audit = pq.read_table(io.BytesIO(repo.objects.get(op["audit"])))
    removed = audit.filter(audit.column("action").to_numpy(zero_copy_only=False) == "removed")
    assert removed.num_rows == result["removed_records"]
    # every removed record has a kept representative that precedes it in version order
    assert all(
        r < rec
        for r, rec in zip(removed.column("representative").to_pylist(), removed.column("record").to_pylist())
    )

    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "jsonl").code == 0
    kept = [r for part in sorted(out.glob("*.jsonl")) for r in _rows(part)]
    original = _rows(src)
    removed_ids = {original[i]["id"] for i in removed.column("record").to_pylist()}
    assert [r["id"] for r in kept] == [r["id"] for r in original if r["id"] not in removed_ids]
    texts = [r["text"] for r in kept]
    assert len(texts) == len(set(texts))  # no exact duplicate survives
    assert cli("verify", "--all", "--json").json["ok"]

    exact_run = cli("dedup", raw["version"], "--method", "exact", "--json")
    exact = exact_run.json
    assert 0 < exact["removed_records"] <= result["removed_records"]
    assert "not the branch head's" in caplog.text  # main moves back to raw's data: said so


def test_ingest_with_dedup_records_it_in_the_version(cli, local_url: str, tmp_path: Path) -> None:
    first = tmp_path / "a.jsonl"
    write_sample_jsonl(first, 1000, seed=5, duplicate_rate=0.0)
    second = tmp_path / "b.jsonl"
    rows = _rows(first)[:100] + [
        {"id": 10_000 + i, "text": f"brand new document number {i} " * 8, "label": 1, "score": 0.5}
        for i in range(50)
    ]
    second.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli("init", local_url).code == 0
    cli("ingest", first)
    cli("version", "-m", "base")
    staged = cli("ingest", second, "--dedup", "exact", "--json").json
    assert staged["dedup"]["removed_records"] == 100  # copies of the parent's records
    v = cli("version", "-m", "more", "--json").json
    assert v["records"] == 1050
    assert v["operation"]["params"]["dedup"]["method"] == "exact"
    assert v["operation"]["audit"] and v["operation"]["result"]["removed_records"] == 100
    assert cli("verify", "--all").code == 0


def test_ingest_with_dedup_counts_only_what_it_removes(cli, local_url: str, tmp_path: Path) -> None:
    # The parent holds 30 duplicates of its own: they stay, and are not counted or audited.
    docs = [f"document {i} " * 10 for i in range(320)]
    base = [{"id": i, "text": docs[i]} for i in range(320)] + [
        {"id": 320 + i, "text": docs[i]} for i in range(30)
    ]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    new = [{"id": 1000 + i, "text": f"fresh text {i} " * 10} for i in range(50)]
    again = [{"id": 2000 + i, "text": docs[100 + i]} for i in range(7)]  # copies of the parent's
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new + again))
    assert cli("init", local_url).code == 0
    cli("ingest", tmp_path / "a.jsonl")
    cli("version", "-m", "base")
    staged = cli("ingest", tmp_path / "b.jsonl", "--dedup", "exact", "--json").json
    assert staged["dedup"]["removed_records"] == 7 and staged["dedup"]["clusters"] == 7
    v = cli("version", "-m", "more", "--json").json
    assert v["records"] == 350 + 50
    assert v["operation"]["result"]["removed_records"] == 7
    repo = Repo.open(workspace=cli.project)
    audit = pq.read_table(io.BytesIO(repo.objects.get(v["operation"]["audit"])))
    removed = audit.filter(audit.column("action").to_numpy(zero_copy_only=False) == "removed")
    assert sorted(removed.column("record").to_pylist()) == list(range(400, 407))
    assert sorted(removed.column("representative").to_pylist()) == list(range(100, 107))


def test_dedup_on_a_dask_cluster_matches_one_process(local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    write_sample_jsonl(src, 2000, seed=9, duplicate_rate=0.2)
    project = tmp_path / "p"
    project.mkdir()
    repo = Repo.init(local_url, workspace=project)
    repo.ingest(src, shard_size=64 << 10)
    raw = repo.commit("raw").version
    repo.branch("other", raw)
    alone = repo.dedup()
    repo.checkout("other")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        clustered = repo.dedup(client=client)
    assert clustered["removed_records"] == alone["removed_records"]
    assert repo.show(clustered["version"]).record.data_hash == repo.show(alone["version"]).record.data_hash
