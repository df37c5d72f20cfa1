"""Which columns a dataset reads from its shards, and which its items show.

The user names the columns to read (default: every column except hidden ``__`` ones).
:func:`check_columns` refuses a malformed list when the dataset is made (a single
string is one column); :func:`select` checks the names against the version's schema,
when the source knows it, so a typo fails at once, even on a version with no records.

A ``files`` dataset (``datastore.files``: ``path``, ``size``, ``data``, ``chunks``) keeps
a file at or above the chunk threshold (4 MiB) as the ids of its content-defined chunks
in ``chunks``, with ``data`` null. The loader gives every file's bytes in ``data``: a
:class:`Selection` reads ``chunks`` (and ``size``, to check the length) along with
``data`` and :meth:`Selection.finish` reassembles the big values of the rows a reader
delivers (only those: a shard of chunk lists can name gigabytes) through the source's
:func:`~loaders.source.chunk_reader`, the tiered cache for a repository. ``chunks`` is
internal, like the hidden ``__`` columns: left out of items unless selected by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetier.errors import BadInputError, UsageError
from loaders.columns import Kind
from loaders.decoded import unknown_column
from loaders.ipcview import Field
from loaders.source import ChunkReader

__all__ = ["CHUNKS", "DATA", "Selection", "check_columns", "is_files_layout", "select"]

DATA = "data"
CHUNKS = "chunks"
_SIZE = "size"
_PATH = "path"


@dataclass(frozen=True)
class Selection:
    """The columns asked of the source, and what :meth:`finish` does to each batch's pieces.

    ``read``: the columns to read (None: every visible one); ``internal``: columns read
    for the loader's own use, left out of items; ``reassemble``: fill null ``data`` values
    from ``chunks``.
    """

    read: tuple[str, ...] | None
    internal: tuple[str, ...] = ()
    reassemble: bool = False

    @property
    def active(self) -> bool:
        """Whether :meth:`finish` changes anything."""
        return self.reassemble or bool(self.internal)

    def finish(
        self, kinds: dict[str, Kind], pieces: Mapping[str, Any], read: ChunkReader | None
    ) -> tuple[dict[str, Kind], dict[str, Any]]:
        """The kinds and pieces of the items: big values filled in, internal columns left out."""
        out = dict(pieces)
        if self.reassemble:
            out[DATA] = self._filled(out, read)
        if self.internal:
            kinds = {name: kind for name, kind in kinds.items() if name not in self.internal}
        return kinds, out

    def _filled(self, pieces: Mapping[str, Any], read: ChunkReader | None) -> list[Any]:
        data, chunks = pieces[DATA], pieces[CHUNKS]
        if all(ids is None for ids in chunks):
            return data  # type: ignore[no-any-return]
        sizes, paths = pieces.get(_SIZE), pieces.get(_PATH)
        filled = list(data)
        for i, ids in enumerate(chunks):
            if ids is None or filled[i] is not None:
                continue
            subject = paths[i] if paths is not None else f"chunks {ids[0][:16]}…" if ids else "chunks"
            if read is None:
                if CHUNKS not in self.internal:
                    continue  # the user asked for the chunk ids: theirs to read
                raise UsageError(
                    f"{subject} is stored as {len(ids)} chunks, which this source cannot read",
                    subject=subject,
                    hint="read the version from its repository, or select 'chunks' to get the chunk ids",
                )
            filled[i] = read(ids, int(sizes[i]) if sizes is not None else None, subject)
        return filled


def check_columns(columns: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """``columns`` as a tuple of distinct names (a single string is one column)."""
    if columns is None:
        return None
    if isinstance(columns, str):
        return (columns,)
    try:
        names = tuple(columns)
    except TypeError:
        raise TypeError(
            f"columns must be a column name, a sequence of names or None, not {type(columns).__name__}"
        ) from None
    if not names or not all(isinstance(c, str) for c in names):
        raise BadInputError(f"columns={names!r}", subject="columns", hint="give column names, or None")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise BadInputError(
            f"column {twice[0]!r} is selected more than once",
            subject="columns",
            hint="name each column once",
        )
    return names


def select(columns: tuple[str, ...] | None, schema: Sequence[Field] | None) -> Selection:
    """What to read for ``columns`` (from :func:`check_columns`) of a version with columns
    ``schema`` (None: unknown, the columns are checked when a shard is read)."""
    if schema is None:
        return Selection(columns)
    names = [f.name for f in schema]
    if columns is not None:
        # hidden columns are often left out of a version's schema: the shard checks those
        unknown = [c for c in columns if c not in names and not c.startswith("__")]
        if unknown:
            raise unknown_column(unknown[0], names, "this version")
    if not is_files_layout(schema):
        return Selection(columns)
    if columns is None:  # every visible column is read, chunks among them
        return Selection(None, internal=(CHUNKS,), reassemble=True)
    if DATA not in columns:
        return Selection(columns)
    extra = tuple(c for c in (CHUNKS, _SIZE) if c in names and c not in columns)
    return Selection(columns + extra, internal=extra, reassemble=True)


def is_files_layout(schema: Sequence[Field]) -> bool:
    """True when ``schema`` (hidden ``__`` columns aside) is the layout of a ``files``
    dataset, ``datastore.files.FILES_SCHEMA``: path string, size int64, data large
    binary, chunks list of strings (a test holds the two to the same layout)."""
    visible = [f for f in schema if not f.name.startswith("__")]
    if [f.name for f in visible] != ["path", _SIZE, DATA, CHUNKS]:
        return False
    path, size, data, chunks = (f.type for f in visible)
    return (
        (path.id, str(path.offsets_dtype)) == ("utf8", "int32")
        and (size.id, str(size.dtype)) == ("int", "int64")
        and (data.id, str(data.offsets_dtype)) == ("binary", "int64")
        and (chunks.id, str(chunks.offsets_dtype)) == ("list", "int32")
        and chunks.child is not None
        and (chunks.child.type.id, str(chunks.child.type.offsets_dtype)) == ("utf8", "int32")
    )
