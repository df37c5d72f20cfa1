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


#: Decoded bytes per record claimed by the "weighed" source: big enough that the default
#: shuffle groups a few shards (8 MiB) and cuts them into runs and blocks (4 MiB).
WEIGHED_RECORD_BYTES = 64 << 10


@pytest.fixture(params=[None, WEIGHED_RECORD_BYTES], ids=["plain", "weighed"])
def source(shard_folder, request):
    """The shards, without decoded sizes (windows of single shards, uniformly shuffled) and
    with them (groups of shards, page-local shuffle blocks)."""
    return IpcShardSource.from_folder(shard_folder, record_bytes=request.param)


@pytest.fixture(scope="session")
def total_records():
    return sum(SIZES)
