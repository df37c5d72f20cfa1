"""StreamingDataLoader with real DataLoader worker processes: coverage, resume, robustness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from cachetier.errors import BadInputError, UsageError
from loaders import DevicePrefetcher, StreamingDataLoader, StreamingDataset
from tests.loaders._shards import IpcShardSource, write_shards

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
ROOT = Path(__file__).resolve().parents[2]


def ids_of(batches) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


def take(iterator, n: int) -> list:
    out = []
    for _ in range(n):
        item = next(iterator, None)
        if item is None:
            break
        out.append(item)
    return out


@pytest.mark.parametrize("num_workers", [0, 1, 2])
@pytest.mark.parametrize(("shuffle", "drop_last"), [(False, False), (True, False), (True, True)])
def test_every_record_once_in_the_same_order_for_any_worker_count(
    source, total_records, num_workers, shuffle, drop_last
):
    ds = StreamingDataset(source, shuffle=shuffle, seed=3, batch_size=16, drop_last=drop_last)
    loader = StreamingDataLoader(ds, num_workers=num_workers)
    got = ids_of(loader)
    expected = ids_of(StreamingDataset(source, shuffle=shuffle, seed=3, batch_size=16, drop_last=drop_last))
    assert got == expected, "the delivered order depends on num_workers"
    assert len(set(got)) == len(got) == total_records - (total_records % 16 if drop_last else 0)
    assert len(loader) == -(-len(got) // 16)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_per_sample_mode_is_batched_by_the_loader(source, total_records, num_workers):
    ds = StreamingDataset(source, columns=["id", "tokens", "text"], shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=10, num_workers=num_workers, drop_last=True)
    batches = list(loader)
    assert all(b["tokens"].shape == (10, 4) and len(b["text"]) == 10 for b in batches)
    got = ids_of(batches)
    assert len(got) == len(set(got)) == total_records - total_records % 10
    assert loader.state_dict()["consumed"] == len(got)


def test_more_ranks_and_workers_than_shards_neither_hang_nor_repeat(tmp_path, monkeypatch):
    folder = tmp_path / "few"
    sizes = [7, 4]
    write_shards(folder, sizes)
    world = 3
    per_rank = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        ds = StreamingDataset(IpcShardSource.from_folder(folder), shuffle=True, batch_size=1)
        per_rank.append(ids_of(StreamingDataLoader(ds, num_workers=4, timeout=60)))
    assert [len(r) for r in per_rank] == [3, 3, 3]
    flat = [i for r in per_rank for i in r]
    assert len(set(flat)) == 9
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    ds = StreamingDataset(IpcShardSource.from_folder(folder), batch_size=2)
    assert sorted(ids_of(StreamingDataLoader(ds, num_workers=4, timeout=60))) == list(range(11))


def test_batches_prefetched_but_not_delivered_are_not_counted(source):
    ds = StreamingDataset(source, shuffle=True, batch_size=8)
    loader = StreamingDataLoader(ds, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    take(it, 3)
    time.sleep(0.3)  # let the workers run ahead
    assert loader.state_dict()["consumed"] == 24
    del it


def test_resume_in_a_fresh_process_for_any_worker_count(source, total_records, shard_folder):
    jobs, expected_full = [], None
    for saved_with, resumed_with, cut in [(0, 0, 5), (1, 1, 1), (2, 2, 7), (4, 4, 3), (2, 0, 4), (0, 4, 9)]:
        ds = StreamingDataset(source, shuffle=True, seed=11, batch_size=8)
        ds.set_epoch(1)
        loader = StreamingDataLoader(ds, num_workers=saved_with)
        it = iter(loader)
        before = ids_of(take(it, cut))
        del it
        jobs.append({"state": loader.state_dict(), "num_workers": resumed_with, "before": before})
    full = StreamingDataset(source, shuffle=True, seed=11, batch_size=8)
    full.set_epoch(1)
    expected_full = ids_of(full)
    spec = {
        "folder": str(shard_folder),
        "record_bytes": source.record_bytes,
        "seed": 11,
        "batch_size": 8,
        "jobs": jobs,
    }
    out = subprocess.run(
        [sys.executable, "-m", "tests.loaders._resume_child", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for job, after in zip(jobs, results):
        assert job["before"] + after == expected_full, f"resume saved with {job}"


@given(
    cut=st.integers(0, 40),
    num_workers=st.sampled_from([0, 2]),
    shuffle=st.booleans(),
    batch_size=st.sampled_from([5, 16]),
)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_resume_at_any_cut_point_with_workers(source, total_records, cut, num_workers, shuffle, batch_size):
    ds = StreamingDataset(source, shuffle=shuffle, batch_size=batch_size)
    loader = StreamingDataLoader(ds, num_workers=num_workers, prefetch_factor=3 if num_workers else None)
    it = iter(loader)
    before = ids_of(take(it, cut))
    del it
    state = loader.state_dict()
    fresh = StreamingDataLoader(
        StreamingDataset(source, shuffle=shuffle, batch_size=batch_size), num_workers=2 - num_workers
    )
    fresh.load_state_dict(state)
    fresh.streaming_dataset.set_epoch(0)
    assert sorted(before + ids_of(fresh)) == list(range(total_records))


def _rank_run(source, monkeypatch, rank, world, state, batches, num_workers=2):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    ds = StreamingDataset(source, shuffle=True, seed=4, batch_size=8)
    loader = StreamingDataLoader(ds, num_workers=num_workers)
    if state is not None:
        loader.load_state_dict(state)
        ds.set_epoch(state["epoch"])
    it = iter(loader)
    got = ids_of(take(it, batches) if batches is not None else it)
    del it
    return got, loader.state_dict()


def test_elastic_resume_from_two_ranks_to_one(source, total_records, monkeypatch):
    seen, states = [], []
    for rank in range(2):
        got, state = _rank_run(source, monkeypatch, rank, 2, None, batches=6)
        seen += got
        states.append(state)
    assert states[0] == states[1] and states[0]["consumed"] == 2 * 6 * 8
    got, _ = _rank_run(source, monkeypatch, 0, 1, states[0], batches=None, num_workers=1)
    seen += got
    assert sorted(seen) == list(range(total_records))


def test_elastic_resume_from_one_rank_to_three(source, total_records, monkeypatch):
    seen, state = _rank_run(source, monkeypatch, 0, 1, None, batches=5)
    for rank in range(3):
        got, _ = _rank_run(source, monkeypatch, rank, 3, state, batches=None)
        seen += got
    assert len(seen) == len(set(seen))
    assert total_records - len(seen) < 3


def test_a_state_of_ranks_says_what_each_consumed_and_rejects_tampering(source, total_records, monkeypatch):
    states = [_rank_run(source, monkeypatch, rank, 2, None, batches=3, num_workers=0)[1] for rank in range(2)]
    state = states[0]
    assert state == states[1] and state["consumed"] == 2 * 3 * 8
    assert state["levels"] == [[2, total_records // 2, 24]]
    assert state["format"] == 2  # so versions that predate levels refuse it
    assert len(json.dumps(state)) < 1024
    ds = StreamingDataset(source, shuffle=True, seed=4, batch_size=8)
    with pytest.raises(BadInputError, match="levels consume 50 samples"):
        ds.load_state_dict({**state, "levels": [[2, total_records // 2, 25]]})
    with pytest.raises(BadInputError, match="bad levels"):
        ds.load_state_dict({**state, "levels": [[2, 3]]})
    with pytest.raises(BadInputError, match="does not fit"):
        ds.load_state_dict({**state, "levels": [[2, total_records, 24]]})
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    order = ids_of(StreamingDataset(source, shuffle=True, seed=4, batch_size=8))
    prefix = {k: v for k, v in state.items() if k != "levels"} | {"format": 1}  # a one-rank (or older) state
    ds.load_state_dict(prefix)
    assert ids_of(ds) == order[48:]


def test_elastic_resume_into_persistent_workers(source, total_records, monkeypatch):
    # The levels of a two-rank state reach persistent workers through their channel.
    seen = []
    for rank in range(2):
        got, state = _rank_run(source, monkeypatch, rank, 2, None, batches=4)
        seen += got
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    loader = StreamingDataLoader(
        StreamingDataset(source, shuffle=True, seed=4, batch_size=8), num_workers=2, persistent_workers=True
    )
    loader.load_state_dict(state)
    seen += ids_of(loader)
    assert sorted(seen) == list(range(total_records))
    del loader


def test_persistent_workers_follow_epochs_and_loaded_states(source, total_records):
    def epoch_order(epoch):
        ds = StreamingDataset(source, shuffle=True, batch_size=16)
        ds.set_epoch(epoch)
        return ids_of(ds)

    ds = StreamingDataset(source, shuffle=True, batch_size=16)
    loader = StreamingDataLoader(ds, num_workers=2, persistent_workers=True)
    assert ids_of(loader) == epoch_order(0)
    assert ids_of(loader) == epoch_order(1)
    it = iter(loader)
    part = ids_of(take(it, 4))
    del it
    state = loader.state_dict()
    loader.load_state_dict(state)
    assert part + ids_of(loader) == epoch_order(2)
    del loader  # stops the persistent workers now, not at the end of the session


@pytest.mark.parametrize("num_workers", [0, 2])
def test_works_under_torchdata_stateful_dataloader(source, total_records, num_workers):
    def make():
        return StatefulDataLoader(
            StreamingDataset(source, shuffle=True, batch_size=8), batch_size=None, num_workers=num_workers
        )

    loader = make()
    it = iter(loader)
    before = ids_of(take(it, 7))
    state = loader.state_dict()
    del it
    if num_workers:
        for snapshot in state["_snapshot"]["_worker_snapshots"].values():
            assert len(json.dumps(snapshot["dataset_state"])) < 1024
    json.dumps(state)
    resumed = make()
    resumed.load_state_dict(state)
    after = ids_of(resumed)
    assert sorted(before + after) == list(range(total_records))


_PERSISTENT_WORKERS_BREAK = """
import sys
from torchdata.stateful_dataloader import StatefulDataLoader
from loaders import StreamingDataset
from tests.loaders._shards import IpcShardSource
ds = StreamingDataset(IpcShardSource.from_folder(sys.argv[1]), shuffle=True, batch_size=8)
loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
for k, _ in enumerate(loader):
    if k == 4:
        break
