"""Ingest end to end on a real local object store: files, chunks, the ingest index, failures."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cachetier.errors import BadInputError, NotFoundError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore._pipeline import read_ahead
from datastore.chunking import ChunkOptions, read_chunks_to
from datastore.files import FILES_SCHEMA
from datastore.ingest import ingest
from datastore.ingestindex import IngestIndex
from datastore.shards import read_shard

SMALL_CHUNKS = ChunkOptions(threshold=64 << 10, min_size=4 << 10, avg_size=16 << 10, max_size=64 << 10)
AGED = 10**9 * 60  # mtimes a minute old are past the index's racy window


@pytest.fixture
def objects(tmp_path: Path) -> ObjectStore:
    return ObjectStore(LocalStore(tmp_path / "repo"))


def make_tree(root: Path, n: int, seed: int = 0) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    files = {}
    for i in range(n):
        rel = f"d{i % 7}/sub{i % 3}/f{i:05d}.bin"
        files[rel] = rng.integers(0, 256, int(rng.integers(100, 3000)), dtype=np.uint8).tobytes()
    files.update({"empty": b"", "ünïcödé/名前.txt": "héllo".encode(), "top level.txt": b"spaces"})
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    age(root)
    return files


def age(root: Path, seconds_ago: int = 60, only: list[str] | None = None) -> None:
    stamp = time.time_ns() - seconds_ago * 10**9
    paths = [root / rel for rel in only] if only is not None else root.rglob("*")
    for path in paths:
        if path.is_file():
            os.utime(path, ns=(stamp, stamp))


def materialize(objects: ObjectStore, result) -> dict[str, bytes]:
    out = {}
    for shard in result.shards:
        table = read_shard(objects.get(shard.hash))
        for row in table.to_pylist():
            if row["chunks"] is None:
                out[row["path"]] = row["data"]
            else:
                buf = io.BytesIO()
                read_chunks_to(objects, row["chunks"], buf, expected_size=row["size"])
                out[row["path"]] = buf.getvalue()
    return out


def test_files_come_back_byte_identical(tmp_path: Path, objects: ObjectStore) -> None:
    root = tmp_path / "tree"
    files = make_tree(root, 300)
    files["big/blob.bin"] = os.urandom(300_000) + bytes(200_000)
    (root / "big").mkdir()
    (root / "big" / "blob.bin").write_bytes(files["big/blob.bin"])
    result = ingest([root], objects, shard_size=16 << 10, chunk_options=SMALL_CHUNKS)
    assert result.schema.equals(FILES_SCHEMA)
    assert result.records == len(files) and result.format == "files"
    assert len(result.shards) > 10 and result.chunks
    back = materialize(objects, result)
    assert back == files
    assert list(back) == sorted(files)  # records are in path order
    assert result.sources[0]["records"] == len(files) and result.sources[0]["size"] == sum(
        map(len, files.values())
    )


def test_same_tree_same_shards_in_another_repo(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 200)
    a = ingest([root], ObjectStore(LocalStore(tmp_path / "a")), shard_size=8 << 10)
    b = ingest([root], ObjectStore(LocalStore(tmp_path / "b")), shard_size=8 << 10, workers=1)
    assert [s.hash for s in a.shards] == [s.hash for s in b.shards]
    again = ingest([root], ObjectStore(LocalStore(tmp_path / "a")), shard_size=8 << 10)
    assert again.new_bytes == 0 and again.new_objects == 0


def test_index_skips_unchanged_files_and_shards(tmp_path: Path, objects: ObjectStore) -> None:
    root = tmp_path / "tree"
    files = make_tree(root, 2000)
    index = tmp_path / "ws" / "index.json"
    kw = {"shard_size": 8 << 10, "index": index}
    first = ingest([root], objects, **kw)
    assert first.files_read == len(files)

    # Proof that unchanged files are not read: give every file other bytes, keeping its
    # size and mtime. A re-ingest that read them would produce other shards.
    stats = {p: p.stat() for p in root.rglob("*") if p.is_file()}
    for path, st in stats.items():
        path.write_bytes(bytes(255 - b for b in path.read_bytes()))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    unchanged = ingest([root], objects, **kw)
    assert unchanged.files_read == 0
    assert unchanged.reused_shards == len(first.shards)
    assert [s.hash for s in unchanged.shards] == [s.hash for s in first.shards]
    assert unchanged.new_bytes == 0
    for path, st in stats.items():  # put the real bytes back
        path.write_bytes(files[path.relative_to(root).as_posix()])
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    # 1% of the files change: only they (and the neighbours in their shards) are read.
    rng = np.random.default_rng(3)
    names = sorted(files)
    changed = [names[int(i)] for i in rng.choice(len(names), len(names) // 100, replace=False)]
    for rel in changed:
        (root / rel).write_bytes(files[rel][::-1] + b"!")
    age(root, 30, only=changed)
    after = ingest([root], objects, **kw)
    fresh = ingest([root], ObjectStore(LocalStore(tmp_path / "fresh")), shard_size=8 << 10)
    assert [s.hash for s in after.shards] == [s.hash for s in fresh.shards]
    assert after.files_read <= 12 * len(changed)
    assert after.new_bytes <= 0.10 * first.bytes


def test_index_survives_nothing_it_should_not(tmp_path: Path, objects: ObjectStore) -> None:
    """A corrupt index is an empty one; another repository's index is ignored."""
    root = tmp_path / "tree"
    make_tree(root, 50)
    index = tmp_path / "index.json"
    index.write_text("{not json")
    assert ingest([root], objects, index=index).files_read == 53
    assert ingest([root], objects, index=index).files_read == 0
    other = ObjectStore(LocalStore(tmp_path / "other-repo"))
    assert ingest([root], other, index=index).files_read == 53
    assert len(IngestIndex.load(index, repo=other.store.url)) > 0


