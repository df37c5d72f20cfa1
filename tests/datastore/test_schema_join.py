"""New data joins the schema of what it is appended to when it fits it losslessly (columns
in another order, columns with no values in this batch); data that does not fit is
refused, and `dataset reset` drops what is staged. The ingest index's remembered schema
is only reused for the same sources read the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datastore._schema import fits_schema


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _checked_out(cli, ref: str, to: Path) -> pa.Table:
    assert cli("checkout", ref, "--to", to, "--format", "parquet").code == 0
    return pq.read_table(to)


def test_append_takes_the_parents_schema_when_the_data_fits(cli, repo_url: str, tmp_path: Path) -> None:
    assert cli("init", repo_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", [{"id": 1, "t": "a", "tags": ["x"]}]))
    assert cli("version", "-m", "one").code == 0
    # No value for t, keys in another order, an empty list: all fit (id:int64, t:string, tags:list<string>).
    late = _jsonl(tmp_path / "b.jsonl", [{"tags": [], "id": 7, "t": None}, {"id": 8, "tags": []}])
    assert cli("ingest", late).code == 0
    again = _jsonl(tmp_path / "c.jsonl", [{"t": "c", "id": 9, "tags": None}])  # staged beside b: joins it
    assert cli("ingest", again).code == 0
    out = cli("version", "-m", "two", "--json")
    assert out.code == 0, out.err
    assert out.json["records"] == 4
    table = _checked_out(cli, "main", tmp_path / "out")
    assert table.schema.names == ["id", "t", "tags"]
    assert table.schema.field("t").type == pa.string()
    assert table.schema.field("tags").type == pa.list_(pa.string())
    assert table.to_pylist() == [
        {"id": 1, "t": "a", "tags": ["x"]},
        {"id": 7, "t": None, "tags": []},
        {"id": 8, "t": None, "tags": []},
        {"id": 9, "t": "c", "tags": None},
    ]


def test_data_that_does_not_fit_is_refused_and_reset_drops_it(cli, local_url: str, tmp_path: Path) -> None:
    assert cli("init", local_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", [{"id": 1, "t": "a"}]))
    cli("version", "-m", "one")
    head = cli("status", "--json").json["version"]
    assert cli("ingest", _jsonl(tmp_path / "b.jsonl", [{"id": 2, "t": "b", "extra": 1.5}])).code == 0
    refused = cli("version", "-m", "two")
    assert refused.code == 1 and "schema" in refused.err and "dataset reset" in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    staged_twice = cli("ingest", _jsonl(tmp_path / "c.jsonl", [{"id": 3}, {"id": 4, "t": 5}]))
    assert staged_twice.code == 1 and "already staged" in staged_twice.err and "c.jsonl" in staged_twice.err
    reset = cli("reset", "--json")
    assert reset.code == 0 and reset.json["dropped"]["records"] == 1
    status = cli("status", "--json").json
    assert status["staged"]["ingests"] == 0 and status["version"] == head
    assert cli("reset").out.strip() == "nothing staged"
    assert cli("version", "-m", "nothing").code == 1  # nothing staged any more
    assert cli("ingest", _jsonl(tmp_path / "d.jsonl", [{"id": 5, "t": "d"}])).code == 0
    assert cli("version", "-m", "two", "--json").json["records"] == 2


def test_a_replace_keeps_its_own_schema(cli, local_url: str, tmp_path: Path) -> None:
    # Data that does not fit the parent's columns is read as it is, so --replace can take it.
    assert cli("init", local_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", [{"id": 1, "t": "a"}]))
    cli("version", "-m", "one")
    cli("ingest", _jsonl(tmp_path / "b.jsonl", [{"id": 2}]))
    assert cli("version", "-m", "two", "--replace").code == 0
    assert _checked_out(cli, "main", tmp_path / "out").to_pylist() == [{"id": 2}]


def test_version_without_a_message_is_a_usage_error(cli, local_url: str, tmp_path: Path) -> None:
    assert cli("init", local_url).code == 0
    cli("ingest", _jsonl(tmp_path / "a.jsonl", [{"id": 1}]))
    result = cli("version")
    assert result.code == 2 and "-m" in result.err


def test_remembered_schema_is_not_reused_across_formats_options_or_neighbours(
    cli, local_url: str, tmp_path: Path
) -> None:
    assert cli("init", local_url).code == 0
    lines = tmp_path / "a.txt"
    lines.write_text("hello\nworld\n")
    assert cli("ingest", lines).code == 0
    cli("reset")
    as_body = cli("ingest", lines, "--text-column", "body")
    assert as_body.code == 0, as_body.err
    assert cli("version", "-m", "body").code == 0
    assert _checked_out(cli, "main", tmp_path / "o1").schema.names == ["body"]
    a = _jsonl(tmp_path / "x.jsonl", [{"x": 1}])
    b = _jsonl(tmp_path / "y.jsonl", [{"y": "b"}])
    assert cli("ingest", a, b).code == 0  # together: columns x and y
    cli("reset")
    assert cli("ingest", a).code == 0  # alone: no column y from the earlier read
    assert cli("version", "-m", "x", "--replace").code == 0
    assert _checked_out(cli, "main", tmp_path / "o2").to_pylist() == [{"x": 1}]


@pytest.mark.parametrize(
    ("own", "target", "fits"),
    [
        ({"a": pa.int64(), "b": pa.null()}, {"a": pa.int64(), "b": pa.string()}, True),
        ({"b": pa.string(), "a": pa.int64()}, {"a": pa.int64(), "b": pa.string()}, True),
        ({"a": pa.list_(pa.null())}, {"a": pa.list_(pa.int64())}, True),
        (
            {"s": pa.struct([("y", pa.null()), ("x", pa.int64())])},
            {"s": pa.struct([("x", pa.int64()), ("y", pa.string())])},
            True,
        ),
        ({"a": pa.int64()}, {"a": pa.float64()}, False),  # a cast, not a fit
        ({"a": pa.int64()}, {"a": pa.int64(), "b": pa.string()}, False),  # a missing column
        ({"a": pa.int64(), "c": pa.null()}, {"a": pa.int64()}, False),  # an extra column
        ({"a": pa.string()}, {"a": pa.null()}, False),
    ],
)
def test_fits_schema(own: dict, target: dict, fits: bool) -> None:
    assert fits_schema(pa.schema(own), pa.schema(target)) is fits


def test_parquet_sources_in_another_column_order_or_with_null_columns_join(
    cli, local_url: str, tmp_path: Path
) -> None:
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "ab.parquet")
    pq.write_table(pa.table({"b": ["z"], "a": [3]}), tmp_path / "ba.parquet")
    pq.write_table(pa.table({"a": [4], "b": pa.nulls(1)}), tmp_path / "a_null.parquet")
    assert cli("init", local_url).code == 0
    both = cli("ingest", tmp_path / "ab.parquet", tmp_path / "ba.parquet")
    assert both.code == 0, both.err
    cli("version", "-m", "one")
    late = cli("ingest", tmp_path / "a_null.parquet")
    assert late.code == 0, late.err
    assert cli("version", "-m", "two").code == 0
    table = _checked_out(cli, "main", tmp_path / "out")
    assert table.schema == pa.schema({"a": pa.int64(), "b": pa.string()})
    assert table.to_pylist() == [
        {"a": 1, "b": "x"},
        {"a": 2, "b": "y"},
        {"a": 3, "b": "z"},
        {"a": 4, "b": None},
    ]


def test_parquet_with_a_duplicate_column_name_is_refused(cli, local_url: str, tmp_path: Path) -> None:
    pq.write_table(
        pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]), tmp_path / "d.parquet"
    )
    assert cli("init", local_url).code == 0
    result = cli("ingest", tmp_path / "d.parquet")
    assert result.code == 1 and "d.parquet" in result.err and "duplicate column name 'a'" in result.err
    assert cli("status", "--json").json["staged"]["ingests"] == 0