next(iter(loader))
"""

# The dataset iterated in this process counts exactly what it yielded: workers forked after
# a break there go on from it, and have nothing to warn about.
_IN_PROCESS_BREAK = """
import sys
from torch.utils.data import DataLoader
from loaders import StreamingDataset
from tests.loaders._shards import IpcShardSource
ds = StreamingDataset(IpcShardSource.from_folder(sys.argv[1]), shuffle=True, batch_size=8)
seen = []
for k, batch in enumerate(ds):
    seen += batch["id"].tolist()
    if k == 4:
        break
seen += [i for b in DataLoader(ds, batch_size=None, num_workers=2) for i in b["id"].tolist()]
print(len(seen), len(set(seen)))
"""


@pytest.mark.parametrize(("script", "warned"), [(_PERSISTENT_WORKERS_BREAK, 2), (_IN_PROCESS_BREAK, 0)])
def test_a_worker_says_when_a_break_loses_its_read_ahead(shard_folder, total_records, script, warned):
    # Only the training process knows which read-ahead batches were delivered: a
    # persistent worker iterated again after a break says so on stderr, once per worker.
    out = subprocess.run(
        [sys.executable, "-c", script, str(shard_folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stderr.count("a new iteration began before the last one ended")
    assert said == warned, out.stderr[-3000:]
    if script is _IN_PROCESS_BREAK:
        assert out.stdout.split() == [str(total_records)] * 2, "records repeated or skipped"


def test_stateful_dataloader_persistent_workers_continue_exactly_from_their_own_state(source, total_records):
    ds = StreamingDataset(source, shuffle=True, seed=2, batch_size=8)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    it = iter(loader)
    before = ids_of(take(it, 5))
    del it
    loader.load_state_dict(loader.state_dict())
    after = ids_of(loader)
    assert sorted(before + after) == list(range(total_records))
    assert len(before + after) == total_records
    del loader  # stops the persistent workers now


def test_stateful_dataloader_in_per_sample_mode(source, total_records):
    def make():
        ds = StreamingDataset(source, columns=["id", "tokens"], shuffle=True)
        return StatefulDataLoader(ds, batch_size=6, num_workers=2)

    loader = make()
    it = iter(loader)
    before = ids_of(take(it, 9))
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert sorted(before + ids_of(resumed)) == list(range(total_records))


@pytest.mark.timeout(60)
def test_a_killed_worker_surfaces_as_an_error_not_a_hang(tmp_path):
    folder = tmp_path / "many"
    write_shards(folder, [400] * 5)
    ds = StreamingDataset(IpcShardSource.from_folder(folder), batch_size=2)
    loader = StreamingDataLoader(ds, num_workers=2, prefetch_factor=1)
    before = {p.pid for p in psutil.Process().children()}
    it = iter(loader)
    take(it, 4)
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) == 2
    os.kill(workers[0].pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed"):
        for _ in it:
            pass
    assert time.monotonic() - started < 30


def test_loader_refuses_conflicting_batching(source):
    with pytest.raises(UsageError, match="batch_size"):
        StreamingDataLoader(StreamingDataset(source, batch_size=4), batch_size=4)
    with pytest.raises(UsageError, match="shuffle"):
        StreamingDataLoader(StreamingDataset(source), shuffle=True)


def test_device_prefetcher_is_a_pass_through_without_a_gpu(source):
    ds = StreamingDataset(source, batch_size=32)
    loader = StreamingDataLoader(ds)
    device = DevicePrefetcher(loader, "cuda" if torch.cuda.is_available() else "cpu")
    it = iter(device)
    first = next(it)
    assert first["id"].tolist() == list(range(32))
    if not device.active:
        assert device.state_dict()["consumed"] == 32
    del it


_TORCH_LEN_WARNING = "Length of IterableDataset"


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_mode", [True, False])
def test_len_is_the_whole_epoch_also_while_a_stopped_or_loaded_epoch_goes_on(
    source, total_records, num_workers, batch_mode
):
    """What Lightning and torchdata expect: a trainer that restored its count of batches
    done ends the resumed epoch at ``len``; the resumed iteration yields the rest."""

    def make() -> StreamingDataLoader:
        if batch_mode:
            return StreamingDataLoader(
                StreamingDataset(source, shuffle=True, batch_size=10), num_workers=num_workers
            )
        return StreamingDataLoader(
            StreamingDataset(source, columns=["id", "text"], shuffle=True),
            batch_size=10,
            num_workers=num_workers,
        )

    full = -(-total_records // 10)
    loader = make()
    assert len(loader) == full
    it = iter(loader)
    take(it, 4)
    assert len(loader) == full
    del it  # a consumer that stopped after 4 batches
    middle = loader.state_dict()
    assert len(loader) == full and len(loader.streaming_dataset) == (full if batch_mode else total_records)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = []
        for batch in loader:  # torch compares what it fetched with the len it last read
            rest.append(batch)
            assert len(loader) == full
    assert not [w for w in caught if _TORCH_LEN_WARNING in str(w.message)]
    assert len(rest) == full - 4, "the epoch goes on where it stopped"
    assert len(loader) == full and len(list(loader)) == full
    resumed = make()
    resumed.load_state_dict(middle)
    assert len(resumed) == full
    assert 4 + len(list(resumed)) == full, "restored count + what the resumed epoch yields = len"
    end = loader.state_dict()
    assert end["consumed"] == total_records
    fresh = make()
    fresh.load_state_dict(end)  # saved at the end of an epoch: the next one is whole
    assert len(fresh) == full
    assert len(list(fresh)) == full and fresh.streaming_dataset.epoch == 2


def _prefetched(source, num_workers: int | None) -> tuple[object, DevicePrefetcher]:
    """A batch-mode loader (``num_workers`` None: the dataset itself) behind a CPU prefetcher,
    which runs the same read-ahead loop as on a GPU, without the copies."""
    ds = StreamingDataset(source, shuffle=True, seed=2, batch_size=10)
    loader = ds if num_workers is None else StreamingDataLoader(ds, num_workers=num_workers)
    return loader, DevicePrefetcher(loader, "cpu")


@pytest.mark.parametrize("num_workers", [None, 0, 2])
def test_device_prefetcher_counts_a_batch_once_handed_out_even_after_a_break(source, num_workers):
    expected = ids_of(_prefetched(source, num_workers)[1])
    loader, device = _prefetched(source, num_workers)
    seen = []
    for i, batch in enumerate(device):
        seen += batch["id"].tolist()
        if i == 4:
            inside = device.state_dict()
            break
    assert inside["consumed"] == 50
    assert device.state_dict()["consumed"] == loader.state_dict()["consumed"] == 50, (
        "the batch read ahead was lost"
    )
    resumed = _prefetched(source, num_workers)[1]
    resumed.load_state_dict(device.state_dict())
    assert seen + ids_of(resumed) == expected
    assert seen + ids_of(device) == expected, "re-iterating skipped the batch read ahead"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_prefetcher_over_a_stateful_dataloader_resumes_without_losing_the_batch_read_ahead(
    source, num_workers
):
    """torchdata's loader cannot leave out a batch by itself: the prefetcher saves its state
    before each read-ahead and rewinds it when the loop stops early."""

    def make() -> DevicePrefetcher:
        ds = StreamingDataset(source, shuffle=True, seed=4, batch_size=8)
        return DevicePrefetcher(StatefulDataLoader(ds, batch_size=None, num_workers=num_workers), "cpu")

    expected = ids_of(make())
    device = make()
    seen = []
    for i, batch in enumerate(device):
        seen += batch["id"].tolist()
        if i == 5:
            inside = json.loads(json.dumps(device.state_dict()))
            break
    assert json.loads(json.dumps(device.state_dict())) == inside
    resumed = make()
    resumed.load_state_dict(inside)
    assert seen + ids_of(resumed) == expected, "a fresh loader skipped or repeated the batch read ahead"
    assert seen + ids_of(device) == expected, "the same loader skipped or repeated the batch read ahead"


def test_device_prefetcher_over_a_plain_dataloader_without_workers_keeps_the_count(source):
    """A plain DataLoader passing the dataset's batches through: the dataset takes back the
    batch read ahead, and the prefetcher reports (and loads) the dataset's state."""

    def make() -> DevicePrefetcher:
        ds = StreamingDataset(source, shuffle=True, seed=6, batch_size=8)
        return DevicePrefetcher(torch.utils.data.DataLoader(ds, batch_size=None), "cpu")

    expected = ids_of(make())
    device = make()
    seen = []
    for i, batch in enumerate(device):
        seen += batch["id"].tolist()
        if i == 4:
            break
    state = device.state_dict()
    assert state["consumed"] == 40
    resumed = make()
    resumed.load_state_dict(state)
    assert seen + ids_of(resumed) == expected
    assert seen + ids_of(device) == expected, "the same loader skipped the batch read ahead"


def test_device_prefetcher_gives_back_the_batch_read_ahead_when_training_fails(source):
    loader, device = _prefetched(source, 0)
    with pytest.raises(RuntimeError, match="step failed"):
        for i, _ in enumerate(device):
            if i == 2:
                raise RuntimeError("step failed")
    assert loader.state_dict()["consumed"] == 30  # batches 0-2 were handed out; batch 3 was not
