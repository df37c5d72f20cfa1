"""DevicePrefetcher and to_device on a real GPU, over a real repository read through the cache.

What is checked: every tensor arrives on the GPU equal to the CPU batch, with the
DataLoader pinning or not; the consumer never sees a batch whose copy has not finished,
and no batch's memory is reused while kernels queued on the current stream still read
it (both raced with 64 MB batches; each test fails with the matching line of
``loaders/device.py`` removed); a break mid-epoch on the GPU path resumes in a fresh
loader with nothing repeated or skipped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from cachetier.config import CacheConfig
from datastore import Repo
from loaders import DevicePrefetcher, StreamingDataLoader, StreamingDataset, to_device

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

RECORDS = 3_000
BATCH = 32


@pytest.fixture(scope="module")
def repo_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gpu-repo")
    rng = random.Random(7)
    src = root / "data.jsonl"
    with src.open("w") as f:
        for i in range(RECORDS):
            record = {
                "id": i,
                "tokens": [rng.randrange(50_000) for _ in range(rng.randrange(1, 40))],  # ragged
                "weight": rng.random(),
                "text": f"record {i} " * rng.randrange(1, 8),
            }
            f.write(json.dumps(record) + "\n")
    repo = Repo.init(root / "repo", workspace=None)
    repo.ingest(src, shard_size=64 << 10)
    repo.commit("gpu test data")
    return root / "repo"


def _loader(repo_path: Path, tmp_path: Path, num_workers: int, **kwargs) -> StreamingDataLoader:
    cache = CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=32 << 20, ssd_bytes=64 << 20
    )
    ds = StreamingDataset(str(repo_path), cache=cache, shuffle=True, seed=5, batch_size=BATCH)
    return StreamingDataLoader(ds, num_workers=num_workers, **kwargs)


def _tensors(batch: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize(("num_workers", "pin_memory"), [(0, False), (2, False), (2, True)])
def test_every_batch_arrives_on_the_gpu_equal_to_the_cpu_batch(repo_path, tmp_path, num_workers, pin_memory):
    expected = list(_loader(repo_path, tmp_path, 0))
    assert len(_tensors(expected[0])) >= 3, "ids, padded tokens, their lengths and weights are tensors"
    device = DevicePrefetcher(_loader(repo_path, tmp_path, num_workers, pin_memory=pin_memory), "cuda")
    assert device.active
    got = list(device)
    assert len(got) == len(expected)
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys()
        for name, value in want.items():
            if isinstance(value, torch.Tensor):
                assert have[name].is_cuda, name
                assert torch.equal(have[name].cpu(), value), name
            else:
                assert have[name] == value, name  # strings stay on the host, unchanged
    ids = torch.cat([b["id"] for b in got]).cpu()
    assert sorted(ids.tolist()) == list(range(RECORDS))


_NUMEL = 16 << 20


def _pinned_batches(n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of 64 MB each (batch ``i`` all ``i``), pinned: a copy takes about a millisecond."""
    return [{"x": torch.full((_NUMEL,), i, dtype=torch.int32).pin_memory()} for i in range(n)]


def test_a_batch_is_handed_out_only_once_its_copy_has_finished():
    """The consumer reads each batch at once: were the current stream not made to wait for
    the side stream, the sum would read a copy still in flight."""
    batches = _pinned_batches(16)
    sums = torch.zeros(len(batches), dtype=torch.int64, device="cuda")
    for i, batch in enumerate(DevicePrefetcher(batches, "cuda")):
        sums[i] = batch["x"].sum()
    torch.cuda.synchronize()
    assert sums.tolist() == [i * _NUMEL for i in range(len(batches))]


def test_a_batch_memory_is_not_reused_while_the_consumer_still_reads_it():
    """Each batch is read only behind ~10 ms of queued GPU work, then dropped at once: were its
    memory not marked as used by the current stream, the allocator would give it to the
    next copy (on the side stream), which would land before the queued read ran."""
    batches = _pinned_batches(16)
    sums = torch.zeros(len(batches), dtype=torch.int64, device="cuda")
    for i, batch in enumerate(DevicePrefetcher(batches, "cuda")):
        torch.cuda._sleep(20_000_000)
        sums[i] = batch["x"].sum()
        del batch
    torch.cuda.synchronize()
    assert sums.tolist() == [i * _NUMEL for i in range(len(batches))]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_break_on_the_gpu_path_resumes_in_a_fresh_loader_exactly(repo_path, tmp_path, num_workers):
    device = DevicePrefetcher(_loader(repo_path, tmp_path, num_workers), "cuda")
    seen = []
    for i, batch in enumerate(device):
        seen += batch["id"].tolist()
        if i == 20:
            break
    state = device.state_dict()
    assert state["consumed"] == 21 * BATCH, "the batch copied ahead counts as not delivered"
    assert len(json.dumps(state)) < 1024
    resumed = DevicePrefetcher(_loader(repo_path, tmp_path, num_workers), "cuda")
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert sorted(seen + rest) == list(range(RECORDS)), "records repeated or skipped"
    assert len(seen) + len(rest) == RECORDS


def test_to_device_moves_nested_batches_and_keeps_other_values():
    batch = {"x": torch.arange(4), "pair": (torch.ones(2), "label"), "n": 3}
    moved = to_device(batch, "cuda")
    torch.cuda.synchronize()
    assert moved["x"].is_cuda and moved["pair"][0].is_cuda
    assert moved["pair"][1] == "label" and moved["n"] == 3
    assert torch.equal(moved["x"].cpu(), batch["x"])
