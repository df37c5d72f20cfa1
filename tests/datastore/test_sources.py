"""Source readers: formats, type inference across blocks, one-line errors, skip counts."""

from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError, NotFoundError
from datastore.files import walk_files
from datastore.sources import (
    ReadContext,
    SchemaWidened,
    detect_format,
    read_source,
    read_table,
    resolve_sources,
)


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def error_of(paths, **kw) -> str:
    with pytest.raises((BadInputError, NotFoundError)) as info:
        read_table([str(p) for p in paths], **kw)
    text = str(info.value)
    assert "\n" not in text
    return text


# ---------------------------------------------------------------- formats


def test_detect_format_by_extension(tmp_path: Path) -> None:
    assert detect_format("a.jsonl") == detect_format("a.ndjson") == detect_format("a.json") == "jsonl"
    assert detect_format("a.parquet") == detect_format("a.PQ") == "parquet"
    assert detect_format("a.csv") == detect_format("a.tsv") == "csv"
    assert detect_format("a.txt") == detect_format("a.txt.gz") == "text"
    assert detect_format("a.jsonl.zst") == "jsonl"
    assert detect_format("a.bin") is None
    write(tmp_path / "d" / "x.bin", b"x")
    assert resolve_sources([tmp_path / "d"])[0].format == "files"


def test_jsonl_records_and_types(tmp_path: Path) -> None:
    src = write(tmp_path / "a.jsonl", '{"a": 1, "b": "x", "c": [1, 2]}\n\n{"a": 2, "d": {"k": true}}\n')
    table, stats = read_table([src])
    assert table.to_pylist() == [
        {"a": 1, "b": "x", "c": [1, 2], "d": None},
        {"a": 2, "b": None, "c": None, "d": {"k": True}},
    ]
    assert table.schema.field("a").type == pa.int64()
    assert stats[0].records == 2 and stats[0].skipped == 0 and len(stats[0].hash) == 64


def test_jsonl_keeps_date_strings_as_strings(tmp_path: Path) -> None:
    src = write(tmp_path / "a.jsonl", '{"when": "2020-01-01"}\n{"when": "2021-02-03"}\n')
    table, _ = read_table([src])
    assert table.column("when").to_pylist() == ["2020-01-01", "2021-02-03"]


def test_csv_tsv_text_parquet(tmp_path: Path) -> None:
    csv_table, _ = read_table([write(tmp_path / "a.csv", "a,b,c\n1,x,2020-01-01\n2,,3\n")])
    assert csv_table.to_pylist() == [{"a": 1, "b": "x", "c": "2020-01-01"}, {"a": 2, "b": "", "c": "3"}]
    tsv_table, _ = read_table([write(tmp_path / "a.tsv", "a\tb\n1\tx y\n")])
    assert tsv_table.to_pylist() == [{"a": 1, "b": "x y"}]
    text_table, _ = read_table([write(tmp_path / "a.txt", "héllo\r\n\nlast")], text_column="body")
    assert text_table.to_pylist() == [{"body": "héllo"}, {"body": ""}, {"body": "last"}]
    original = pa.table(
        {
            "i8": pa.array([1, None], pa.int8()),
            "ts": pa.array([1, 2], pa.timestamp("us", tz="UTC")),
            "dec": pa.array([1, 2], pa.decimal128(10, 2)),
            "tags": pa.array([["a"], []], pa.list_(pa.string())),
        }
    )
    pq.write_table(original, tmp_path / "a.parquet", row_group_size=1)
    parquet_table, _ = read_table([tmp_path / "a.parquet"])
    assert parquet_table.schema.equals(original.schema.remove_metadata())
    assert parquet_table.equals(original)


def test_byte_order_marks_are_dropped(tmp_path: Path) -> None:
    assert read_table([write(tmp_path / "a.jsonl", b'\xef\xbb\xbf{"a": 1}\n')])[0].to_pylist() == [{"a": 1}]
    assert read_table([write(tmp_path / "a.txt", b"\xef\xbb\xbfone\n")])[0].to_pylist() == [{"text": "one"}]


def test_compressed_inputs(tmp_path: Path) -> None:
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(1000))
    write(tmp_path / "a.jsonl.gz", gzip.compress(lines.encode()))
    write(tmp_path / "b.jsonl.zst", zstandard.ZstdCompressor().compress(lines.encode()))
    write(tmp_path / "c.csv.gz", gzip.compress(b"i\n1\n2\n"))
    assert read_table([tmp_path / "a.jsonl.gz"])[0].num_rows == 1000
    assert read_table([tmp_path / "b.jsonl.zst"])[0].column("i").to_pylist() == list(range(1000))
    assert read_table([tmp_path / "c.csv.gz"])[0].column("i").to_pylist() == [1, 2]


