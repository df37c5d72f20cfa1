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
  batch takes its rows from the blocks. With page-local shuffle blocks (``plan.block``,
  the default) a group is exactly the reader's positions in one block: its rows come
  out of a few runs of each shard, in address order, so no page is mapped twice, and a
  batch that crosses into the next block is finished from the next group. Without
  blocks (uniform windows) the first group is one span, so the first batch waits for
  nothing else, and groups then double up to ``_PIECE_ROWS`` records.

When a reader enters a window, the oldest shard of that window is in its last window.
If the reader needs only a small part of it there (the other readers, ranks and
DataLoader workers, take the rest), that part is copied out and the decoded shard let
go (:meth:`loaders.decoded.DecodedShard.subset`): a reader then holds about
``shuffle_window - 1 + prefetch`` whole shards instead of ``shuffle_window + prefetch``.
A shard read from a shared mapping (the RAM tier) is kept whole: its pages cost the
reader nothing once dropped, and a copy would be private memory.

Shards read from the RAM tier are mapped files, read without mapping their values: rows
copied into a batch or a block are copied from the file with ``pread``
(:data:`loaders.columns.Reader`), so only their offsets and validity (a few bytes a
record) are read in place, and the values of rows spread thinner than one in eight
(``loaders.decoded._SPREAD``). Unmapping costs about a microsecond a page here, and pages
mapped to be copied once counted in the reader's RSS until then: at their peaks 2.5-3 MB
in a process, 4-6 MB in a DataLoader worker gathering spread rows. A reader still
unmaps the pages it has read in place (:meth:`loaders.decoded.DecodedShard.drop_pages`)
every ``DROP_BYTES`` (1 MiB) of them, and after each gathered block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from loaders.columns import Kind, Scratch
from loaders.decoded import DROP_BYTES, GatheredRows, Pieces, slice_rows
from loaders.partition import Runs
from loaders.plan import EpochPlan
from loaders.prefetch import ShardPrefetcher

__all__ = ["batch_rows"]

#: Records gathered at once: the per-chunk calls are paid once per group of this many.
_PIECE_ROWS = 2048
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
                passed += shard.mapped_row_bytes * (rows.stop - rows.start)
        first = False
        yield kinds, parts, _length(runs)
        if passed >= DROP_BYTES:  # the batch is built: the pages behind it are not needed
            shard.drop_pages()
            passed = 0.0


def _gathered(plan: EpochPlan, shards: ShardPrefetcher, spans: Spans) -> Iterator[Parts]:
    gather = _Gatherer(plan, shards, spans)
    return _by_block(plan, gather, spans) if plan.block else _doubling(gather, spans)


def _doubling(gather: _Gatherer, spans: Spans) -> Iterator[Parts]:
    """Uniform windows: groups of whole spans, one span first (the first batch waits for
    nothing else), then doubling up to ``_PIECE_ROWS`` records."""
    target, i = 1, 0
    while i < len(spans):
        first, group, rows = i, [], 0
        while i < len(spans) and (rows < target or not group):
            runs = spans[i]  # computed on each access: once per span
            group.append((i, runs))
            rows += _length(runs)
            i += 1
        target = min(2 * rows, _PIECE_ROWS)
        gathered = gather.gather(group, rows, read_ahead=first > 0)
        at = 0
        for _, runs in group:
            n = _length(runs)
            kinds, piece = gathered.take(at, at + n)
            at += n
            yield kinds, [piece], n
        gather.spare = gathered.blocks


