"""Checkouts that must fail cleanly, or that must leave exactly the version in the folder.

A version that can be made must be checked out: a file that changes while a ``files``
ingest reads it is refused there, not recorded with a size its chunks do not have. A
checkout that cannot be done says why in one line naming the path or column (exit 1),
before writing anything where it can know in advance, and removes what it wrote.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from cachetier.errors import BadInputError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore._ingestfiles import FilesIngest
from datastore._pipeline import Uploader
from datastore._sourcebase import SourceSpec
from datastore.chunking import ChunkOptions
from datastore.files import walk_files
from datastore.shards import ShardOptions

CHUNKS = ChunkOptions(threshold=64 << 10, min_size=4 << 10, avg_size=16 << 10, max_size=64 << 10)


def one_line_error(result, *needles: str) -> str:
    """Assert a user error: exit 1, one line on stderr naming each of ``needles``, no traceback."""
    assert result.code == 1, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    assert "internal error" not in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def init(cli, url: str) -> None:
    assert cli("init", url).code == 0


def commit(cli, *ingest_args: str) -> str:
    assert cli("ingest", *ingest_args).code == 0
    return cli("version", "-m", "v", "--json").json["version"]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- files that change while read


def ingest_listed(tmp_path: Path, root: Path, entries) -> list:
    """Run a files ingest of ``entries`` as listed (perhaps before the files changed)."""
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    with Uploader(objects, workers=2, budget=64 << 20) as up:
        run = FilesIngest(up, ShardOptions(), CHUNKS, None, None, time.time_ns())
        try:
            run.run_source(SourceSpec(str(root), "src", "files", 0, 0), entries)
            return run.finish()
        finally:
            run.close()


def grow(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(os.urandom(100_000))


def shrink(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1000)


def rewrite_same_size(path: Path) -> None:
    mtime = path.stat().st_mtime_ns
    path.write_bytes(os.urandom(path.stat().st_size))
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))


@pytest.mark.parametrize("change", [grow, shrink, rewrite_same_size])
def test_a_big_file_that_changed_after_its_listing_is_refused(tmp_path: Path, change) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(400_000))  # chunked: above CHUNKS.threshold
    entries = walk_files(str(root))
    change(root / "big.bin")
    with pytest.raises(BadInputError) as caught:
        ingest_listed(tmp_path, root, entries)
    assert str(caught.value) == "src/big.bin: file changed while it was being read (ingest it again)"


def test_a_big_file_unchanged_since_its_listing_is_ingested(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(400_000))
    shards = ingest_listed(tmp_path, root, walk_files(str(root)))
    assert sum(s.records for s in shards) == 1


def test_a_small_file_that_grew_after_its_listing_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "src"
    root.mkdir()
    (root / "small.bin").write_bytes(b"x" * 1000)
    entries = walk_files(str(root))
    grow(root / "small.bin")
    with pytest.raises(BadInputError) as caught:
        ingest_listed(tmp_path, root, entries)
    assert str(caught.value) == "src/small.bin: file changed while it was being read (ingest it again)"


# ---------------------------------------------------------------- files checkout: paths


def test_backslashes_are_ordinary_characters_of_posix_names(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "dir\\name").mkdir(parents=True)
    (src / "back\\slash").write_bytes(b"one")
    (src / "dir\\name" / "a\\..\\b").write_bytes(b"two")
    (src / "\\").write_bytes(b"three")
    init(cli, local_url)
    commit(cli, "--format", "files", src)
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out).code == 0
    assert tree(out) == tree(src)


def make_file_and_folder(cli, local_url: str, tmp_path: Path) -> None:
    """Version 1: a file ``x``; version 2 appends ``x/y`` and ``z``."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"a file")
    (tmp_path / "b" / "x").mkdir(parents=True)
    (tmp_path / "b" / "x" / "y").write_bytes(b"a file in a folder")
    (tmp_path / "b" / "z").write_bytes(b"z")
    init(cli, local_url)
    commit(cli, "--format", "files", tmp_path / "a")
    commit(cli, "--format", "files", tmp_path / "b")


