"""The repository as a loader's shard source: decoding a shard into the RAM tier costs the
reader about one record batch of memory, not the decoded shard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datastore import Repo

REPO_ROOT = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent(
    """
    import json, sys
    import pyarrow as pa
    from cachetier.config import CacheConfig
    from datastore.source import open_shard_source

    repo, cache, ram_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = CacheConfig(dir=cache + "/ssd", ram_dir=cache + "/ram", ram_bytes=ram_bytes, ssd_bytes=1 << 30)
    source = open_shard_source(repo, "main", config)
    (shard_id, records), = source.shards
    start = pa.default_memory_pool().max_memory()
    table = source.read_shard(shard_id)
    peak = pa.default_memory_pool().max_memory() - start
    assert table.num_rows == records
    total = int(table.column("a").to_numpy().sum())
    print(json.dumps({"peak": peak, "decoded": source.shard_bytes[0], "sum": total}))
    """
)


def _probe(repo: Path, cache: Path, ram_bytes: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(repo), str(cache), str(ram_bytes)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_a_shard_is_decoded_into_the_ram_tier_a_batch_at_a_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a = rng.integers(0, 1 << 40, 3_000_000)
    src = tmp_path / "data.parquet"
    pq.write_table(pa.table({"a": a, "b": rng.integers(0, 1 << 40, 3_000_000)}), src)
    repo = Repo.init(tmp_path / "repo", workspace=None)
    result = repo.ingest(src, shard_size=64 << 20)
    repo.commit("one big shard")
    assert result["shards"] == 1, result
    streamed = _probe(tmp_path / "repo", tmp_path / "cache1", 256 << 20)
    assert streamed["sum"] == int(a.sum())
    assert streamed["peak"] < streamed["decoded"] / 2, streamed  # one batch (a shard has about 4)
    in_memory = _probe(tmp_path / "repo", tmp_path / "cache2", 0)  # no RAM tier: decoded in memory
    assert in_memory["sum"] == int(a.sum())
    assert in_memory["peak"] >= streamed["decoded"], in_memory
