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

import io
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cachetier.config import CacheConfig, load_cache_config
from cachetier.pages import drop_mapping
from cachetier.tiered import StreamingDecoder, TieredStore
from datastore.repo import Repo, schema_from_dict
from datastore.shards import read_shard, shard_batches
from versioning import ShardTable, load_shard_table

__all__ = ["RepoShardSource", "ShardDecoder", "decode_shard", "open_shard_source"]

_DECODED = "ipc-plain"
_MAPPED_MAX = 64


class ShardDecoder(StreamingDecoder):
    """A shard re-encoded as an Arrow IPC file without compression: what the RAM tier keeps.

    The tiered cache has it write straight into the RAM tier's file, one decompressed
    record batch at a time, so decoding a shard costs the reader about one batch of
    memory, not the decoded shard (nor the copies of a growing buffer).
    """

    def __call__(self, raw: memoryview | bytes) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        self.write_to(raw, sink)
        return sink.getvalue()

    def write_to(self, raw: memoryview | bytes, sink: Any) -> None:
        schema, batches = shard_batches(raw)
        with pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:  # one decompressed batch at a time, not a second whole copy
                writer.write_batch(batch)
                del batch  # let it go before the next one is decoded


#: Decodes a stored shard for the RAM tier (see :class:`ShardDecoder`).
decode_shard = ShardDecoder()


class RepoShardSource:
    """The shards of one version, read through a tiered cache (or straight from the store)."""

    def __init__(self, repo: Repo, version_id: str, cache: TieredStore | None):
        self.repo = repo
        self.version_id = version_id
        record = repo.show(version_id).record
        self._stored_schema = record.schema
        table = _shard_table(repo, record.data_hash, cache)
        self.shards: list[tuple[str, int]] = list(
            zip(table.hashes(), (int(n) for n in table.records), strict=True)
        )
        #: decoded bytes of each shard (the loader groups small shards for its shuffle)
        self.shard_bytes: list[int] = table.uncompressed_bytes.tolist()
        self.cache = cache
        self._reader: str | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()
        #: the RAM-tier mapping each shard was last read from (while its readers hold it)
        self._mapped: dict[str, weakref.ref[mmap.mmap]] = {}

    def read_shard(self, shard_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """The records of ``shard_id`` (hidden columns dropped; only ``columns`` when given)."""
        if self.cache is None:
            return read_shard(self.repo.objects.get(shard_id), columns)
        view = self.cache.get_decoded(shard_id, decode_shard, kind=_DECODED, reader=self._reader_id())
        if isinstance(view.obj, mmap.mmap):  # not a fresh decode in private memory
            if len(self._mapped) >= _MAPPED_MAX:
                self._mapped = {k: r for k, r in self._mapped.items() if r() is not None}
            self._mapped[shard_id] = weakref.ref(view.obj)
        return read_shard(pa.py_buffer(view), columns, plain=True)

    @property
    def schema(self) -> pa.Schema | None:
        """The version's schema, as its record holds it (hidden ``__`` columns left out)."""
        stored = self._stored_schema
        return schema_from_dict(stored) if stored.get("arrow") else None

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


def _shard_table(repo: Repo, data_hash: str, cache: TieredStore | None) -> ShardTable:
    """A version's shard table, read through the cache when there is one, so a version
    warmed into the cache (``dataset cache warm``) streams without the object store."""
    return load_shard_table(cache if cache is not None else repo.objects, data_hash)  # type: ignore[arg-type]


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