def _by_block(plan: EpochPlan, gather: _Gatherer, spans: Spans) -> Iterator[Parts]:
    """Page-local shuffle: the reader's positions gathered one shuffle block at a time.

    A group holds exactly the positions of one block, in address order, so its rows come
    out of a few runs of each shard and its pages go as it goes. A span that
    crosses into the next block is finished from the next group: gathering its few
    records there with this group would map pages all over the next block (each
    scattered record maps a 64 KiB fault-around of every column) and read them twice.
    """
    i, done = 0, 0  # the next position to gather: span i, after its first ``done``
    runs = spans[0] if len(spans) else []  # span i (a span's runs are computed on each access)
    carry: list[Pieces] = []  # the pieces of span i gathered by earlier groups
    read_ahead = False  # nothing is read ahead before the first batch: it has the cores to itself
    while i < len(spans):
        end = plan.block_end(_position(runs, done))
        group, rows, whole = [], 0, True  # (span index, its runs in the block, their positions, its length)
        while True:
            part, whole = _in_block(plan, runs, done, end)
            if part:
                n = sum(k for _, k in part)
                group.append((i, part, n, _length(runs)))
                rows += n
            if not whole:
                break
            i, done = i + 1, 0
            if i == len(spans):
                break
            runs = spans[i]
        gathered = gather.gather([(s, part) for s, part, _, _ in group], rows, read_ahead)
        read_ahead = True
        at = 0
        for s, _, n, length in group:
            kinds, piece = gathered.take(at, at + n)
            at += n
            if s == i and not whole:  # the span goes on in the next block
                carry.append(piece)
                done += n
            else:
                yield kinds, [*carry, piece], length
                carry = []
        gather.spare = gathered.blocks


def _position(runs: Runs, skip: int) -> int:
    """The position after the first ``skip`` positions of a span."""
    for pos, n in runs:
        if skip < n:
            return pos + skip
        skip -= n
    raise IndexError("past the end of the span")


def _in_block(plan: EpochPlan, runs: Runs, skip: int, end: int) -> tuple[list[tuple[int, int]], bool]:
    """The runs of a span, after its first ``skip`` positions, up to the first position
    outside the shuffle block ending at ``end``; and whether they reach the span's end."""
    out = []
    for pos, n in runs:
        if skip >= n:
            skip -= n
            continue
        pos, n, skip = pos + skip, n - skip, 0
        if plan.block_end(pos) != end:
            return out, False
        inside = min(n, end - pos)
        out.append((pos, inside))
        if inside < n:
            return out, False
    return out, True


class _Gatherer:
    """Gathers groups of a reader's positions (:class:`GatheredRows`), window by window,
    letting go of what older windows' shards the reader no longer needs; ``spare`` holds
    the blocks of the last group, reused by the next."""

    def __init__(self, plan: EpochPlan, shards: ShardPrefetcher, spans: Spans) -> None:
        self.plan, self.shards, self.spans = plan, shards, spans
        self.spare: dict[str, Any] | None = None
        self.scratch = Scratch()
        self._entered = -1  # the last window the reader entered
        self._later: tuple[int, int] | None = None  # (window, span) to let go of after the first batch

    def gather(self, group: list[tuple[int, Runs]], rows: int, read_ahead: bool) -> GatheredRows:
        """The records of ``group`` (``(span index, runs)`` in order), ``rows`` in all."""
        plan, shards = self.plan, self.shards
        if self._later is not None:
            _let_go_of_oldest(plan, shards, self._later[0], self.spans, self._later[1])
            self._later = None
        gathered = GatheredRows(rows, self.spare, DROP_BYTES, self.scratch)
        self.spare = None  # the gathering owns them now: blocks it cannot reuse go as it makes its own
        window, segments = -1, []
        for s, runs in group:
            for pos, n in runs:
                for w, lo, hi in plan.segments(pos, pos + n):
                    if w != window and segments:
                        gathered.add(*_window_rows(plan, shards, window, segments, read_ahead=read_ahead))
                        segments = []
                    if w > self._entered:
                        if self._entered >= 0:
                            _let_go_of_oldest(plan, shards, w, self.spans, s)
                        else:  # after the first batch, which must not wait for a copy
                            self._later = (w, s)
                        self._entered = w
                    window = w
                    segments.append((lo, hi))
        gathered.add(*_window_rows(plan, shards, window, segments, read_ahead=read_ahead))
        gathered.finish()
        gathered.drop_pages()  # the block holds copies
        return gathered


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
