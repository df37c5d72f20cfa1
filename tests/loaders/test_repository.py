"""End to end: a real local repository, read through the tiered cache by DataLoader workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachetier.config import CacheConfig
from datastore import Repo
from loaders import StreamingDataLoader, StreamingDataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

RECORDS = 600


@pytest.fixture(scope="module")
def repo_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    src = root / "data.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": f"record {i} " * 20}) + "\n" for i in range(RECORDS)))
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(src, shard_size=16 << 10)
    repo.commit("data")
    return root / "repo"


def _cache(tmp_path: Path) -> CacheConfig:
    return CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=8 << 20, ssd_bytes=64 << 20
    )


def test_a_repository_version_streams_every_record_once_through_the_cache(repo_path, tmp_path):
    peek = StreamingDataset(str(repo_path), "main", cache=_cache(tmp_path), batch_size=4)
    assert set(next(iter(peek))) == {"id", "text"}
    ds = StreamingDataset(str(repo_path), "main", cache=_cache(tmp_path), shuffle=True, batch_size=32)
    assert len(ds._shards) > 3, "the test needs several shards"
    loader = StreamingDataLoader(ds, num_workers=2)
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(RECORDS))


def test_resume_against_the_repository_in_a_new_dataset(repo_path, tmp_path):
    def make():
        return StreamingDataLoader(
            StreamingDataset(str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=3, batch_size=25),
            num_workers=2,
        )

    loader = make()
    it = iter(loader)
    before = [i for _, batch in zip(range(7), it) for i in batch["id"].tolist()]
    del it
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    after = [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(before + after) == list(range(RECORDS))
