"""The World value object and the frozen public API of ``loaders``."""

from __future__ import annotations

import sys
import time
import types

import pytest

import loaders
from cachetier.errors import BadInputError, UsageError
from loaders import World, lead
from loaders.lead import Lead


def test_ranks_come_from_the_environment_when_torch_distributed_is_off():
    assert World.detect_ranks({}) == World()
    assert World.detect_ranks({"RANK": "2", "WORLD_SIZE": "4"}) == World(rank=2, world_size=4)
    with pytest.raises(BadInputError, match="RANK"):
        World.detect_ranks({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(BadInputError, match="WORLD_SIZE"):
        World.detect_ranks({"RANK": "0", "WORLD_SIZE": "two"})


def test_outside_a_worker_the_reader_is_alone():
    world = World(rank=1, world_size=2).with_worker_info()
    assert (world.worker, world.num_workers, world.in_worker_pool) == (0, 1, False)


def test_public_api_is_frozen():
    assert sorted(loaders.__all__) == [
        "ArrowFileSource",
        "DevicePrefetcher",
        "EpochPlan",
        "LoaderState",
        "Partition",
        "ShardSource",
        "StreamingDataLoader",
        "StreamingDataset",
        "WorkerProgress",
        "World",
        "make_plan",
        "open_source",
        "to_device",
    ]
    for name in loaders.__all__:
        assert getattr(loaders, name).__doc__, f"{name} has no docstring"


def test_a_repository_or_url_is_opened_through_the_datastore(source, monkeypatch):
    calls = []

    def open_shard_source(repo_or_url, ref, cache):
        calls.append((repo_or_url, ref, cache))
        return source

    monkeypatch.setitem(sys.modules, "datastore", types.SimpleNamespace(open_shard_source=open_shard_source))
    ds = loaders.StreamingDataset("s3://bucket/repo", "v1", cache="cfg")
    assert calls == [("s3://bucket/repo", "v1", "cfg")] and ds.version_id == source.version_id
    monkeypatch.setitem(sys.modules, "datastore", types.SimpleNamespace())
    with pytest.raises(UsageError, match="ShardSource"):
        loaders.StreamingDataset("./data-repo")


def test_other_workers_wait_for_worker_0_but_never_for_long(monkeypatch):
    monkeypatch.setattr(lead, "_LEAD_WAIT_S", 0.3)
    turns = [1, 0]  # iteration 1 started; worker 0 has no batch yet
    follower = Lead.of(turns, World(worker=1, num_workers=2))
    assert follower is not None and Lead.of(turns, World()) is None
    started = time.monotonic()
    follower.wait()  # worker 0 never signals: the wait is bounded
    assert 0.25 < time.monotonic() - started < 10
    leader = Lead.of(turns, World(worker=0, num_workers=2))
    assert leader is not None
    leader.wait()  # worker 0 never waits
    leader.done()
    assert turns == [1, 1]
    monkeypatch.setattr(lead, "_LEAD_WAIT_S", 60)
    started = time.monotonic()
    follower.wait()  # worker 0 has its batch: no wait
    assert time.monotonic() - started < 10
