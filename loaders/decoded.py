"""Decoded shards, and batches gathered from them column-wise.

A :class:`DecodedShard` holds the selected columns of one shard, each converted once by
its kind (:mod:`loaders.columns`). A batch is a list of *parts*, one per window it
touches; :func:`pieces` takes each part's rows from one shard (a slice in order, or a
take) or gathers them from several, and :func:`batch_from_pieces` /
:func:`samples_from_pieces` turn the pieces into the yielded items. No Python object
is made per sample in batch mode.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cachetier.errors import BadInputError
from loaders.columns import Kind, ListKind, NumericKind, RaggedKind, Slab, kind_of, lengths_key
from loaders.plan import Rows

__all__ = ["DecodedShard", "SlotRing", "batch_from_pieces", "pieces", "samples_from_pieces", "select_columns"]

Pieces = dict[str, Any]


def select_columns(table: pa.Table, columns: Sequence[str] | None, shard_id: str) -> pa.Table:
    """``table`` reduced to ``columns`` (default: every column not starting with ``__``)."""
    names = table.column_names
    if columns is None:
        keep = [n for n in names if not n.startswith("__")]
    else:
        missing = [c for c in columns if c not in names]
        if missing:
            visible = ", ".join(n for n in names if not n.startswith("__"))
            raise BadInputError(
                f"column {missing[0]!r} is not in shard {shard_id[:16]}",
                subject=missing[0],
                hint=f"available columns: {visible}",
            )
        keep = list(columns)
    return table if keep == names else table.select(keep)


class SlotRing:
    """Row space for the numeric columns of a reader's resident shards, one array per column.

    Shards are reserved and released in the same order (plan order), so the space is a
    ring: a reservation takes rows at the head, a release frees them at the tail. Sized
    for the shards a reader holds at once, it is allocated once per iteration and reused,
    and a batch drawn from several shards is a single numpy gather.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._regions: deque[tuple[int, int]] = deque()
        self._head = 0
        self._arrays: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def reserve(self, rows: int) -> int | None:
        """The first row of ``rows`` free rows, or None when they do not fit."""
        if not self._regions:
            base = 0 if rows <= self.capacity else None
        else:
            tail = self._regions[0][0]
            if self._head >= tail:
                base = self._head if self._head + rows <= self.capacity else (0 if rows <= tail else None)
            else:
                base = self._head if self._head + rows <= tail else None
        if base is not None:
            self._regions.append((base, rows))
            self._head = base + rows
        return base

    def release(self, base: int) -> None:
        """Free the oldest reservation (which starts at ``base``)."""
        first, _ = self._regions.popleft()
        if first != base:
            raise RuntimeError(f"slot ring released out of order: {base} before {first}")
        if not self._regions:
            self._head = 0

    def _ring(self, name: str, dtype: np.dtype, tail: tuple[int, ...]) -> np.ndarray | None:
        """The array of column ``name`` (made on first use); None if it has another type."""
        with self._lock:
            ring = self._arrays.get(name)
            if ring is None:
                ring = self._arrays[name] = np.empty((self.capacity, *tail), dtype=dtype)
            if ring.dtype != dtype or ring.shape[1:] != tail:
                return None
            return ring

    def store(self, name: str, kind: NumericKind, base: int, chunks: Sequence[pa.Array]) -> Slab:
        """Copy a shard's numeric column into rows from ``base``."""
        arrays = [kind.convert(c) for c in chunks] or [np.empty((0, *kind.shape))]
        rows = sum(len(a) for a in arrays)
        ring = self._ring(name, arrays[0].dtype, arrays[0].shape[1:])
        if ring is None:  # types differ between shards: keep this one apart
            array = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            return Slab(array, 0, rows)
        at = base
        for a in arrays:
            ring[at : at + len(a)] = a
            at += len(a)
        return Slab(ring, base, rows)

    def store_objects(self, name: str, base: int, values: list[Any]) -> Slab:
        """Place a shard's Python values in rows from ``base`` of an object array."""
        ring = self._ring(name, np.dtype(object), ())
        assert ring is not None
        ring[base : base + len(values)] = values
        return Slab(ring, base, len(values))


class DecodedShard:
    """The columns of one shard (plan index ``index``), converted for batching.

    With a ``ring`` and a reserved ``base`` row, numeric columns are copied into it;
    otherwise each column keeps its own arrays.
    """

    def __init__(
        self,
        index: int,
        shard_id: str,
        table: pa.Table,
        ring: SlotRing | None = None,
        base: int | None = None,
    ) -> None:
        self.index = index
        self.rows = table.num_rows
        self.kinds: dict[str, Kind] = {}
        self.data: dict[str, Any] = {}
        for name in table.column_names:
            chunks = [
                c.dictionary_decode() if pa.types.is_dictionary(c.type) else c
                for c in table.column(name).chunks
            ]
            typ = chunks[0].type if chunks else table.schema.field(name).type
            chunks = chunks or [pa.array([], typ)]
            kind = kind_of(typ)
            try:
                if ring is not None and base is not None and isinstance(kind, NumericKind):
                    self.data[name] = ring.store(name, kind, base, chunks)
                elif ring is not None and base is not None and isinstance(kind, ListKind):
                    self.data[name] = ring.store_objects(name, base, kind.prepare(chunks))
                else:
                    self.data[name] = kind.prepare(chunks)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise BadInputError(f"column {name!r} cannot be read: {e}", subject=shard_id) from e
            self.kinds[name] = kind
            if isinstance(kind, RaggedKind) and lengths_key(name) in table.column_names:
                raise BadInputError(
                    f"column {lengths_key(name)!r} clashes with the lengths of "
                    f"variable-length column {name!r}",
                    subject=lengths_key(name),
                    hint="select columns so the names do not clash",
                )


def pieces(shards: Mapping[int, DecodedShard], rows: Rows) -> tuple[dict[str, Kind], Pieces]:
    """The kinds and the pieces (one per column) of the records addressed by ``rows``.

    ``shards`` holds every shard ``rows`` refers to, keyed by plan index; for a gather,
    consecutive indices starting at its smallest key (a window's shards are).
    """
    which, where = rows
    if isinstance(which, int):
        shard = shards[which]
        return shard.kinds, {n: k.take(shard.data[n], where) for n, k in shard.kinds.items()}
    first = min(shards)
    group = [shards[i] for i in range(first, first + len(shards))]
    local = which - first if first else which
    kinds = group[0].kinds
    try:
        return kinds, {n: k.gather([s.data[n] for s in group], local, where) for n, k in kinds.items()}
    except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise BadInputError(f"shards of one version disagree on their columns: {e}", subject="columns") from e


def _join(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> Pieces:
    if len(parts) == 1:
        return parts[0]
    try:
        return {name: kind.concat([p[name] for p in parts]) for name, kind in kinds.items()}
    except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise BadInputError(f"shards of one version disagree on their columns: {e}", subject="columns") from e


def batch_from_pieces(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> dict[str, Any]:
    """A batch dict (tensors, lists) from the pieces of consecutive windows."""
    joined = _join(kinds, parts)
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        kind.emit(name, joined[name], out)
    return out


def samples_from_pieces(kinds: dict[str, Kind], parts: Sequence[Pieces]) -> list[dict[str, Any]]:
    """One dict per row from the pieces of consecutive windows."""
    joined = _join(kinds, parts)
    names = list(kinds)
    values = [kinds[n].emit_samples(joined[n]) for n in names]
    return [dict(zip(names, row)) for row in zip(*values)]
