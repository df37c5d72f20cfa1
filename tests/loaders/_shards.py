"""Test instruments: shard files in a folder and a minimal ShardSource over them.

Kept in an importable module (not only conftest.py) so child processes started by the
tests (fresh-process resume, the training example) can rebuild the same source.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("tokens", pa.list_(pa.int32(), 4)),
        ("text", pa.string()),
        ("var", pa.list_(pa.int32())),
        ("__record_hash", pa.binary(16)),
    ]
)


def make_table(ids: np.ndarray) -> pa.Table:
    """Records whose every column is derived from ``id`` (so tests can check content)."""
    ids = np.asarray(ids, dtype=np.int64)
    tokens = (ids[:, None] * 10 + np.arange(4)).astype(np.int32).reshape(-1)
    var = [list(range(int(i) % 5)) for i in ids]
    return pa.table(
        {
            "id": ids,
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), 4),
            "text": [f"record-{int(i)}" for i in ids],
            "var": pa.array(var, pa.list_(pa.int32())),
            "__record_hash": pa.array([int(i).to_bytes(16, "little") for i in ids], pa.binary(16)),
        },
        schema=SCHEMA,
    )


def write_shards(folder: Path, sizes: Sequence[int], batch_rows: int = 16) -> list[str]:
    """Write one zstd-compressed Arrow IPC file per size; ids run 0.. across the files."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    for i, n in enumerate(sizes):
        path = folder / f"shard-{i:04d}.arrow"
        table = make_table(np.arange(start, start + n))
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SCHEMA, options=options) as writer:
            writer.write_table(table, max_chunksize=batch_rows)
        paths.append(str(path))
        start += n
    (folder / "version.json").write_text(json.dumps({"paths": paths, "sizes": list(sizes)}))
    return paths


class IpcShardSource:
    """A ShardSource over Arrow IPC files: reads the whole file, drops ``__`` columns.

    With ``record_bytes`` it also claims that many decoded bytes per record
    (``shard_bytes``), as a repository's shard table does: the loader's plan then groups
    shards and shuffles page-locally (loaders.plan) by those sizes.
    """

    def __init__(
        self,
        paths: Sequence[str],
        sizes: Sequence[int],
        version_id: str = "v-test",
        record_bytes: int | None = None,
    ) -> None:
        self.paths = list(paths)
        self.version_id = version_id
        self.record_bytes = record_bytes
        self.shards = [(os.path.basename(p), int(n)) for p, n in zip(paths, sizes)]
        if record_bytes is not None:
            self.shard_bytes = [n * record_bytes for _, n in self.shards]
        self._by_id = {os.path.basename(p): p for p in paths}
        self.reads: list[str] = []
        self.announced: list[list[str]] = []

    @classmethod
    def from_folder(
        cls, folder: str | Path, version_id: str = "v-test", record_bytes: int | None = None
    ) -> IpcShardSource:
        meta = json.loads((Path(folder) / "version.json").read_text())
        return cls(meta["paths"], meta["sizes"], version_id, record_bytes)

    def reopen(self, version_id: str | None = None) -> IpcShardSource:
        """A fresh source over the same files and sizes (as another process would open it)."""
        sizes = [n for _, n in self.shards]
        return IpcShardSource(self.paths, sizes, version_id or self.version_id, self.record_bytes)

    def read_shard(self, shard_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        self.reads.append(shard_id)
        with open(self._by_id[shard_id], "rb") as f:
            table = pa.ipc.open_file(pa.BufferReader(f.read())).read_all()
        keep = [c for c in table.column_names if not c.startswith("__")] if columns is None else list(columns)
        return table.select(keep)

    def announce(self, shard_ids: Sequence[str]) -> None:
        self.announced.append(list(shard_ids))
