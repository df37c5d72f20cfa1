"""The fast paths of files ingest and checkout give what the plain paths give.

Ingest reads small files straight into one buffer and builds shards from slices of the
batch they were hashed in; checkout checks a shard's paths as one column. These tests
pin the result to the plain definitions: shards equal to cutting and encoding the same
records with :func:`datastore.shards.write_shards`, and path checks equal to
:func:`datastore.checkout.safe_target` file by file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore.checkout import _safe_targets, safe_target
from datastore.files import FileEntry, files_batch, read_file_into, walk_files
from datastore.ingest import ingest
from datastore.ingestindex import IngestIndex
from datastore.shards import ShardOptions, write_shards

SHARD = 8 << 10


def make_tree(root: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        path = root / f"d{i % 5}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.integers(0, 256, int(rng.integers(0, 2500)), dtype=np.uint8).tobytes())
    (root / "ünï.txt").write_bytes(b"x")
    stamp = time.time_ns() - 60 * 10**9  # older than the index's racy window
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(stamp, stamp))


def plain_shards(root: Path) -> list[tuple[str, int, int, int]]:
    """Shards of the tree's records built from Python values and cut by ShardWriter."""
    entries = walk_files(str(root))
    datas = [Path(e.abspath).read_bytes() for e in entries]
    batch = files_batch([e.path for e in entries], [e.size for e in entries], datas, [None] * len(entries))
    options = ShardOptions(shard_size=SHARD)
    return [(s.hash, s.records, s.bytes, s.uncompressed_bytes) for s in write_shards([batch], options)]


def infos(result) -> list[tuple[str, int, int, int]]:
    return [(s.hash, s.records, s.bytes, s.uncompressed_bytes) for s in result.shards]


def test_files_ingest_gives_the_plain_shards(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 400)
    result = ingest([root], ObjectStore(LocalStore(tmp_path / "repo")), shard_size=SHARD)
    assert len(result.shards) > 20
    assert infos(result) == plain_shards(root)


def test_reingest_mixing_known_and_read_files_gives_the_plain_shards(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 400)
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    index = IngestIndex(tmp_path / "index.json")
    ingest([root], objects, shard_size=SHARD, index=index)
    for i in (3, 4, 150, 151, 152, 399):  # neighbours of edits are re-read from the index's knowledge
        path = root / f"d{i % 5}" / f"f{i:04d}.bin"
        path.write_bytes(path.read_bytes() + b"edit")
    again = ingest([root], objects, shard_size=SHARD, index=index)
    assert 0 < again.files_read < 100
    assert infos(again) == plain_shards(root)


def test_read_file_into_refuses_a_file_that_changed_size(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"12345")
    out = bytearray(5)
    read_file_into(FileEntry("f", str(path), 5, 0), "src", memoryview(out))
    assert out == b"12345"
    for listed in (4, 6, 0):
        with pytest.raises(BadInputError, match="changed"):
            read_file_into(FileEntry("f", str(path), listed, 0), "src", memoryview(bytearray(listed)))
    with pytest.raises(BadInputError, match="vanished"):
        read_file_into(FileEntry("g", str(tmp_path / "g"), 0, 0), "src", memoryview(bytearray(0)))


@pytest.mark.parametrize(
    "bad", ["", "/abs", "a/", "a//b", ".", "..", "a/./b", "a/../b", "../x", "a/..", "a\x00b", "a\\/../b"]
)
def test_column_path_check_refuses_what_safe_target_refuses(tmp_path: Path, bad: str) -> None:
    root = str(tmp_path)
    with pytest.raises(BadInputError) as single:
        safe_target(root, bad)
    with pytest.raises(BadInputError) as column:
        _safe_targets(root, ["ok.txt", bad], set())
    assert str(column.value) == str(single.value)


def test_column_path_check_accepts_what_safe_target_accepts(tmp_path: Path) -> None:
    root = str(tmp_path)
    good = ["a", "..a", "...", "a/.../b", ".x/y", "d/ünï 名前.txt", "back\\slash", "\\", "..\\x", "a\\..\\b"]
    assert _safe_targets(root, good, set()) == [safe_target(root, p) for p in good]
    (tmp_path / "link").symlink_to(tmp_path.parent)
    with pytest.raises(BadInputError, match="symlink"):
        _safe_targets(root, ["link/x"], set())


_PATH_PARTS = st.sampled_from(["a", "b.txt", ".", "..", "...", "", "x\ny", "\n", "..\n", "\\", "\x00", "é"])


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(st.lists(_PATH_PARTS, min_size=1, max_size=4).map("/".join), min_size=1, max_size=6))
def test_the_joined_check_decides_as_safe_target_on_each_path(paths: list[str]) -> None:
    # Paths with newlines are joined by newlines for one regex search: whatever the
    # parts, the batch check refuses exactly when safe_target refuses one of them.
    root = "/nonexistent-root-for-lexical-checks"
    checked = {f"{root}/{p}".rpartition("/")[0] for p in paths}  # folders: lexical checks only
    try:
        expected = [safe_target(root, p, set(checked)) for p in paths]
    except BadInputError as e:
        with pytest.raises(BadInputError) as batch:
            _safe_targets(root, paths, set(checked))
        assert str(batch.value) == str(e)
    else:
        assert _safe_targets(root, paths, set(checked)) == expected
