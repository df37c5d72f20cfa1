"""The rows of a reader's batches, taken from the decoded shards of the windows they touch.

A reader's batches are *spans* of the epoch's order (runs of consecutive positions,
``(first, length)``, usually one, see :mod:`loaders.partition`); their records live
in the shards the plan names
(:mod:`loaders.plan`), which the prefetcher (:mod:`loaders.prefetch`) holds decoded.

- **No shuffle**: a span is a few runs of consecutive rows of one or two shards; each
  batch slices them (:func:`loaders.decoded.slice_rows`).
- **Shuffle**: a span's records are scattered over the chunks of a window's shards.
  The records of a few spans at a time are gathered into blocks
  (:class:`loaders.decoded.GatheredRows`, one call per chunk and column), and each
  batch takes its rows from the blocks. The first group is one span, so the first
  batch waits for nothing else; groups then double up to ``_PIECE_ROWS`` records. With
  page-local shuffle blocks (``plan.block``) a group goes on to the end of the block it
  has reached, so each later group gathers whole blocks: their runs come out of each
  chunk as ranges of rows, and no page is mapped twice.

When a reader enters a window, the oldest shard of that window is in its last window.
If the reader needs only a small part of it there (the other readers, ranks and
DataLoader workers, take the rest), that part is copied out and the decoded shard let
go (:meth:`loaders.decoded.DecodedShard.subset`): a reader then holds about
``shuffle_window - 1 + prefetch`` whole shards instead of ``shuffle_window + prefetch``.
A shard read from a shared mapping (the RAM tier) is kept whole: its pages cost the
reader nothing once dropped, and a copy would be private memory.

Shards read from the RAM tier are mapped files. A reader unmaps the pages it has passed
(:meth:`loaders.decoded.DecodedShard.drop_pages`) every ``DROP_BYTES`` (1 MiB) of
records read, in order or gathered (a gather goes through each chunk in address order),
and after each gathered block, whose rows are copies. So a reader's RSS holds a MiB or
two of shard pages, whatever the shards weigh; what it reads again maps back from tmpfs
(at the cost of a page fault).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loaders.columns import Kind
from loaders.decoded import DROP_BYTES, GatheredRows, slice_rows
from loaders.partition import Runs
from loaders.plan import EpochPlan
from loaders.prefetch import ShardPrefetcher

__all__ = ["batch_rows"]

#: Records gathered at once: the per-chunk calls are paid once per group of this many.
_PIECE_ROWS = 2048
#: With shuffle blocks, at least this many, and then on to the end of a block.
_BLOCK_PIECE_ROWS = _PIECE_ROWS // 2
#: Copy out the oldest shard of a window when the reader needs at most this share of it.
_SUBSET_SHARE = 0.4

#: A span's column kinds, its pieces (one per run of rows) and its length.
Parts = tuple[dict[str, Kind], list[dict[str, Any]], int]
Spans = Sequence[Runs]


def batch_rows(plan: EpochPlan, shards: ShardPrefetcher, spans: Spans) -> Iterator[Parts]:
    """For each span, in order: the kinds and the pieces of its records, and its length."""
    if plan.shuffle:
        return _gathered(plan, shards, spans)
    return _in_order(plan, shards, spans)


def _in_order(plan: EpochPlan, shards: ShardPrefetcher, spans: Spans) -> Iterator[Parts]:
    first = True  # nothing is read ahead before the first batch: it has the cores to itself
    passed = 0.0  # bytes read since the pages were last dropped
    for runs in spans:
        kinds: dict[str, Kind] = {}
        parts = []
        for pos, n in runs:
            for w, lo, hi in plan.segments(pos, pos + n):
                which, rows = plan.window_rows(w, lo, hi)
                assert isinstance(which, int) and isinstance(rows, slice)
                held = shards.acquire(plan.window_shards(w), read_ahead=not first)
                shard = held[which]
                kinds, piece = slice_rows(shard, rows.start, rows.stop)
                parts.append(piece)
                passed += shard.row_bytes * (rows.stop - rows.start)
        first = False
        yield kinds, parts, _length(runs)
        if passed >= DROP_BYTES:  # the batch is built: the pages behind it are not needed
            shard.drop_pages()
            passed = 0.0


def _gathered(plan: EpochPlan, shards: ShardPrefetcher, spans: Spans) -> Iterator[Parts]:
    target, spare, entered, later = 1, None, -1, None
    i = 0
    while i < len(spans):
        if later is not None:
            _let_go_of_oldest(plan, shards, *later)
            later = None
        first, group, rows = i, [], 0
        while i < len(spans) and (rows < target or not group):
            group.append(spans[i])
            rows += _length(group[-1])
            i += 1
        if plan.block and target == _BLOCK_PIECE_ROWS:
            # go on to the end of the shuffle block: the next group then starts with a
            # whole block, whose runs come out as ranges of rows, none of its pages read twice
            last_pos, last_n = group[-1][-1]
            end = plan.block_end(last_pos + last_n - 1)
            while i < len(spans) and spans[i][0][0] < end:
                group.append(spans[i])
                rows += _length(group[-1])
                i += 1
        target = min(2 * rows, _BLOCK_PIECE_ROWS if plan.block else _PIECE_ROWS)
        # a group that holds whole blocks is gathered in address order: its pages can go
        # every DROP_BYTES without being read twice (measured: no CPU cost against keeping
        # them for a block, 4-8 MB less RSS per reader)
        gathered = GatheredRows(rows, spare, DROP_BYTES)
        window, segments = -1, []
        for s, runs in enumerate(group, first):
            for pos, n in runs:
                for w, lo, hi in plan.segments(pos, pos + n):
                    if w != window and segments:
                        gathered.add(*_window_rows(plan, shards, window, segments, read_ahead=first > 0))
                        segments = []
                    if w > entered:
                        if entered >= 0:
                            _let_go_of_oldest(plan, shards, w, spans, s)
                        else:  # after the first batch, which must not wait for a copy
                            later = (w, spans, s)
                        entered = w
                    window = w
                    segments.append((lo, hi))
        # nothing is read ahead before the first batch: it has the cores to itself
        held, which, rows = _window_rows(plan, shards, window, segments, read_ahead=first > 0)
        gathered.add(held, which, rows)
        gathered.finish()
        gathered.drop_pages()  # the block holds copies
        at = 0
        for runs in group:
            n = _length(runs)
            kinds, piece = gathered.take(at, at + n)
            at += n
            yield kinds, [piece], n
        spare = gathered.blocks


def _length(runs: Runs) -> int:
    return runs[0][1] if len(runs) == 1 else sum(n for _, n in runs)


def _window_rows(
    plan: EpochPlan,
    shards: ShardPrefetcher,
    w: int,
    segments: list[tuple[int, int]],
    read_ahead: bool = True,
) -> tuple[dict[int, Any], int | np.ndarray, np.ndarray]:
    """The held shards of window ``w`` and the addresses of its positions ``segments`` (window-relative)."""
    shards.schedule(plan.window_shards(w))  # the addresses are computed while the shards are read
    parts = [plan.window_rows(w, lo, hi) for lo, hi in segments]
    held = shards.acquire(plan.window_shards(w), read_ahead=read_ahead)
    rows = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
    first = parts[0][0]
    if isinstance(first, int):
        return held, first, rows  # type: ignore[return-value]
    which = first if len(parts) == 1 else np.concatenate([p[0] for p in parts])
    return held, which, rows  # type: ignore[return-value]


def _let_go_of_oldest(plan: EpochPlan, shards: ShardPrefetcher, w: int, spans: Spans, s: int) -> None:
    """For each shard that window ``w`` is the last to read, keep only its records that
    spans ``s, s+1, ...`` need there (when they are few)."""
    retiring = plan.retired_after(w)
    if not retiring or plan.k == 1:
        return
    start, stop = int(plan.window_starts[w]), int(plan.window_starts[w + 1])
    segments = []
    for runs in spans[s:]:
        if runs[0][0] >= stop:
            break
        for pos, n in runs:
            lo, hi = max(pos, start), min(pos + n, stop)
            if hi > lo:
                segments.append((lo - start, hi - start))
    # before reading ahead: the next shard must not be read while this one is still whole
    held, which, rows = _window_rows(plan, shards, w, segments, read_ahead=False)
    for oldest in retiring:
        shard = held.get(oldest)
        if shard is None or shard.kept is not None or shard.shared:
            continue
        keep = np.unique(rows[which == oldest])
        if len(keep) <= _SUBSET_SHARE * shard.rows:
            shards.replace(oldest, shard.subset(keep))
