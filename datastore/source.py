"""A version of a repository as a :class:`loaders.source.ShardSource`, read through the tiered cache.

``open_shard_source(repo_or_url, ref, cache)`` resolves the ref once (the loader's plan
depends on the version id, never on a moving branch) and returns a
:class:`RepoShardSource`. Its reads go through a :class:`cachetier.TieredStore`: the RAM
tier keeps shards *decoded* (the Arrow IPC file with its buffers decompressed), so a hot
read is a zero-copy view with no fetch and no decompression; the SSD tier keeps the
stored bytes. ``announce`` passes the loader's future read order to the cache, which
prefetches and protects those shards. ``drop_pages`` lets the loader unmap the pages of a
RAM-tier shard it has moved past (they stay in tmpfs), so a reader's RSS follows what it
is reading, not the size of its shards.

The source is safe to use from threads and survives a fork (DataLoader workers): the
repository store and the cache reopen their handles in the new process.
"""

from __future__ import annotations

import base64
import io
import mmap
import os
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cachetier.config import CacheConfig, load_cache_config
from cachetier.errors import IntegrityError
from cachetier.pages import drop_mapping
from cachetier.tiered import StreamingDecoder, TieredStore
from datastore.repo import Repo
from loaders.ipcview import Field, IpcFile, UnsupportedIpc, open_ipc_file, read_schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["RepoShardSource", "ShardDecoder", "decode_shard", "decode_shard_index", "open_shard_source"]

_DECODED = "ipc-plain"
_INDEX = "shard-index"
_MAPPED_MAX = 64


class ShardDecoder(StreamingDecoder):
    """A shard re-encoded as an Arrow IPC file without compression: what the RAM tier keeps.

    The tiered cache has it write straight into the RAM tier's file, one decompressed
    record batch at a time, so decoding a shard costs the reader about one batch of
    memory, not the decoded shard (nor the copies of a growing buffer).
    """

    def __call__(self, raw: memoryview | bytes) -> pa.Buffer:
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        self.write_to(raw, sink)
        return sink.getvalue()

    def write_to(self, raw: memoryview | bytes, sink: Any) -> None:
        import pyarrow as pa

        from datastore.shards import shard_batches

        schema, batches = shard_batches(raw)
        with pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:  # one decompressed batch at a time, not a second whole copy
                writer.write_batch(batch)
                del batch  # let it go before the next one is decoded


#: Decodes a stored shard for the RAM tier (see :class:`ShardDecoder`).
decode_shard = ShardDecoder()

_INDEX_MAGIC = b"TDSHIDX1"
_INDEX_HEAD = struct.Struct("<8sQ")


def decode_shard_index(raw: memoryview | bytes) -> bytes:
    """What the loader needs of a shard table (Parquet), in a form numpy reads in place.

    ``magic, n`` then the ``n`` shard ids (32 bytes each), record counts and decoded
    sizes (little-endian int64). The RAM tier keeps it beside the table, so a process
    that streams a warm version opens it without pyarrow (whose import alone costs a
    training process and each of its workers about 30 MB of RSS).
    """
    from versioning import ShardTable

    table = ShardTable.decode(raw)
    counts = np.stack([table.records, table.uncompressed_bytes]).astype("<i8")
    head = _INDEX_HEAD.pack(_INDEX_MAGIC, len(table))
    return head + np.ascontiguousarray(table.raw_hashes()).tobytes() + counts.tobytes()


def _read_shard_index(data: memoryview, subject: str) -> tuple[list[str], list[int], list[int]]:
    """Invert :func:`decode_shard_index`: shard ids (hex), record counts, decoded sizes."""
    if data.nbytes < _INDEX_HEAD.size:
        raise IntegrityError("shard index is cut short", subject=subject)
    magic, n = _INDEX_HEAD.unpack_from(data)
    if magic != _INDEX_MAGIC or data.nbytes != _INDEX_HEAD.size + n * 48:
        raise IntegrityError("shard index is not one this version of tierdata writes", subject=subject)
    ids = bytes(data[_INDEX_HEAD.size : _INDEX_HEAD.size + 32 * n]).hex()
    counts = np.frombuffer(data, "<i8", 2 * n, _INDEX_HEAD.size + 32 * n).reshape(2, n)
    return [ids[i : i + 64] for i in range(0, 64 * n, 64)], counts[0].tolist(), counts[1].tolist()