def _zstd_frames(data: bytes, frame: int) -> bytes:
    """``data`` as zstd frames of ``frame`` bytes each, one after another (as ``zstd`` appends),
    each with a checksum (as the ``zstd`` command writes by default)."""
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return b"".join(compressor.compress(data[i : i + frame]) for i in range(0, len(data), frame))


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "txt"])
def test_zstd_frames_whole_truncated_or_garbage(tmp_path: Path, suffix: str) -> None:
    rows = [{"i": i, "s": f"row {i}"} for i in range(3000)]
    text = {
        "jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        "csv": "i,s\n" + "".join(f"{r['i']},{r['s']}\n" for r in rows),
        "txt": "".join(f"row {r['i']}\n" for r in rows),
    }[suffix].encode()
    whole = _zstd_frames(text, 10_000)
    ok = write(tmp_path / f"ok.{suffix}.zst", whole)
    table, _ = read_table([ok])
    assert table.num_rows == 3000
    # Cut inside the last frame (a download that stopped): `zstd -t` says "premature end".
    cut = write(tmp_path / f"cut.{suffix}.zst", whole[:-7])
    assert "cut." in error_of([cut]) and "truncated" in error_of([cut])
    assert "truncated" in error_of([cut], on_error="skip")
    junk = write(tmp_path / f"junk.{suffix}.zst", whole[:100] + os.urandom(64) + whole[164:])
    assert "junk." in error_of([junk])
    garbage = write(tmp_path / f"garbage.{suffix}.zst", b"not zstd at all\n" * 10)
    assert "garbage." in error_of([garbage]) and "zstd" in error_of([garbage])


def test_directory_with_explicit_format_expands(tmp_path: Path) -> None:
    write(tmp_path / "d" / "b.jsonl", '{"x": 2}\n')
    write(tmp_path / "d" / "a.jsonl", '{"x": 1}\n')
    write(tmp_path / "d" / "notes.md", "ignored")
    specs = resolve_sources([tmp_path / "d"], "jsonl")
    assert [Path(s.path).name for s in specs] == ["a.jsonl", "b.jsonl"]
    assert read_table([tmp_path / "d"], "jsonl")[0].column("x").to_pylist() == [1, 2]


def test_files_walk_sorted_nested_empty_non_ascii(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for name, data in {"b/z.bin": b"z", "a-c": b"", "a/b/ünï cödé.txt": "ü".encode(), "a/a": b"1"}.items():
        write(root / name, data)
    (root / "emptydir").mkdir()
    entries = walk_files(str(root))
    assert [e.path for e in entries] == ["a-c", "a/a", "a/b/ünï cödé.txt", "b/z.bin"]
    assert [e.size for e in entries] == [0, 1, 2, 1]


def test_files_walk_skips_symlink_loops_like_dangling_links(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write(root / "d" / "f", b"x")
    (root / "self").symlink_to("self")  # a loop: stat says "too many levels of symbolic links"
    (root / "d" / "up").symlink_to("..")  # a symlinked folder: not followed
    (root / "gone").symlink_to("nowhere")
    (root / "link").symlink_to("d/f")  # a symlinked file: followed
    assert [(e.path, e.size) for e in walk_files(str(root))] == [("d/f", 1), ("link", 1)]


# ---------------------------------------------------------------- schema across blocks and sources


def test_types_widen_over_the_whole_file(tmp_path: Path) -> None:
    rows = [{"a": i, "b": None} for i in range(3000)] + [{"a": 0.5, "b": "late", "c": [1]}]
    src = write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    table, _ = read_table([src])
    assert table.schema.field("a").type == pa.float64()
    assert table.schema.field("b").type == pa.string()
    assert table.column("c").to_pylist()[-1] == [1]
    assert table.column("a").to_pylist()[:2] == [0.0, 1.0]


def test_a_later_block_that_widens_raises_the_restart_signal(tmp_path: Path) -> None:
    rows = [{"a": 1}] * 2000 + [{"a": 1.5}]
    src = write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    spec = resolve_sources([src])[0]
    ctx = ReadContext(spec=spec, block_bytes=1024)
    with pytest.raises(SchemaWidened) as info:
        list(read_source(ctx))
    assert info.value.schema.field("a").type == pa.float64()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**40), 2**40),
            st.floats(allow_nan=False, allow_infinity=False, width=32),
            st.text(max_size=5),
            st.lists(st.one_of(st.none(), st.integers(0, 9)), max_size=3),
            st.fixed_dictionaries({}, optional={"x": st.integers(0, 9), "y": st.text(max_size=2)}),
        ),
        min_size=1,
        max_size=60,
    ),
    block=st.integers(16, 400),
)
def test_inferred_schema_does_not_depend_on_block_size(tmp_path: Path, values, block: int) -> None:
    """Same input ⇒ same schema, whatever the blocking (or one clear error naming a line)."""
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"v": v, "k": i}) + "\n" for i, v in enumerate(values)))
    outcomes = []
    for block_bytes in (block, 1 << 20):
        spec = resolve_sources([src])[0]
        hint = None
        while True:
            ctx = ReadContext(spec=spec, schema=hint, block_bytes=block_bytes)
            try:
                batches = list(read_source(ctx))
                outcomes.append(
                    ("ok", str(ctx.schema), pa.Table.from_batches(batches, ctx.schema).to_pylist())
                )
                break
            except SchemaWidened as widened:
                hint = widened.schema
            except BadInputError as e:
                outcomes.append(("error", str(e).split(" (")[0]))
                break
    assert outcomes[0] == outcomes[1]
    if outcomes[0][0] == "ok":
        rows = outcomes[0][2]
        assert all(_same_value(row["v"], v) for row, v in zip(rows, values)), (rows, values)