def test_recently_modified_files_are_not_trusted(tmp_path: Path, objects: ObjectStore) -> None:
    root = tmp_path / "tree"
    make_tree(root, 20)
    (root / "fresh.txt").write_bytes(b"just written")
    index = tmp_path / "index.json"
    ingest([root], objects, index=index)
    assert ingest([root], objects, index=index).files_read == 1


def test_big_file_edit_stores_only_its_neighbourhood(tmp_path: Path, objects: ObjectStore) -> None:
    root = tmp_path / "big"
    root.mkdir()
    data = bytearray(os.urandom(24 << 20))
    (root / "blob.bin").write_bytes(data)
    age(root)
    first = ingest([root], objects, index=tmp_path / "index.json")
    assert first.records == 1 and len(first.chunks) >= 12
    data[(12 << 20) : (13 << 20)] = os.urandom(1 << 20)
    (root / "blob.bin").write_bytes(data)
    age(root)
    second = ingest([root], objects, index=tmp_path / "index.json")
    assert second.new_bytes <= 8 << 20
    assert materialize(objects, second) == {"blob.bin": bytes(data)}


def test_tabular_ingest_and_progress(tmp_path: Path, objects: ObjectStore) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"i": i, "t": "x" * (i % 50)}) + "\n" for i in range(20_000)))
    seen: list[int] = []
    result = ingest([src], objects, shard_size=64 << 10, progress=seen.append, text_column="t")
    assert sum(seen) == src.stat().st_size
    assert result.records == 20_000 and len(result.shards) > 3 and result.text_column == "t"
    back = pa.concat_tables([read_shard(objects.get(s.hash)) for s in result.shards])
    assert back.column("i").to_pylist() == list(range(20_000))
    assert result.sources[0]["hash"] and result.sources[0]["records"] == 20_000
    with pytest.raises(BadInputError, match="nope"):
        ingest([src], objects, text_column="nope")


def test_schema_widening_restarts_and_is_remembered(tmp_path: Path, objects: ObjectStore) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"x": i}) + "\n" for i in range(50_000)) + '{"x": 0.5, "y": "new"}\n')
    index = tmp_path / "index.json"
    result = ingest([src], objects, shard_size=16 << 10, index=index, block_bytes=64 << 10)
    assert result.schema.field("x").type == pa.float64() and "y" in result.schema.names
    plain = ingest([src], ObjectStore(LocalStore(tmp_path / "b")), shard_size=16 << 10)
    assert [s.hash for s in plain.shards] == [s.hash for s in result.shards]
    again = ingest([src], objects, shard_size=16 << 10, index=index, block_bytes=64 << 10)
    assert again.new_objects == 0 and again.reused_shards == len(result.shards)


