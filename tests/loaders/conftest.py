"""Fixtures for the loader tests: real zstd Arrow IPC shard files in a temporary folder."""

from __future__ import annotations

import pytest

from tests.loaders._shards import IpcShardSource, write_shards

# Uneven shard sizes, one tiny shard: windows, chunk and tail boundaries all get exercised.
SIZES = [37, 64, 5, 50, 41, 29, 60]


@pytest.fixture(scope="session")
def shard_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    write_shards(folder, SIZES)
    return folder


@pytest.fixture
def source(shard_folder):
    return IpcShardSource.from_folder(shard_folder)


@pytest.fixture(scope="session")
def total_records():
    return sum(SIZES)