CELLS = ["1", "-3", "1.5", "1e5", "true", "FALSE", "", "nan", "2020-01-01", "10:00:00", "x", "1_000", "0x1F"]
CELLS += ["00501", "-07", "0", "+5", " 5", "0.5", "NA", "12345678901234567890"]
TEXT_NUMBERS = {"00501", "-07", "0x1F", "12345678901234567890"}  # numbers that keep their column text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from(CELLS), st.sampled_from(CELLS)), min_size=1, max_size=400))
def test_csv_schema_does_not_depend_on_block_size(tmp_path: Path, rows) -> None:
    src = tmp_path / "p.csv"
    src.write_text("a,b\n" + "".join(f"{a},{b}\n" for a, b in rows))
    outcomes = []
    for block_bytes in (1024, 1 << 20):
        spec = resolve_sources([src])[0]
        hint = None
        while True:
            ctx = ReadContext(spec=spec, schema=hint, block_bytes=block_bytes)
            try:
                table = pa.Table.from_batches(list(read_source(ctx)), ctx.schema)
                break
            except SchemaWidened as widened:
                hint = widened.schema
        outcomes.append((str(ctx.schema), table.to_pylist()))
    assert outcomes[0] == outcomes[1]
    for got, cells in zip(outcomes[0][1], rows):
        for k, cell in zip("ab", cells):
            if isinstance(got[k], str):  # text columns give back exactly what was written
                assert got[k] == cell
            elif isinstance(got[k], (int, float)) and not isinstance(got[k], bool):
                assert cell not in TEXT_NUMBERS
                assert got[k] == float(cell)


TEXT_CELLS = st.text(alphabet=st.sampled_from(list('ab ,"\n\r\t;é')), max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(TEXT_CELLS, TEXT_CELLS), min_size=1, max_size=300))
def test_csv_quoted_fields_with_newlines_come_back_whole_in_any_block_size(tmp_path: Path, rows) -> None:
    # Quoted values holding newlines, commas and quotes: a read block may end inside one.
    src = tmp_path / "q.csv"
    with open(src, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["a", "b"])
        writer.writerows([("x" + a, "y" + b) for a, b in rows])  # never empty, so never null
    for block_bytes in (1024, 1 << 20):
        ctx = ReadContext(spec=resolve_sources([src])[0], block_bytes=block_bytes)
        table = pa.Table.from_batches(list(read_source(ctx)), ctx.schema)
        assert table.to_pylist() == [{"a": "x" + a, "b": "y" + b} for a, b in rows]


def test_csv_quoted_crlf_split_between_read_blocks(tmp_path: Path) -> None:
    # Some pad puts the end of a 1 KiB read block between the "\r" and the "\n" of a
    # quoted "\r\n" (Arrow alone then loses the "\n").
    src = tmp_path / "crlf.csv"
    for pad in range(1008, 1024):
        values = ["p" * pad, "a\r\nb", "c\r\n\r\nd"]
        with open(src, "w", newline="") as f:
            csv.writer(f).writerows([["v"], *([v] for v in values)])
        ctx = ReadContext(spec=resolve_sources([src])[0], block_bytes=1024)
        table = pa.Table.from_batches(list(read_source(ctx)), ctx.schema)
        assert table.column("v").to_pylist() == values, pad


