"""Acceptance 2: every format comes back from `checkout --to` as it went in, locally and on S3."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from datastore.sample import write_sample_jsonl


def _read_jsonl_dir(folder: Path) -> list[dict]:
    rows: list[dict] = []
    for part in sorted(folder.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in part.read_text("utf-8").splitlines())
    return rows


def _init(cli, url: str) -> None:
    assert cli("init", url, "--json").code == 0


def test_jsonl_round_trip(cli, repo_url: str, tmp_path: Path) -> None:
    src = tmp_path / "data.jsonl"
    rows = [
        {"id": i, "text": f"héllo {i} ✓", "tags": ["a", "b"][: i % 3], "meta": {"k": i % 5, "ok": i % 2 == 0}}
        for i in range(500)
    ]
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    _init(cli, repo_url)
    assert cli("ingest", src, "--json").code == 0
    version = cli("version", "-m", "jsonl", "--json").json
    assert version["records"] == 500
    out = tmp_path / "out"
    assert cli("checkout", version["version"], "--to", out, "--format", "jsonl", "--json").code == 0
    assert _read_jsonl_dir(out) == rows


def test_parquet_round_trip_keeps_types(cli, repo_url: str, tmp_path: Path) -> None:
    table = pa.table(
        {
            "i8": pa.array([1, -2, None, 4], pa.int8()),
            "u32": pa.array([1, 2, 3, 4], pa.uint32()),
            "f32": pa.array([1.5, None, -0.25, 3.0], pa.float32()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 12, 0, i) for i in range(4)], pa.timestamp("ms", tz="UTC")
            ),
            "d": pa.array([dt.date(2020, 1, i + 1) for i in range(4)], pa.date32()),
            "s": pa.array(["a", None, "ç", ""], pa.string()),
            "b": pa.array([b"\x00\x01", b"", None, b"\xff"], pa.binary()),
            "l": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64())),
            "st": pa.array([{"x": 1, "y": "a"}, None, {"x": 3, "y": None}, {"x": 4, "y": "d"}]),
        }
    )
    src = tmp_path / "t.parquet"
    pq.write_table(table, src)
    _init(cli, repo_url)
    assert cli("ingest", src).code == 0
    assert cli("version", "-m", "pq").code == 0
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "parquet").code == 0
    back = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("*.parquet")))
    assert back.schema.remove_metadata() == table.schema.remove_metadata()
    assert back.to_pylist() == table.to_pylist()


def test_csv_round_trip(cli, repo_url: str, tmp_path: Path) -> None:
    src = tmp_path / "data.csv"
    src.write_text("id,name,score\n" + "".join(f"{i},name {i},{i / 4}\n" for i in range(300)), "utf-8")
    _init(cli, repo_url)
    assert cli("ingest", src).code == 0
    assert cli("version", "-m", "csv").code == 0
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "csv").code == 0
    original = pacsv.read_csv(src)
    back = pa.concat_tables(pacsv.read_csv(p) for p in sorted(out.glob("*.csv")))
    assert back.to_pylist() == original.to_pylist()


def test_csv_identifiers_with_leading_zeros_round_trip_as_written(cli, repo_url: str, tmp_path: Path) -> None:
    rows = [["zip", "code", "n"], ["00501", "-07", "1"], ["10001", "0x1F", "2"], ["02134", "12", "3"]]
    src = tmp_path / "ids.csv"
    src.write_text("".join(",".join(row) + "\n" for row in rows), "utf-8")
    _init(cli, repo_url)
    assert cli("ingest", src).code == 0
    assert cli("version", "-m", "ids").code == 0
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "csv").code == 0
    back = [row for p in sorted(out.glob("*.csv")) for row in csv.reader(p.open(newline=""))]
    assert back == rows


def test_text_round_trip(cli, repo_url: str, tmp_path: Path) -> None:
    lines = [f"line {i} — ünïcode" for i in range(1000)] + ["", "last"]
    src = tmp_path / "data.txt"
    src.write_text("\n".join(lines) + "\n", "utf-8")
    _init(cli, repo_url)
    assert cli("ingest", src).code == 0
    assert cli("version", "-m", "text").code == 0
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "text").code == 0
    back = "".join(p.read_text("utf-8") for p in sorted(out.glob("*.txt"))).split("\n")[:-1]
    assert back == lines


def _make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "a.bin": os.urandom(5000),
        "empty.txt": b"",
        "nested/deeper/x.dat": b"x" * 70000,
        "nested/ünïcødé 名前.txt": "non-ASCII ✓".encode(),
        "spaces in name/file (1).txt": b"hello\n",
        "big.bin": os.urandom(6 << 20),
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_files_round_trip_byte_identical(cli, repo_url: str, tmp_path: Path) -> None:
    src = tmp_path / "tree"
    files = _make_tree(src)
    _init(cli, repo_url)
    assert cli("ingest", src, "--json").json["records"] == len(files)
    assert cli("version", "-m", "files").code == 0
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--json").code == 0
    assert _tree(out) == files


@pytest.mark.slow
def test_sample_corpus_round_trip_and_counts(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "sample.jsonl"
    write_sample_jsonl(src, 20000)
    _init(cli, local_url)
    ingest = cli("ingest", src, "--json").json
    assert ingest["records"] == 20000 and ingest["shards"] >= 1
    version = cli("version", "-m", "sample", "--json").json
    out = tmp_path / "out"
    assert cli("checkout", version["version"], "--to", out).code == 0
    original = [json.loads(line) for line in src.read_text().splitlines()]
    assert _read_jsonl_dir(out) == original
