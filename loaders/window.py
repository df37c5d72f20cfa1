"""A loaded window: the decoded shards of one plan window, ready to gather batches from.

Rows are addressed in the window's concatenation order (its shards in plan order), the
order :meth:`loaders.plan.EpochPlan.window_rows` uses. Each selected column is converted
once per window (:func:`loaders.columns.make_column`); a batch is then a ``take`` per
column, so no per-sample Python object exists in batch mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cachetier.errors import BadInputError
from loaders.columns import Column, RaggedColumn, Rows, lengths_key, make_column

__all__ = ["LoadedWindow", "select_columns", "batch_from_pieces", "samples_from_pieces"]

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


class LoadedWindow:
    """The columns of one window, concatenated over its shards, with ``take(rows)``."""

    def __init__(self, index: int, tables: Sequence[pa.Table]) -> None:
        self.index = index
        self.rows = sum(t.num_rows for t in tables)
        names = tables[0].column_names if tables else []
        for t in tables[1:]:
            if t.column_names != names:
                raise BadInputError(
                    f"shards of one version disagree on columns: {names} vs {t.column_names}",
                    subject=f"window {index}",
                )
        self.columns: dict[str, Column] = {
            name: make_column(name, [chunk for t in tables for chunk in t.column(name).chunks])
            for name in names
        }
        for name, col in self.columns.items():
            key = lengths_key(name)
            if isinstance(col, RaggedColumn) and key in self.columns:
                raise BadInputError(
                    f"column {key!r} clashes with the lengths of variable-length column {name!r}",
                    subject=key,
                    hint="select columns so the names do not clash",
                )

    @property
    def nbytes(self) -> int:
        """Bytes held by the window's columns."""
        return sum(c.nbytes for c in self.columns.values())

    def take(self, rows: Rows) -> Pieces:
        """The pieces (one per column) at ``rows`` of this window."""
        return {name: col.take(rows) for name, col in self.columns.items()}


def _join(columns: dict[str, Column], parts: Sequence[Pieces]) -> Pieces:
    if len(parts) == 1:
        return parts[0]
    return {name: col.concat([p[name] for p in parts]) for name, col in columns.items()}


def batch_from_pieces(columns: dict[str, Column], parts: Sequence[Pieces]) -> dict[str, Any]:
    """A batch dict (tensors, lists) from the pieces of consecutive windows."""
    joined = _join(columns, parts)
    out: dict[str, Any] = {}
    for name, col in columns.items():
        col.emit(joined[name], out)
    return out


def samples_from_pieces(columns: dict[str, Column], parts: Sequence[Pieces]) -> list[dict[str, Any]]:
    """One dict per row from the pieces of consecutive windows."""
    joined = _join(columns, parts)
    names = list(columns)
    values = [columns[n].emit_samples(joined[n]) for n in names]
    return [dict(zip(names, row)) for row in zip(*values)]