def test_csv_quoted_newlines_past_the_first_read_block(tmp_path: Path) -> None:
    src = tmp_path / "m.csv"
    with open(src, "w", newline="") as f:
        csv.writer(f).writerows([["id", "text"], *([i, f"line one\nline two {i}"] for i in range(5000))])
    table, stats = read_table([src], on_error="skip")
    assert table.column("id").to_pylist() == list(range(5000)) and stats[0].skipped == 0
    assert table.column("text")[2185].as_py() == "line one\nline two 2185"


def test_csv_quote_never_closed_names_its_line(tmp_path: Path) -> None:
    src = write(tmp_path / "open.csv", 'a,b\n1,x\n2,"y\n3,4\n5,6\n')
    assert "open.csv:3" in error_of([src]) and "never closed" in error_of([src])
    assert "open.csv:3" in error_of([src], on_error="skip")


def _same_value(got, want) -> bool:
    """JSON equality as Arrow gives values back: 1 == 1.0, absent struct fields are None."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(
            _same_value(got.get(k), want.get(k)) for k in set(got) | set(want)
        )
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(_same_value, got, want))
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want
    return got == want


def test_sources_must_share_one_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": pa.array([1], pa.int32())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": pa.array(["x"])}), tmp_path / "b.parquet")
    text = error_of([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert "b.parquet" in text and "'a'" in text and "int32" in text
    write(tmp_path / "c.jsonl", '{"a": 1, "zz": 2}\n')
    text = error_of([tmp_path / "a.parquet", tmp_path / "c.jsonl"])
    assert "c.jsonl:1" in text and "'zz'" in text
    # JSON Lines sources widen to a common schema; Parquet types are used as they are
    write(tmp_path / "d.jsonl", '{"a": 5}\n')
    table, _ = read_table([tmp_path / "a.parquet", tmp_path / "d.jsonl"])
    assert table.schema.field("a").type == pa.int32() and table.column("a").to_pylist() == [1, 5]
    write(tmp_path / "e.jsonl", '{"b": "x"}\n')
    table, _ = read_table([tmp_path / "d.jsonl", tmp_path / "e.jsonl"])
    assert table.to_pylist() == [{"a": 5, "b": None}, {"a": None, "b": "x"}]


def test_csv_numbers_a_type_would_change_keep_their_column_text(tmp_path: Path) -> None:
    # the only zero-padded ZIP code is far past the first block: the column still comes back text
    zips = [str(10000 + i) for i in range(300_000)] + ["00501"]
    rows = "".join(f"{z},{i},{i % 7 - 3},NA\n" for i, z in enumerate(zips))
    src = write(tmp_path / "z.csv", "zip,n,signed,empty\n" + rows)
    table, _ = read_table([src])
    assert table.schema.field("zip").type == pa.string()
    assert table.column("zip").to_pylist() == zips
    assert table.schema.field("n").type == pa.int64()
    assert table.schema.field("signed").type == pa.int64()
    assert table.schema.field("empty").type == pa.null()
    small = write(tmp_path / "s.csv", "a,b,c,d,e,f\n-07,0x1F,0,0.5, 5,1.5\n1,2,3,4,6,12345678901234567890\n")
    got = read_table([small])[0].to_pylist()
    assert got == [  # a whole number beyond int64 would be rounded as a double: text too
        {"a": "-07", "b": "0x1F", "c": 0, "d": 0.5, "e": 5, "f": "1.5"},
        {"a": "1", "b": "2", "c": 3, "d": 4.0, "e": 6, "f": "12345678901234567890"},
    ]


def test_csv_null_spellings_are_null_in_typed_columns_and_kept_in_text(tmp_path: Path) -> None:
    src = write(tmp_path / "n.csv", "i,f,b,s\n1,1.5,true,x\nNA,-nan,,NA\n,null,False,\n")
    table, _ = read_table([src])
    assert [f.type for f in table.schema] == [pa.int64(), pa.float64(), pa.bool_(), pa.string()]
    assert table.to_pylist() == [
        {"i": 1, "f": 1.5, "b": True, "s": "x"},
        {"i": None, "f": None, "b": None, "s": "NA"},
        {"i": None, "f": None, "b": False, "s": ""},
    ]


def test_csv_widens_leniently(tmp_path: Path) -> None:
    rows = "".join(f"{i},{i}\n" for i in range(200_000))
    src = write(tmp_path / "a.csv", "n,m\n" + rows + "1.5,word\n")
    table, _ = read_table([src])
    assert table.schema.field("n").type == pa.float64()
    assert table.schema.field("m").type == pa.string()
    assert table.column("m").to_pylist()[-1] == "word" and table.num_rows == 200_001


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("bad.jsonl", '{"a": 1}\n{"a": 2}\n\n{"a": 3,,}\n{"a": 4}\n', ["bad.jsonl:4", "invalid JSON"]),
        ("conflict.jsonl", '{"a": 1}\n{"a": "x"}\n', ["conflict.jsonl:2", "'a'", "number to string"]),
        ("array.jsonl", '{"a": 1}\n[1, 2]\n', ["array.jsonl:2", "JSON object"]),
        ("whole.json", '[{"a": 1}]\n', ["whole.json:1", "JSON array"]),
        ("bad.csv", "a,b\n1,2\n3,4\n5,6,7\n8,9\n", ["bad.csv:4", "expected 2 fields, found 3"]),
        ("dup.csv", "a,a\n1,2\n", ["dup.csv:1", "duplicate column"]),
        ("nul.csv", "a,b\n1,\x00\n", ["nul.csv:2", "binary"]),
        ("bad.txt", b"ok\nalso ok\n\xff\xfe\n", ["bad.txt:3", "UTF-8"]),
        ("latin1.jsonl", b'{"a": "ok"}\n{"a": "caf\xe9"}\n', ["latin1.jsonl:2", "UTF-8", "0xe9"]),
        ("latin1key.jsonl", b'{"caf\xe9": 1}\n', ["latin1key.jsonl:1", "UTF-8"]),
        ("empty.jsonl", "", ["empty.jsonl", "empty"]),
        ("empty.txt", "", ["empty.txt", "empty"]),
        ("bad.parquet", b"PAR1" + b"\x01" * 100, ["bad.parquet", "not a Parquet file"]),
    ],
)
def test_bad_input_one_line_naming_file_and_line(
    tmp_path: Path, name: str, data, expected: list[str]
) -> None:
    text = error_of([write(tmp_path / name, data)])
    for needle in expected:
        assert needle in text, text


def test_binary_garbage_and_missing_path(tmp_path: Path) -> None:
    garbage = write(tmp_path / "garbage.jsonl", os.urandom(5000))
    assert "garbage.jsonl:" in error_of([garbage])
    text = error_of([tmp_path / "nope.jsonl"])
    assert "nope.jsonl" in text and "no such file" in text
    with pytest.raises(NotFoundError):
        resolve_sources([tmp_path / "a.jsonl", tmp_path / "nope"])


def test_truncated_parquet(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": list(range(1000))}), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    write(tmp_path / "cut.parquet", data[: len(data) // 2])
    assert "cut.parquet" in error_of([tmp_path / "cut.parquet"])


def test_a_bad_line_is_found_in_a_later_block(tmp_path: Path) -> None:
    lines = [json.dumps({"i": i, "s": "x" * 50}) for i in range(5000)]
    lines[4321] = '{"i": 4321, "s": "unterminated}'
    src = write(tmp_path / "big.jsonl", "\n".join(lines) + "\n")
    spec = resolve_sources([src])[0]
    with pytest.raises(BadInputError, match=r"big\.jsonl:4322"):
        list(read_source(ReadContext(spec=spec, block_bytes=4096)))


def test_skip_keeps_good_records_and_counts_bad_ones(tmp_path: Path) -> None:
    src = write(
        tmp_path / "mixed.jsonl", '{"a": 1}\nnot json\n{"a": 2}\n[3]\n{"a": "str"}\n\x00\x01\n{"a": 4}\n'
    )
    table, stats = read_table([src], on_error="skip")
    assert table.column("a").to_pylist() == [1, 2, 4]
    assert stats[0].skipped == 4
    csv_src = write(tmp_path / "mixed.csv", "a,b\n1,2\n3\n4,5\n6,7,8\n")
    table, stats = read_table([csv_src], on_error="skip")
    assert table.to_pylist() == [{"a": 1, "b": 2}, {"a": 4, "b": 5}] and stats[0].skipped == 2
    latin1 = write(tmp_path / "latin1.jsonl", b'{"a": 1}\n{"a": "caf\xe9"}\n{"a": 2}\n')
    table, stats = read_table([latin1], on_error="skip")
    assert table.column("a").to_pylist() == [1, 2] and stats[0].skipped == 1
    txt = write(tmp_path / "mixed.txt", b"good\n\xff bad\nfine\n")
    table, stats = read_table([txt], on_error="skip")
    assert table.column("text").to_pylist() == ["good", "fine"] and stats[0].skipped == 1
    empty = write(tmp_path / "empty.jsonl", "")
    table, stats = read_table([src, empty], on_error="skip")
    assert table.num_rows == 3 and stats[1].records == 0
