"""End to end: a real local repository, read through the tiered cache by DataLoader workers."""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from cachetier.config import CacheConfig
from cachetier.errors import NotFoundError, UsageError
from datastore import Repo
from loaders import StreamingDataLoader, StreamingDataset, assemble
from tests.cachetier.test_pages import resident

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


def _resumed_halves(
    make: Callable[[], StreamingDataLoader], batches: int
) -> tuple[list[int], list[int], dict]:
    """The ids of a loader's first ``batches`` batches; the ids of the rest of its epoch,
    read by a fresh loader from its state; and that state."""
    loader = make()
    it = iter(loader)
    before = [i for _, batch in zip(range(batches), it) for i in batch["id"].tolist()]
    del it
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    return before, [i for batch in resumed for i in batch["id"].tolist()], state


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

    before, after, _ = _resumed_halves(make, 7)
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
    # Windows of two shards: a batch spans two or three (more where it crosses a window of
    # two small shards, which depends on the shard order, i.e. on the version id).
    assert statistics.median(shards_per_batch(shuffle_group=0)) <= 3
    assert min(shards_per_batch()) >= shards - 2  # one group of every small shard: each batch mixes all


@pytest.mark.parametrize("workers", [0, 2])
def test_grouped_shuffle_streams_every_record_once_and_resumes_exactly(repo_path, tmp_path, workers):
    def make() -> StreamingDataLoader:
        ds = StreamingDataset(
            str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=5, batch_size=16, shuffle_group="30KB"
        )
        return StreamingDataLoader(ds, num_workers=workers)

    # The shard order, hence the grouping, depends on the version id (new every run): with
    # shards of 1-46 KB, 30 KB groups make 3-5 groups for any order (40 KB: 2-4).
    plan = make().dataset.plan()
    assert 2 < len(plan.groups) - 1 < len(plan.shard_ids), "the test needs several groups of several shards"
    whole = [i for batch in make() for i in batch["id"].tolist()]
    assert sorted(whole) == list(range(RECORDS))
    before, after, state = _resumed_halves(make, 11)
    assert state["group"] == 30_000
    assert before + after == whole  # the same order, nothing repeated or skipped


@pytest.mark.parametrize("workers", [0, 2])
def test_a_block_shuffle_gathers_one_block_at_a_time_and_resumes_exactly(
    repo_path, tmp_path, workers, monkeypatch
):
    # Blocks of ~13 records and batches of 16: nearly every batch crosses a block. A
    # gathered group holds the positions of one block only (the rest of a crossing batch
    # comes from the next group), so its rows come out of a few runs of each shard.
    def make() -> StreamingDataLoader:
        ds = StreamingDataset(
            str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=7, batch_size=16, shuffle_block="3KB"
        )
        return StreamingDataLoader(ds, num_workers=workers)

    plan = make().dataset.plan()
    assert plan.block == 3000
    groups: list[list[int]] = []
    if workers == 0:  # the groups are recorded in this process
        gather = assemble._Gatherer.gather

        def recording(self, group, rows, read_ahead):
            groups.append([p for _, runs in group for pos, n in runs for p in range(pos, pos + n)])
            return gather(self, group, rows, read_ahead)

        monkeypatch.setattr(assemble._Gatherer, "gather", recording)
    whole = [i for batch in make() for i in batch["id"].tolist()]
    assert sorted(whole) == list(range(RECORDS))
    if workers == 0:
        assert [p for g in groups for p in g] == list(range(RECORDS))
        assert all(len({plan.block_end(p) for p in g}) == 1 for g in groups)
        assert len(groups) > RECORDS // 16, "the test needs blocks smaller than a batch"
    before, after, _ = _resumed_halves(make, 9)
    assert before + after == whole  # the same order, nothing repeated or skipped


def test_a_state_from_another_shuffle_group_is_refused(repo_path, tmp_path):
    ds = StreamingDataset(
        str(repo_path), cache=_cache(tmp_path), shuffle=True, batch_size=8, shuffle_group="40KB"
    )
    state = ds.state_dict()
    other = StreamingDataset(str(repo_path), cache=_cache(tmp_path), shuffle=True, batch_size=8)
    with pytest.raises(UsageError, match="shuffle_group=8388608"):
        other.load_state_dict(state)


BIG_RECORDS = 32_000


@pytest.fixture(scope="module")
def big_shards_repo(tmp_path_factory) -> Path:
    """About 1 KB per record in shards of several MB, so pages held are easy to see."""
    root = tmp_path_factory.mktemp("big")
    src = root / "data.jsonl"
    rng = random.Random(5)
    with src.open("w") as f:
        for i in range(BIG_RECORDS):
            f.write(json.dumps({"id": i, "text": rng.randbytes(500).hex()}) + "\n")
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(src, shard_size=8 << 20)
    repo.commit("data")
    return root / "repo"


