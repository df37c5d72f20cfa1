"""The seam between the loader and the repository: a :class:`ShardSource`.

The loader never touches manifests, stores or shard bytes itself. It reads one version
through four members, implemented by ``datastore.Repo`` (through the tiered cache) and by
:class:`loaders.filesource.ArrowFileSource` (plain Arrow IPC files):

- ``version_id``: the content id of the version; the epoch order depends on it, and a
  resume state from another version is refused.
- ``shards``: ``(shard_id, record_count)`` pairs in version order.
- ``read_shard(shard_id, columns)``: the shard's records as an Arrow table, hidden
  ``__`` columns dropped, only ``columns`` when given. Called from background threads
  and from DataLoader worker processes, so it must be thread-safe and survive a fork.
- ``announce(shard_ids)``: the shards this reader will read next, in order (a prefetch
  hint for the cache; a no-op is a valid implementation).

Optionally, ``drop_pages(shard_id)``: the source read ``shard_id`` from a shared file
mapping, and may unmap this process's resident pages of it (tables read from it stay
valid); the loader calls it as it moves past the shard's records, so that its RSS
follows the rows it is reading, not the size of the shards it holds.

Also optional (:func:`source_schema`, :func:`chunk_reader`):

- ``schema``: the version's columns, as ``loaders.ipcview.Field`` values or a ``pa.Schema``
  (hidden ``__`` columns may be left out); with it the dataset checks the columns it is
  asked for when it is made, not when the first shard is read.
- ``read_shard_view(shard_id, columns)``: like ``read_shard``, but it may return a
  :class:`loaders.ipcview.IpcFile` (an uncompressed Arrow IPC file in memory, such as
  the RAM tier's decoded shard) instead of a table, read then without pyarrow.
- ``read_chunks(chunk_ids, size, subject)``: the bytes of a big value of a ``files``
  dataset, stored as content-defined chunks (see :mod:`loaders.selection`), each
  verified against its id.

A repository's source (``datastore.RepoShardSource``) has both: the schema from its
version record, the chunks through its tiered cache.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cachetier.errors import UsageError
from loaders.ipcview import Field, field_type_from_arrow

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ChunkReader",
    "ShardSource",
    "chunk_reader",
    "loader_memory_pool",
    "open_source",
    "source_schema",
    "use_loader_memory_pool",
]

#: ``read(chunk_ids, size, subject) -> bytes``: a big value reassembled from its chunks
ChunkReader = Callable[[Sequence[str], "int | None", str], bytes]


@runtime_checkable
class ShardSource(Protocol):
    """One version of a dataset, readable shard by shard (see the module docstring)."""

    version_id: str
    shards: Sequence[tuple[str, int]]

    def read_shard(self, shard_id: str, columns: Sequence[str] | None = None) -> pa.Table:
        """Return the records of ``shard_id`` (only ``columns`` when given, hidden ones dropped)."""
        ...

    def announce(self, shard_ids: Sequence[str]) -> None:
        """Hint that ``shard_ids`` will be read next, in this order."""
        ...


@functools.cache
def loader_memory_pool() -> pa.MemoryPool:
    """The Arrow pool that decoded shards and the loader's Arrow copies come from.

    jemalloc where this pyarrow has it, else Arrow's default pool. Decoded shards are
    allocated on reader threads and freed on the consuming thread; Arrow's default
    mimalloc then keeps tens of MB per process committed beyond what is live (measured:
    about 100 MB with shuffle at peak), jemalloc's shared arenas reuse that memory.
    """
    import pyarrow as pa

    if "jemalloc" in pa.supported_memory_backends():
        try:
            return pa.jemalloc_memory_pool()
        except NotImplementedError:  # listed but not built in
            pass
    return pa.default_memory_pool()


def use_loader_memory_pool() -> None:
    """Make :func:`loader_memory_pool` this process's default Arrow pool.

    For DataLoader worker processes only (they exist to run the loader), so that sources
    that allocate with the default pool (a repository's shard reader) use it too; the
    training process's default pool is left alone.
    """
    if "pyarrow" not in sys.modules:  # nothing of this process allocates with Arrow (yet)
        return
    import pyarrow as pa

    pool = loader_memory_pool()
    if pa.default_memory_pool().backend_name != pool.backend_name:
        pa.set_memory_pool(pool)


def open_source(repo_or_url: Any, ref: str, cache: Any) -> ShardSource:
    """Return ``repo_or_url`` itself when it is a :class:`ShardSource`, else open one.

    A repository object or URL is resolved by ``datastore.open_shard_source(repo_or_url,
    ref, cache)``, imported here (not at module import) so the loader has no import-time
    dependency on the repository layer.
    """
    if isinstance(repo_or_url, ShardSource):
        return repo_or_url
    try:
        datastore = importlib.import_module("datastore")
        opener = datastore.open_shard_source
    except (ImportError, AttributeError) as e:
        raise UsageError(
            f"cannot open {repo_or_url!r}: datastore.open_shard_source is not available",
            subject=str(repo_or_url),
            hint="pass a loaders.ShardSource (e.g. loaders.ArrowFileSource) instead",
        ) from e
    source = opener(repo_or_url, ref, cache)
    if not isinstance(source, ShardSource):
        raise UsageError(
            f"datastore.open_shard_source returned {type(source).__name__}, not a ShardSource",
            subject=str(repo_or_url),
        )
    return source


def source_schema(source: ShardSource) -> list[Field] | None:
    """The columns of ``source``'s version (its optional ``schema``: a list of
    :class:`loaders.ipcview.Field` or a ``pa.Schema``), or None when the source cannot
    tell without reading a shard."""
    schema = getattr(source, "schema", None)
    if isinstance(schema, list) and all(isinstance(f, Field) for f in schema):
        return schema
    pa = sys.modules.get("pyarrow")  # a pa.Schema comes from a source that loaded pyarrow
    if pa is not None and isinstance(schema, pa.Schema):
        return [Field(f.name, f.nullable, field_type_from_arrow(f.type)) for f in schema]
    return None


def chunk_reader(source: ShardSource) -> ChunkReader | None:
    """How ``source`` reads the chunks of a big value (its optional ``read_chunks``; None: it cannot)."""
    own = getattr(source, "read_chunks", None)
    return own if callable(own) else None
