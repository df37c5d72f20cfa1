"""A ``files`` dataset through the loader: every file's bytes, big files reassembled from
their chunks through the tiered cache, from a real repository, with real workers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cachetier.config import CacheConfig
from cachetier.errors import IntegrityError, UsageError
from cachetier.packs import pack_key
from datastore import Repo
from loaders import ArrowFileSource, StreamingDataLoader, StreamingDataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

BIG = 5 << 20  # over the 4 MiB chunk threshold: stored as chunks, ``data`` null in the shard


@pytest.fixture(scope="module")
def files_repo(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("files")
    rnd = random.Random(5)
    files = {f"small/{i:02d}.bin": rnd.randbytes(rnd.choice([0, 10, 3000, 40_000])) for i in range(12)}
    files["media/big.bin"] = rnd.randbytes(BIG)
    for name, data in files.items():
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_bytes(data)
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(root / "src", format="files")
    repo.commit("files")
    return root / "repo", files


def _cache(tmp_path: Path, **options) -> CacheConfig:
    return CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=32 << 20, ssd_bytes=64 << 20, **options
    )


def _rows(items, batched: bool) -> list[dict]:
    if not batched:
        return list(items)
    return [dict(zip(b, values)) for b in items for values in zip(*b.values())]


def test_the_big_file_is_stored_as_chunks(files_repo, tmp_path):
    repo_path, _ = files_repo
    raw = StreamingDataset(str(repo_path), cache=_cache(tmp_path), columns=["path", "data", "chunks"])
    rows = {s["path"]: s for s in raw}
    assert len(rows["media/big.bin"]["chunks"]) > 1, "the test needs a chunked file"
    assert rows["small/00.bin"]["chunks"] is None


@pytest.mark.parametrize("batch_size", [None, 4])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_file_comes_with_its_bytes_and_no_chunk_ids(files_repo, tmp_path, batch_size, num_workers):
    repo_path, files = files_repo
    ds = StreamingDataset(str(repo_path), cache=_cache(tmp_path), batch_size=batch_size, shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=None if batch_size else 3, num_workers=num_workers)
    batches = list(loader)
    assert all(set(b) == {"path", "size", "data"} for b in batches), "chunks is internal"
    rows = _rows(batches, batched=True)  # per-sample mode: the default collate made batches
    assert sorted(r["path"] for r in rows) == sorted(files)
    for r in rows:
        assert r["data"] == files[r["path"]], r["path"]
        assert int(r["size"]) == len(files[r["path"]])


def test_per_sample_mode_gives_bytes_too(files_repo, tmp_path):
    repo_path, files = files_repo
    samples = list(StreamingDataset(str(repo_path), cache=_cache(tmp_path)))
    got = {s["path"]: s["data"] for s in samples}
    assert got == files
    assert all(set(s) == {"path", "size", "data"} for s in samples)


def test_selected_columns_still_get_the_bytes_and_chunks_can_be_asked_for(files_repo, tmp_path):
    repo_path, files = files_repo
    only_data = StreamingDataset(str(repo_path), cache=_cache(tmp_path), columns="data", batch_size=64)
    (batch,) = list(only_data)
    assert set(batch) == {"data"}
    assert sorted(batch["data"]) == sorted(files.values())
    named = StreamingDataset(
        str(repo_path), cache=_cache(tmp_path), columns=["path", "data", "chunks"], batch_size=64
    )
    (batch,) = list(named)
    assert set(batch) == {"path", "data", "chunks"}
    for path, data, chunks in zip(batch["path"], batch["data"], batch["chunks"]):
        assert data == files[path]
        assert (chunks is not None) == (path == "media/big.bin")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_files_epoch_delivers_the_rest_with_their_bytes(files_repo, tmp_path, num_workers):
    repo_path, files = files_repo

    def make() -> StreamingDataLoader:
        ds = StreamingDataset(str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=4, batch_size=2)
        return StreamingDataLoader(ds, num_workers=num_workers)

    loader = make()
    it = iter(loader)
    before = _rows([next(it) for _ in range(3)], batched=True)
    del it
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    after = _rows(resumed, batched=True)
    got = before + after
    assert sorted(r["path"] for r in got) == sorted(files)
    assert all(r["data"] == files[r["path"]] for r in got)
    assert "media/big.bin" in {r["path"] for r in got}


def test_a_corrupt_chunk_is_refused_not_delivered(files_repo, tmp_path):
    repo_path, _ = files_repo
    ids = StreamingDataset(str(repo_path), cache=False, columns=["path", "chunks"])
    chunk = next(s["chunks"] for s in ids if s["path"] == "media/big.bin")[0]
    member = Repo.open(str(repo_path)).objects.packs.locate(chunk)  # stored alone, or in a pack
    stored = repo_path / (pack_key(member.packid) if member else f"objects/{chunk[:2]}/{chunk}")
    at = member.offset + member.length - 1 if member else -1
    original = stored.read_bytes()
    try:
        stored.chmod(0o644)
        damaged = bytearray(original)
        damaged[at] ^= 1
        stored.write_bytes(bytes(damaged))
        ds = StreamingDataset(str(repo_path), cache=_cache(tmp_path, fetch_retries=0), batch_size=64)
        with pytest.raises(IntegrityError):
            list(ds)
    finally:
        stored.write_bytes(original)


def test_a_source_that_cannot_read_chunks_says_so(files_repo, tmp_path):
    repo_path, files = files_repo
    repo = Repo.open(str(repo_path))
    paths = []
    for i, (shard_id, _) in enumerate(StreamingDataset(repo, cache=False).source.shards):
        paths.append(tmp_path / f"shard-{i:03d}.arrow")  # the repository's shards as plain files
        paths[-1].write_bytes(repo.objects.get(shard_id))
    with pytest.raises(UsageError, match=r"media/big\.bin is stored as \d+ chunks"):
        list(StreamingDataset(ArrowFileSource(paths), batch_size=64))
    named = StreamingDataset(ArrowFileSource(paths), columns=["path", "data", "chunks"], batch_size=64)
    (batch,) = list(named)
    for path, data, chunks in zip(batch["path"], batch["data"], batch["chunks"]):
        assert (data, chunks is None) == ((None, False) if path == "media/big.bin" else (files[path], True))