class RepoShardSource:
    """The shards of one version, read through a tiered cache (or straight from the store)."""

    def __init__(self, repo: Repo, version_id: str, cache: TieredStore | None):
        self.repo = repo
        self.version_id = version_id
        record = repo.show(version_id).record
        self._stored_schema = record.schema
        ids, records, sizes = _shard_index(repo, record.data_hash, cache)
        self.shards: list[tuple[str, int]] = list(zip(ids, records, strict=True))
        #: decoded bytes of each shard (the loader groups small shards for its shuffle)
        self.shard_bytes: list[int] = sizes
        self.cache = cache
        self._reader: str | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: the RAM-tier mapping each shard was last read from (while its readers hold it)
        self._mapped: dict[str, weakref.ref[mmap.mmap]] = {}

    def read_shard(self, shard_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The records of ``shard_id`` (hidden columns dropped; only ``columns`` when given)."""
        import pyarrow as pa

        from datastore.shards import read_shard

        if self.cache is None:
            return read_shard(self.repo.objects.get(shard_id), columns)
        return read_shard(pa.py_buffer(self._decoded(shard_id)), columns, plain=True)

    def read_shard_view(self, shard_id: str, columns: Sequence[str] | None = None) -> IpcFile | pa.Table:
        """The records of ``shard_id`` as a view of the RAM tier's decoded file, read
        without pyarrow (:mod:`loaders.ipcview`); as :meth:`read_shard`'s table when the
        view cannot hold them (no cache, a column type or encoding the view does not read)."""
        if self.cache is None:
            return self.read_shard(shard_id, columns)
        view = self._decoded(shard_id)
        try:
            ipc = open_ipc_file(view)
            if ipc.supports(columns if columns is not None else _visible(ipc.schema)):
                return ipc
        except UnsupportedIpc:
            pass
        import pyarrow as pa

        from datastore.shards import read_shard

        return read_shard(pa.py_buffer(view), columns, plain=True)

    def _decoded(self, shard_id: str) -> memoryview:
        """The RAM tier's decoded file of ``shard_id`` (remembered for :meth:`drop_pages`)."""
        assert self.cache is not None
        view = self.cache.get_decoded(shard_id, decode_shard, kind=_DECODED, reader=self._reader_id())
        if isinstance(view.obj, mmap.mmap):  # not a fresh decode in private memory
            if len(self._mapped) >= _MAPPED_MAX:
                self._mapped = {k: r for k, r in self._mapped.items() if r() is not None}
            self._mapped[shard_id] = weakref.ref(view.obj)
        return view

    @property
    def schema(self) -> list[Field] | None:
        """The version's columns, as its record holds them (hidden ``__`` columns left out)."""
        stored = self._stored_schema
        if not stored.get("arrow"):
            return None
        return [f for f in read_schema(base64.b64decode(stored["arrow"])) if not f.name.startswith("__")]

    def read_chunks(self, chunk_ids: Sequence[str], size: int | None, subject: str) -> bytes:
        """The bytes of a big value of a ``files`` version, stored as content-defined chunks:
        read like shards (through the cache, or verified from the object store), then joined
        by the reassembly checkout uses; IntegrityError if one is corrupt or the size is off."""
        from datastore.chunking import read_chunks_to

        out = io.BytesIO()
        objects = self.cache if self.cache is not None else self.repo.objects
        read_chunks_to(objects, chunk_ids, out, expected_size=size, subject=subject)
        return out.getvalue()

    def drop_pages(self, shard_id: str) -> None:
        """Unmap this process's resident pages of ``shard_id``'s RAM-tier file, if it was
        read from one; tables read from it stay valid (pages map back on access)."""
        ref = self._mapped.get(shard_id)
        mapping = ref() if ref is not None else None
        if mapping is not None:
            drop_mapping(mapping)

    def announce(self, shard_ids: Sequence[str]) -> None:
        """Tell the cache the order of the coming reads (prefetch and protection)."""
        if self.cache is None:
            return
        with self._lock:
            self._reader = self.cache.announce(
                list(shard_ids), reader=self._reader_id(), decode=decode_shard, kind=_DECODED
            )

    def _reader_id(self) -> str | None:
        if self._pid != os.getpid():  # a forked worker announces its own plan
            self._pid, self._reader, self._lock = os.getpid(), None, threading.Lock()
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for a DataLoader worker started by spawn or forkserver: the version's
        # shards and the cache; this process's lock, plan and mappings stay here.
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_mapped", "_reader", "_pid")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reader, self._lock, self._pid, self._mapped = None, threading.Lock(), os.getpid(), {}

    def __repr__(self) -> str:
        return f"RepoShardSource({self.repo.url!r}, {self.version_id[:12]}, {len(self.shards)} shards)"


def _visible(fields: Sequence[Field]) -> list[str]:
    return [f.name for f in fields if not f.name.startswith("__")]


def _shard_index(
    repo: Repo, data_hash: str, cache: TieredStore | None
) -> tuple[list[str], list[int], list[int]]:
    """A version's shard ids, record counts and decoded sizes. Through the cache when
    there is one (a version warmed into it, ``dataset cache warm``, streams without the
    object store), from the shard index it keeps decoded in RAM (:func:`decode_shard_index`)."""
    if cache is None:
        from versioning import load_shard_table

        table = load_shard_table(repo.objects, data_hash)
        return table.hashes(), table.records.tolist(), table.uncompressed_bytes.tolist()
    view = cache.get_decoded(data_hash, decode_shard_index, kind=_INDEX)
    return _read_shard_index(view, f"shard table {data_hash[:16]}")


def open_shard_source(
    repo_or_url: Repo | str | os.PathLike[str], ref: str = "main", cache: Any = None
) -> RepoShardSource:
    """Open version ``ref`` of a repository (a :class:`Repo`, URL or path) for the loader.

    ``cache``: a :class:`TieredStore` to share, a :class:`CacheConfig`, ``None`` for the
    workspace/environment defaults (``TIERDATA_CACHE_*``), or ``False`` to read straight
    from the object store.
    """
    repo = repo_or_url if isinstance(repo_or_url, Repo) else Repo.open(os.fspath(repo_or_url))
    version = repo.resolve(ref)
    tiered: TieredStore | None
    if cache is False:
        tiered = None
    elif isinstance(cache, TieredStore):
        tiered = cache
    else:
        config = cache if isinstance(cache, CacheConfig) else _default_config(repo)
        tiered = TieredStore(repo.objects, config)
    return RepoShardSource(repo, version, tiered)


def _default_config(repo: Repo) -> CacheConfig:
    settings = repo.workspace.settings.get("cache", {}) if repo.workspace else {}
    return load_cache_config(settings)