def test_a_path_that_is_a_file_and_a_folder_is_refused_before_writing(
    cli, local_url: str, tmp_path: Path
) -> None:
    make_file_and_folder(cli, local_url, tmp_path)
    out = tmp_path / "out"
    one_line_error(cli("checkout", "main", "--to", out), "'x' is both a file and a folder")
    assert not out.exists()
    out.mkdir()
    one_line_error(cli("checkout", "main", "--to", out), "'x'")
    assert list(out.iterdir()) == []
    assert cli("checkout", "main", "--to", tmp_path / "rows", "--format", "jsonl").code == 0


def test_one_ingest_of_two_folders_with_a_file_and_a_folder_is_refused(
    cli, local_url: str, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_bytes(b"a file")
    (tmp_path / "b" / "x").mkdir(parents=True)
    (tmp_path / "b" / "x" / "y").write_bytes(b"a file in a folder")
    init(cli, local_url)
    commit(cli, "--format", "files", tmp_path / "a", tmp_path / "b")
    one_line_error(cli("checkout", "main", "--to", tmp_path / "out"), "'x'")
    assert not (tmp_path / "out").exists()


def test_appended_files_without_conflicts_check_out(cli, local_url: str, tmp_path: Path) -> None:
    for name, files in {"a": {"x/1": b"1", "y": b"2"}, "b": {"x/2": b"3", "xx/y": b"4", "x.y": b"5"}}.items():
        for rel, data in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_bytes(data)
    init(cli, local_url)
    commit(cli, "--format", "files", tmp_path / "a")
    commit(cli, "--format", "files", tmp_path / "b")
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out).code == 0
    assert tree(out) == {**tree(tmp_path / "a"), **tree(tmp_path / "b")}


def test_a_file_or_folder_of_the_target_in_the_way_is_a_user_error(
    cli, local_url: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"1")
    (src / "g").write_bytes(b"2")
    init(cli, local_url)
    commit(cli, "--format", "files", src)
    out = tmp_path / "out"
    out.mkdir()
    (out / "d").write_bytes(b"mine")  # a file where the version has a folder
    one_line_error(cli("checkout", "main", "--to", out), str(out / "d"), "in the way")
    assert (out / "d").read_bytes() == b"mine"
    (out / "d").unlink()
    (out / "g").mkdir()  # a folder where the version has a file
    one_line_error(cli("checkout", "main", "--to", out), str(out / "g"), "in the way")


# ---------------------------------------------------------------- JSON Lines of nanosecond types

NS = 1_700_000_000_123_456_789