def test_columns_appearing_late_cost_few_passes(tmp_path: Path, objects: ObjectStore) -> None:
    src = tmp_path / "a.jsonl"
    lines = [json.dumps({"i": i, "pad": "p" * 100}) for i in range(20_000)]
    for k in range(1, 20):  # a new column every ~1000 lines
        lines[k * 1000] = json.dumps({"i": k, f"late{k}": k})
    src.write_text("\n".join(lines) + "\n")
    seen: list[int] = []
    result = ingest([src], objects, block_bytes=64 << 10, progress=seen.append)
    assert [f"late{k}" for k in range(1, 20)] == result.schema.names[2:]
    assert sum(seen) <= 3 * src.stat().st_size  # at most two restarts, not nineteen


def test_failed_ingest_writes_only_objects(tmp_path: Path, objects: ObjectStore) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"i": i, "pad": "p" * 200}) + "\n" for i in range(5000)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"i": 1, "pad": "x"}\n{"i": oops}\n')
    with pytest.raises(BadInputError, match=r"bad\.jsonl:2"):
        ingest([good, bad], objects, shard_size=8 << 10)
    keys = [info.key for info in objects.store.list()]
    assert all(k.startswith(("objects/", "packs/")) for k in keys)
    # the small shards were in the open pack, dropped unwritten: no pack without its index
    assert {k.removesuffix(".pack") for k in keys if k.endswith(".pack")} == {
        k.removesuffix(".idx") for k in keys if k.endswith(".idx")
    }
    with pytest.raises(NotFoundError, match="missing"):
        ingest([good, tmp_path / "missing.jsonl"], objects)


def test_reserved_column_names_are_refused(tmp_path: Path, objects: ObjectStore) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"a": 1, "__secret": 2}\n')
    with pytest.raises(BadInputError, match="__secret"):
        ingest([src], objects)
    lines = tmp_path / "a.txt"
    lines.write_text("one\ntwo\n")
    assert ingest([lines], objects, text_column="body").schema.names == ["body"]


def test_skip_reports_the_count(tmp_path: Path, objects: ObjectStore) -> None:
    src = tmp_path / "a.jsonl"
    src.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')
    result = ingest([src], objects, on_error="skip")
    assert result.records == 2 and result.skipped == 1 and result.sources[0]["skipped"] == 1


def test_read_ahead_keeps_order_errors_and_stops_early() -> None:
    assert list(read_ahead(iter(range(100)), depth=3)) == list(range(100))

    def failing():
        yield 1
        raise BadInputError("boom", subject="x.jsonl:2")

    with pytest.raises(BadInputError, match="boom"):
        list(read_ahead(failing()))
    closed = []

    def endless():
        try:
            n = 0
            while True:
                n += 1
                yield n
        finally:
            closed.append(True)

    it = read_ahead(endless(), depth=2)
    assert next(it) == 1
    it.close()
    assert closed == [True]


# Peak RSS from VmHWM: getrusage's ru_maxrss survives exec, so it would report the
# pytest worker's own peak (hundreds of MB after heavy tests) whenever that is higher.
_RSS_CHILD = """
import json, re, sys
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore.ingest import ingest
result = ingest([sys.argv[1]], ObjectStore(LocalStore(sys.argv[2])))
with open("/proc/self/status") as f:
    rss = int(re.search(r"VmHWM:\\s+(\\d+) kB", f.read()).group(1)) * 1024
print(json.dumps({"records": result.records, "rss": rss}))
"""


@pytest.mark.slow
def test_ingest_streams_in_bounded_memory(tmp_path: Path) -> None:
    """RSS stays far below the input size (measured: a 2 GB JSON Lines file peaks at ~400 MB)."""
    src = tmp_path / "big.jsonl"
    line = json.dumps({"id": 0, "text": "lorem ipsum dolor sit amet " * 20, "score": 0.5})
    with open(src, "w") as f:
        for i in range(600_000):
            f.write(line.replace('"id": 0', f'"id": {i}', 1) + "\n")
    size = src.stat().st_size
    assert size > 300 << 20
    done = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(src), str(tmp_path / "repo")],
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["records"] == 600_000
    assert out["rss"] < 600 << 20, out