def _mapped_from(folder: Path) -> int:
    """Bytes of this process's mappings of files under ``folder`` that are in its RSS."""
    return resident(str(folder))


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_reader_keeps_only_the_pages_it_is_reading_mapped(big_shards_repo, tmp_path, shuffle):
    # The RAM tier's decoded shards are mapped files: pages the reader has passed are
    # unmapped as it goes, so its RSS follows the rows in use, not the shards it holds.
    cache = CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=256 << 20, ssd_bytes=256 << 20
    )
    ds = StreamingDataset(str(big_shards_repo), cache=cache, shuffle=shuffle, batch_size=64)
    for _ in ds:  # the first epoch fills the tiers
        pass
    shard_bytes = max(ds.source.shard_bytes)
    assert len(ds.source.shards) >= 4 and shard_bytes >= 6 << 20
    held, ids = [], []
    for batch in ds:
        ids.extend(batch["id"].tolist())
        held.append(_mapped_from(tmp_path / "ram"))
    assert sorted(ids) == list(range(BIG_RECORDS))
    held.sort()
    assert held[len(held) // 2] < shard_bytes // 2, held[len(held) // 2]
    assert held[-1] < 2 * shard_bytes, held[-1]


# Ingest, then train, in one process (a notebook): the ingest hashed big objects on
# blake3's threads, and DataLoader workers forked afterwards verify big shards. They once
# waited for ever on a thread pool that a forked process does not have.
_INGEST_THEN_TRAIN = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from cachetier.config import CacheConfig
    from datastore import Repo
    from loaders import StreamingDataLoader, StreamingDataset, assemble
    work = Path(sys.argv[1])
    src = work / "src"
    for i in range(40):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"f{i}.bin").write_bytes(os.urandom(1 << 20))
    repo = Repo.init(work / "repo", workspace=None)
    repo.ingest(src, shard_size=12 << 20)  # shards of 12 MiB and more: hashed on threads
    repo.commit("files")
    cache = CacheConfig(dir=work / "cache", ram_dir=work / "ram", ram_bytes=256 << 20, ssd_bytes=0)
    ds = StreamingDataset(str(work / "repo"), cache=cache, columns=["path"], batch_size=4)
    loader = StreamingDataLoader(ds, num_workers=2)
    print(sum(len(batch["path"]) for batch in loader))
""")


def test_workers_forked_after_an_ingest_in_the_same_process_read_big_shards(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _INGEST_THEN_TRAIN, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["40"], result.stdout


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_forkserver_read_every_record_once_and_resume(
    repo_path, tmp_path, context
):
    # macOS starts processes by spawn, and Python 3.14 on Linux by forkserver: the
    # dataset is pickled for the workers, cache included, and each reopens the cache.
    ds = StreamingDataset(str(repo_path), cache=_cache(tmp_path), shuffle=True, seed=4, batch_size=10)
    loader = StreamingDataLoader(ds, num_workers=2, multiprocessing_context=context)
    assert sorted(i for batch in loader for i in batch["id"].tolist()) == list(range(RECORDS))
    half = StreamingDataLoader(ds, num_workers=2, multiprocessing_context=context)
    batches = iter(half)
    taken = [i for _ in range(25) for i in next(batches)["id"].tolist()]
    state = half.state_dict()
    del batches
    rest = StreamingDataLoader(ds, num_workers=2, multiprocessing_context=context)
    rest.load_state_dict(json.loads(json.dumps(state)))
    after = [i for batch in rest for i in batch["id"].tolist()]
    assert sorted(taken + after) == list(range(RECORDS))
    assert not set(taken) & set(after)


def test_an_error_in_a_worker_reaches_the_loop_as_its_own_one_line(repo_path, tmp_path):
    """torch re-raises a worker's error with the worker's traceback as its message: the
    loop gets the original one line (naming the missing object), the traceback as a note."""
    broken = tmp_path / "broken"
    shutil.copytree(repo_path, broken)
    packs = list((broken / "packs").glob("*.pack"))
    assert packs, "the test needs the small shards packed"
    for pack in packs:
        pack.unlink()
    ds = StreamingDataset(str(broken), "main", cache=_cache(tmp_path), batch_size=32)
    with pytest.raises(NotFoundError) as caught:
        for _ in StreamingDataLoader(ds, num_workers=2):
            pass
    text = str(caught.value)
    assert "\n" not in text and not text.startswith("Caught") and len(text) < 400, text
    assert "which is missing" in text or "no such key" in text, text  # the pack, or the object
    assert any("DataLoader worker process" in note for note in caught.value.__notes__)
