"""Decoded shards, and batches gathered from them column-wise.

A :class:`DecodedShard` holds the selected columns of one shard, each converted once by
its kind (:mod:`loaders.columns`). A batch is a list of *parts*, one per window it
touches; :func:`pieces` takes each part's rows from one shard (a slice in order, or a
take) or gathers them from several, and :func:`batch_from_pieces` /
:func:`samples_from_pieces` turn the pieces into the yielded items. No Python object
is made per sample in batch mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cachetier.errors import BadInputError
from loaders.columns import Kind, RaggedKind, kind_of, lengths_key
from loaders.plan import Rows

__all__ = ["DecodedShard", "select_columns", "pieces", "batch_from_pieces", "samples_from_pieces"]

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


class DecodedShard:
    """The columns of one shard (plan index ``index``), converted for batching."""

    def __init__(self, index: int, shard_id: str, table: pa.Table) -> None:
        self.index = index
        self.rows = table.num_rows
        self.kinds: dict[str, Kind] = {}
        self.data: dict[str, Any] = {}
        for name in table.column_names:
            chunks = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in table.column(name).chunks]
            typ = chunks[0].type if chunks else table.schema.field(name).type
            kind = kind_of(typ)
            try:
                self.data[name] = kind.prepare(chunks or [pa.array([], typ)])
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise BadInputError(f"column {name!r} cannot be read: {e}", subject=shard_id) from e
            self.kinds[name] = kind
            if isinstance(kind, RaggedKind) and lengths_key(name) in table.column_names:
                raise BadInputError(
                    f"column {lengths_key(name)!r} clashes with the lengths of variable-length column {name!r}",
                    subject=lengths_key(name),
                    hint="select columns so the names do not clash",
                )

    @property
    def nbytes(self) -> int:
        """Bytes held by the shard's columns."""
        return sum(k.nbytes(self.data[n]) for n, k in self.kinds.items())


def pieces(shards: Mapping[int, DecodedShard], rows: Rows) -> tuple[dict[str, Kind], Pieces]:
    """The kinds and the pieces (one per column) of the records addressed by ``rows``."""
    which, where = rows
    if isinstance(which, int):
        shard = shards[which]
        return shard.kinds, {n: k.take(shard.data[n], where) for n, k in shard.kinds.items()}
    present = np.unique(which)
    if len(present) == 1:
        shard = shards[int(present[0])]
        return shard.kinds, {n: k.take(shard.data[n], where) for n, k in shard.kinds.items()}
    local = np.searchsorted(present, which)
    group = [shards[int(i)] for i in present]
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