def test_jsonl_writes_nanosecond_times_without_pandas(cli, local_url: str, tmp_path: Path) -> None:
    table = pa.table(
        {
            "ts": pa.array([NS, -1, NS - 789, 1_700_000_000_000_000_001, None], pa.timestamp("ns")),
            "utc": pa.array([NS, 0, NS, NS, None], pa.timestamp("ns", tz="UTC")),
            "ny": pa.array([NS, 0, NS, NS, None], pa.timestamp("ns", tz="America/New_York")),
            "dur": pa.array([1_234_567_891, -1, 0, 5 * 10**9, None], pa.duration("ns")),
            "tod": pa.array([3_723_123_456_789, 3_723_000_000_005, 0, 1000, None], pa.time64("ns")),
            "nested": pa.array(
                [[{"t": NS, "s": "a"}], [], None, [{"t": None, "s": None}], [{"t": 0, "s": "b"}]],
                pa.list_(pa.struct([("t", pa.timestamp("ns")), ("s", pa.string())])),
            ),
            "us": pa.array([NS // 1000, 0, 1, 2, None], pa.timestamp("us", tz="+02:00")),
            "ms": pa.array([NS // 10**6, 0, 1, 2, None], pa.timestamp("ms")),
            "dur_us": pa.array([1_234_567, 0, 1, 2, None], pa.duration("us")),
            "tod_us": pa.array([3_723_123_456, 0, 1, 2, None], pa.time64("us")),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    init(cli, local_url)
    commit(cli, tmp_path / "t.parquet")
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "jsonl").code == 0
    rows = [json.loads(line) for line in (out / "part-00000.jsonl").read_text().splitlines()]
    column = {name: [r[name] for r in rows] for name in table.column_names}
    assert column["ts"] == [
        "2023-11-14T22:13:20.123456789",
        "1969-12-31T23:59:59.999999999",
        "2023-11-14T22:13:20.123456",  # whole microseconds: as a microsecond timestamp
        "2023-11-14T22:13:20.000000001",
        None,
    ]
    assert column["utc"][:2] == ["2023-11-14T22:13:20.123456789+00:00", "1970-01-01T00:00:00+00:00"]
    assert column["ny"][:2] == ["2023-11-14T17:13:20.123456789-05:00", "1969-12-31T19:00:00-05:00"]
    assert column["dur"] == [1.234567891, -1e-09, 0.0, 5.0, None]
    assert column["tod"] == ["01:02:03.123456789", "01:02:03.000000005", "00:00:00", "00:00:00.000001", None]
    assert column["nested"] == [
        [{"t": "2023-11-14T22:13:20.123456789", "s": "a"}],
        [],
        None,
        [{"t": None, "s": None}],
        [{"t": "1970-01-01T00:00:00", "s": "b"}],
    ]
    # Other units are written as before.
    assert column["us"][:2] == ["2023-11-15T00:13:20.123456+02:00", "1970-01-01T02:00:00+02:00"]
    assert column["ms"][:2] == ["2023-11-14T22:13:20.123000", "1970-01-01T00:00:00"]
    assert column["dur_us"][:2] == [1.234567, 0.0]
    assert column["tod_us"][:2] == ["01:02:03.123456", "00:00:00"]


def test_whole_microsecond_nanoseconds_read_as_microseconds(cli, local_url: str, tmp_path: Path) -> None:
    values = [NS - 789, 0, -1000, 1_600_000_000_000_001_000]
    zones = [None, "UTC", "Europe/Paris", "-03:30"]
    columns = {}
    for i, tz in enumerate(zones):
        columns[f"ns{i}"] = pa.array(values, pa.timestamp("ns", tz=tz))
        columns[f"us{i}"] = pa.array([v // 1000 for v in values], pa.timestamp("us", tz=tz))
    table = pa.table(columns)
    pq.write_table(table, tmp_path / "t.parquet")
    init(cli, local_url)
    commit(cli, tmp_path / "t.parquet")
    assert cli("checkout", "main", "--to", tmp_path / "out", "--format", "jsonl").code == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "part-00000.jsonl").read_text().splitlines()]
    for i in range(len(zones)):
        assert [r[f"ns{i}"] for r in rows] == [r[f"us{i}"] for r in rows]


# ---------------------------------------------------------------- a used target folder


def make_versions(cli, local_url: str, tmp_path: Path) -> int:
    """Tag ``many`` (several shards) and ``one`` (one shard) with the same records."""
    src = tmp_path / "r.jsonl"
    src.write_text("".join(f'{{"i": {i}, "s": "{"x" * 40}{i}"}}\n' for i in range(6000)))
    init(cli, local_url)
    assert cli("ingest", src, "--shard-size", "20000").code == 0
    assert cli("version", "-m", "many", "--tag", "many").code == 0
    assert cli("ingest", src, "--shard-size", "100000000").code == 0
    assert cli("version", "-m", "one", "--replace", "--tag", "one").code == 0
    return 6000


def test_a_checkout_over_an_earlier_one_leaves_exactly_the_version(
    cli, local_url: str, tmp_path: Path
) -> None:
    records = make_versions(cli, local_url, tmp_path)
    out = tmp_path / "out"
    assert cli("checkout", "many", "--to", out, "--format", "parquet").code == 0
    assert len(list(out.iterdir())) > 5
    (out / ".part-00003.parquet.0123abcd.tmp").write_bytes(b"left by a killed checkout")
    assert cli("checkout", "one", "--to", out, "--format", "parquet").code == 0
    assert sorted(p.name for p in out.iterdir()) == ["part-00000.parquet"]
    assert pads.dataset(out).count_rows() == records
    assert cli("checkout", "many", "--to", out, "--format", "jsonl").code == 0
    assert {p.suffix for p in out.iterdir()} == {".jsonl"}
    assert sum(len(p.read_text().splitlines()) for p in out.iterdir()) == records


def test_a_folder_holding_other_files_is_refused_and_left_alone(cli, local_url: str, tmp_path: Path) -> None:
    make_versions(cli, local_url, tmp_path)
    out = tmp_path / "out"
    assert cli("checkout", "many", "--to", out, "--format", "parquet").code == 0
    before = tree(out)
    (out / "notes.txt").write_text("mine")
    one_line_error(cli("checkout", "one", "--to", out, "--format", "parquet"), "'notes.txt'", "not empty")
    assert tree(out) == {**before, "notes.txt": b"mine"}
    (out / "notes.txt").unlink()
    (out / "sub").mkdir()
    one_line_error(cli("checkout", "one", "--to", out, "--format", "parquet"), "'sub'")
    assert tree(out) == before


# ---------------------------------------------------------------- user errors, not internal ones


@pytest.mark.parametrize(("column", "value"), [("st", {"x": 1}), ("lst", [1, 2])], ids=["struct", "list"])
def test_csv_of_nested_columns_is_refused_naming_the_column(
    cli, local_url: str, tmp_path: Path, column: str, value
) -> None:
    (tmp_path / "s.jsonl").write_text(f'{{"id": 1, "{column}": {json.dumps(value)}}}\n')
    init(cli, local_url)
    commit(cli, tmp_path / "s.jsonl")
    out = tmp_path / "out"
    one_line_error(cli("checkout", "main", "--to", out, "--format", "csv"), f"column '{column}'")
    assert not out.exists()  # the folder it made is removed


def test_csv_of_bytes_that_are_not_text_is_refused_naming_the_column(
    cli, local_url: str, tmp_path: Path
) -> None:
    pq.write_table(
        pa.table({"id": [1, 2], "blob": pa.array([b"ok", b"\xff\xfe"], pa.binary())}), tmp_path / "b.parquet"
    )
    init(cli, local_url)
    commit(cli, tmp_path / "b.parquet")
    out = tmp_path / "out"
    out.mkdir()
    one_line_error(cli("checkout", "main", "--to", out, "--format", "csv"), "column 'blob'")
    assert list(out.iterdir()) == []  # no part file left


def test_a_target_that_cannot_be_a_folder_is_a_user_error(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"1")
    init(cli, local_url)
    commit(cli, "--format", "files", src)
    plain = tmp_path / "plain"
    plain.write_bytes(b"a file")
    one_line_error(cli("checkout", "main", "--to", plain), str(plain), "not a folder")
    one_line_error(cli("checkout", "main", "--to", plain / "sub" / "dir"), str(plain), "is a file")
    one_line_error(cli("checkout", "main", "--to", plain, "--format", "jsonl"), str(plain))
    assert plain.read_bytes() == b"a file"
    assert cli("checkout", "main", "--to", tmp_path / "ok").code == 0


def test_a_files_checkout_removes_what_a_killed_one_left_beside_its_big_files(
    cli, local_url: str, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "media").mkdir(parents=True)
    big = os.urandom(5 << 20)  # chunked (at least 4 MiB): written through a temp file
    (src / "media" / "big.bin").write_bytes(big)
    (src / "small.txt").write_text("small")
    assert cli("init", local_url).code == 0
    assert cli("ingest", src, "--format", "files").code == 0
    assert cli("version", "-m", "v").code == 0
    out = tmp_path / "out"
    (out / "media").mkdir(parents=True)
    leftover = out / "media" / ".big.bin.0123abcd.tmp"  # a checkout killed mid-write
    leftover.write_bytes(big[:1000])
    theirs = out / "media" / ".notes.0123abcd.tmp"  # the user's: no big file of that name
    theirs.write_text("mine")
    for path in (leftover, theirs):
        os.utime(path, (time.time() - 60, time.time() - 60))
    assert cli("checkout", "main", "--to", out).code == 0
    assert (out / "media" / "big.bin").read_bytes() == big
    assert not leftover.exists() and theirs.read_text() == "mine"
