"""End to end: a real local repository, read through the tiered cache by DataLoader workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachetier.config import CacheConfig
from cachetier.errors import UsageError
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


def _shard_of_id(ds: StreamingDataset) -> dict[int, int]:
    """Ingest keeps record order, so ids run through the shards in version order."""
    owner, first = {}, 0
    for s, (_, n) in enumerate(ds.source.shards):
        owner.update((i, s) for i in range(first, first + n))
        first += n
    return owner


def test_small_shards_are_grouped_so_a_shuffled_batch_mixes_many_of_them(repo_path, tmp_path):
    def shards_per_batch(**options) -> list[int]:
        ds = StreamingDataset(
            str(repo_path), cache=_cache(tmp_path), shuffle=True, batch_size=64, drop_last=True, **options
        )
        owner = _shard_of_id(ds)
        return [len({owner[i] for i in batch["id"].tolist()}) for batch in ds]

    shards = len(StreamingDataset(str(repo_path), cache=_cache(tmp_path)).source.shards)
    assert shards >= 6
    assert max(shards_per_batch(shuffle_group=0)) <= 4  # windows of two shards: a batch spans a few
    assert min(shards_per_batch()) >= shards - 2  # one group of every small shard: each batch mixes all


@pytest.mark.parametrize("workers", [0, 2])
def test_grouped_shuffle_streams_every_record_once_and_resumes_exactly(repo_path, tmp_path, workers):
    def make() -> StreamingDataLoader:
        ds = StreamingDataset(
            str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=5, batch_size=16, shuffle_group="40KB"
        )
        return StreamingDataLoader(ds, num_workers=workers)

    plan = make().dataset.plan()
    assert 2 < len(plan.groups) - 1 < len(plan.shard_ids), "the test needs several groups of several shards"
    whole = [i for batch in make() for i in batch["id"].tolist()]
    assert sorted(whole) == list(range(RECORDS))
    loader = make()
    it = iter(loader)
    before = [i for _, batch in zip(range(11), it) for i in batch["id"].tolist()]
    del it
    state = loader.state_dict()
    assert state["group"] == 40_000
    resumed = make()
    resumed.load_state_dict(state)
    after = [i for batch in resumed for i in batch["id"].tolist()]
    assert before + after == whole  # the same order, nothing repeated or skipped


def test_a_state_from_another_shuffle_group_is_refused(repo_path, tmp_path):
    ds = StreamingDataset(
        str(repo_path), cache=_cache(tmp_path), shuffle=True, batch_size=8, shuffle_group="40KB"
    )
    state = ds.state_dict()
    other = StreamingDataset(str(repo_path), cache=_cache(tmp_path), shuffle=True, batch_size=8)
    with pytest.raises(UsageError, match="shuffle_group=8388608"):
        other.load_state_dict(state)
