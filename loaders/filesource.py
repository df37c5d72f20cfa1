"""A :class:`~loaders.source.ShardSource` over local Arrow IPC files, one shard per file.

For data that is not in a repository (and for tests, examples and benchmarks): the files
are read directly, with no cache. Shards written by ``datastore`` are Arrow IPC files
with zstd-compressed buffers, so a folder of them works here too.

The version id is a fingerprint of the files (names, sizes and the IPC footers, which
hold the schema and the offsets and compressed lengths of every record batch); pass
``version_id`` to name the version yourself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from cachetier.errors import BadInputError, NotFoundError
from cachetier.hashing import hasher
from loaders.source import loader_memory_pool

__all__ = ["ArrowFileSource"]

_FOOTER_BYTES = 64 << 10


class ArrowFileSource:
    """Arrow IPC files as the shards of one version, in the order given.

    Picklable and fork-safe (it holds paths and a schema), so DataLoader workers can use it.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], *, version_id: str | None = None) -> None:
        self.paths = [str(Path(p).absolute()) for p in paths]
        if len(set(self.paths)) != len(self.paths):
            raise BadInputError("the same file is listed twice", subject="paths")
        counts = []
        schemas = []
        for path in self.paths:
            try:
                with pa.memory_map(path) as f:
                    reader = pa.ipc.open_file(f)
                    counts.append(reader.count_rows())
                    schemas.append(reader.schema)
            except FileNotFoundError:
                raise NotFoundError("shard file does not exist", subject=path) from None
            except pa.ArrowInvalid as e:
                raise BadInputError(f"not an Arrow IPC file: {e}", subject=path) from e
        self.shards: list[tuple[str, int]] = list(zip(self.paths, counts))
        #: the first file's schema (the loader checks the columns it is asked for against it)
        self.schema: pa.Schema | None = schemas[0] if schemas else None
        self.version_id = version_id if version_id is not None else self._fingerprint()

    @classmethod
    def from_dir(
        cls, folder: str | os.PathLike[str], pattern: str = "*.arrow", **kwargs: object
    ) -> ArrowFileSource:
        """The files in ``folder`` matching ``pattern``, in name order."""
        paths = sorted(Path(folder).glob(pattern))
        if not paths:
            raise NotFoundError(f"no files matching {pattern!r}", subject=str(folder))
        return cls(paths, **kwargs)  # type: ignore[arg-type]

    def _fingerprint(self) -> str:
        h = hasher()
        for path in self.paths:
            size = os.path.getsize(path)
            h.update(f"{Path(path).name}\0{size}\0".encode())
            with open(path, "rb") as f:
                f.seek(max(0, size - _FOOTER_BYTES))
                h.update(f.read())
        return h.hexdigest()

    def read_shard(self, shard_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The records of the file ``shard_id``; only ``columns`` when given, else all but ``__`` ones."""
        with pa.memory_map(shard_id) as f:
            reader = pa.ipc.open_file(f)
            names = reader.schema.names
            wanted = [n for n in names if not n.startswith("__")] if columns is None else list(columns)
            missing = [c for c in wanted if c not in names]
            if missing:
                raise BadInputError(
                    f"column {missing[0]!r} is not in the shard",
                    subject=shard_id,
                    hint=f"available: {', '.join(n for n in names if not n.startswith('__'))}",
                )
            indices = [names.index(n) for n in wanted]
            options = pa.ipc.IpcReadOptions(included_fields=indices)
            reader = pa.ipc.open_file(f, options=options, memory_pool=loader_memory_pool())
            table = reader.read_all()
        return table.select(wanted) if table.column_names != wanted else table

    def announce(self, shard_ids: Sequence[str]) -> None:
        """No cache to warm: a no-op."""

    def __repr__(self) -> str:
        return f"ArrowFileSource({len(self.paths)} files, version={self.version_id[:12]})"
