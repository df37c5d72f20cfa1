"""The epoch plan: the global order of one epoch, a pure function of (version, seed, epoch).

Positions ``0 .. N-1`` of an epoch map to records ``(shard, row)``:

- **shuffle off**: version order; window ``w`` is shard ``w``.
- **shuffle on**: a *sliding window* over ``k = shuffle_window`` *groups* of shards. The
  shards are permuted, then cut into groups of consecutive shards (in that permuted
  order) that each weigh at least ``min_group`` (the last may weigh less); with the
  default ``min_group=0`` every shard is a group of its own. The rows of each group are
  permuted and cut into ``k`` parts; window ``w`` holds part ``j`` of group ``w - j`` for
  ``j = 0 .. k-1``, its records permuted among themselves. So every batch mixes records
  of ``k`` groups, a shard is read once per epoch and used by ``k`` consecutive windows,
  and a reader holds about ``k`` decoded groups at a time (bounded memory). The first
  window needs only the first group, so the first batch comes after one group is
  decoded; mixing ramps up over the first ``k - 1`` windows. Groups let a dataset of
  many small shards (a ``files`` dataset cuts 64 KiB shards) mix as many records per
  window as one of big shards, instead of a handful.

Within a window, records are shuffled *page-locally* when the plan has a ``block`` (in
the weight unit: decoded bytes for a repository). A group that weighs more than a block
is cut into *runs* of neighbouring rows (``block / 16`` each); the group permutes whole
runs, so its parts are made of runs; a window permutes its runs and cuts them into
*blocks* of about ``block`` each (of equal weight: no short remainder), and the records
of each block are permuted among themselves. Consecutive positions then read a few small
ranges of the shards, not rows scattered over the whole window: a shuffled epoch maps
each page about once, as an unshuffled one does, instead of once per gathered batch (the
idea of FFCV's quasi-random order). A batch mixes the records of about 16 runs from all
the groups of its window. A group that weighs at most a block has runs of one row, so a
window of such groups is permuted uniformly; ``block=0`` permutes every window
uniformly.

The order depends on nothing else: not on ranks, workers, batch size or numpy's random
stream. Permutations come from sorting a keyed SplitMix64 hash of the indices, a function
fixed here forever, so two machines (or two numpy versions) agree on every position.
Any position is reachable directly (resume never replays); permutations are computed
per shard and per window, lazily.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from cachetier.errors import BadInputError

__all__ = ["EpochPlan", "Rows", "keyed_permutation", "make_plan", "plan_key"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: Runs in a shuffle block (see the module docstring).
_RUNS_PER_BLOCK = 16
#: A group is cut into runs that each of its ``window`` parts gets at least this many of.
_MIN_RUNS_PER_PART = 4

#: Where a window's positions live: ``(shard, row slice)`` when they come from one shard
#: in order, else ``(shard per position, row per position)``; shards are plan indices.
Rows = tuple[int, slice] | tuple[int, np.ndarray] | tuple[np.ndarray, np.ndarray]


def plan_key(version: str, seed: int, epoch: int, *salt: int) -> int:
    """A 64-bit key for one permutation: a hash of the version, seed, epoch and salt."""
    text = ":".join([version, str(seed), str(epoch), *map(str, salt)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def keyed_permutation(n: int, key: int) -> np.ndarray:
    """A permutation of ``range(n)`` (int64) determined by ``key`` alone.

    Sort keys are the high 32 bits of a SplitMix64 hash of each index, with the index in
    the low 32 bits: all distinct, so every sort algorithm (numpy's fast unstable one
    included) gives the same order.
    """
    x = _sort_keys(n, key)
    x |= np.arange(n, dtype=np.uint64)
    return np.argsort(x)


def _sort_keys(n: int, key: int) -> np.ndarray:
    """The high 32 bits of a keyed SplitMix64 hash of each of ``range(n)`` (low bits zero)."""
    if n >= 1 << 32:
        raise BadInputError(f"cannot permute {n} items", subject="shuffle window", hint="use smaller shards")
    index = np.arange(n, dtype=np.uint64)
    x = (index + np.uint64(1)) * _GOLDEN + np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    x &= np.uint64(0xFFFFFFFF00000000)
    return x


class _Lru(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: int, value: object) -> None:
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)


class EpochPlan:
    """The order of one epoch: shards in plan order and the windows over them (read-only).

    ``segments(start, stop)`` splits a range of positions by window;
    ``window_shards(w)`` names the shards window ``w`` reads; ``window_rows`` turns
    window positions into ``(shard, row)`` addresses; ``retired_after(w)`` names the
    shards no window after ``w`` reads.
    """

    def __init__(
        self,
        version: str,
        seed: int,
        epoch: int,
        shuffle: bool,
        window: int,
        shard_ids: tuple[str, ...],
        counts: np.ndarray,
        groups: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        block: int = 0,
    ) -> None:
        self.version = version
        self.seed = seed
        self.epoch = epoch
        self.shuffle = shuffle
        self.window = window
        self.shard_ids = shard_ids
        self.counts = counts
        m = len(shard_ids)
        self.k = k = window if shuffle else 1
        #: group g holds the shards [groups[g], groups[g+1]) (plan indices); one per shard unshuffled
        self.groups = groups if shuffle and groups is not None else np.arange(m + 1, dtype=np.int64)
        g_count = len(self.groups) - 1
        first_rows = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        #: records of each group
        self.group_counts = first_rows[self.groups[1:]] - first_rows[self.groups[:-1]]
        #: the weight of a shuffle block (0: uniform windows), see the module docstring
        self.block = block if shuffle and weights is not None and g_count else 0
        #: rows per run of each group (1 everywhere without blocks); weight of a row of each
        #: group, in whole units (integers keep the cut into blocks exact on any machine)
        self.run_rows = np.ones(g_count, dtype=np.int64)
        self.row_weight = np.ones(g_count, dtype=np.int64)
        if self.block:
            assert weights is not None
            first_weight = np.concatenate([[0], np.cumsum(weights)]).astype(np.int64)
            group_weights = first_weight[self.groups[1:]] - first_weight[self.groups[:-1]]
            self.row_weight = np.maximum(1, group_weights // np.maximum(self.group_counts, 1))
            self.run_rows = _run_rows(self.group_counts, group_weights, self.block, k)
        # Part j of group g covers its permuted rows [parts[g, j], parts[g, j+1]): whole
        # runs, the short run (count % run_rows) last.
        full_runs = self.group_counts // self.run_rows
        self.parts = (
            (np.arange(k + 1, dtype=np.int64)[None, :] * full_runs[:, None]) // k * self.run_rows[:, None]
            if g_count
            else np.zeros((0, k + 1), np.int64)
        )
        if g_count:
            self.parts[:, k] = self.group_counts
        num_windows = g_count + k - 1 if g_count else 0
        sizes = np.zeros(num_windows, dtype=np.int64)
        for j in range(k):
            sizes[j : j + g_count] += self.parts[:, j + 1] - self.parts[:, j]
        #: global position where each window starts, plus the total as a sentinel
        self.window_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._starts = self.window_starts.tolist()
        self._bounds = self.groups.tolist()
        self._group_rows_cache = _Lru(2 * k + 4)
        self._window_maps = _Lru(3)

    @property
    def records(self) -> int:
        """Records in one epoch."""
        return self._starts[-1]

    @property
    def num_windows(self) -> int:
        """Number of windows in the epoch."""
        return len(self._starts) - 1

    def window_of(self, position: int) -> int:
        """The window that holds ``position``."""
        if not 0 <= position < self.records:
            raise IndexError(f"position {position} outside an epoch of {self.records} records")
        return bisect.bisect_right(self._starts, position) - 1

    def window_shards(self, w: int) -> range:
        """Plan indices of the shards window ``w`` reads."""
        g_count = len(self._bounds) - 1
        first, last = max(0, w - self.k + 1), min(w, g_count - 1)
        return range(self._bounds[first], self._bounds[last + 1])

    def retired_after(self, w: int) -> range:
        """Plan indices of the shards window ``w`` is the last to read (none: an empty range)."""
        g = w - self.k + 1
        if not 0 <= g < len(self._bounds) - 1:
            return range(0)
        return range(self._bounds[g], self._bounds[g + 1])

    def segments(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """Split positions ``[start, stop)`` into ``(window, lo, hi)`` with window-relative bounds."""
        if start >= stop:
            return
        w = self.window_of(start)
        while start < stop:
            base = self._starts[w]
            end = min(stop, self._starts[w + 1])
            if end > start:
                yield w, start - base, end - base
            start = end
            w += 1

    def window_rows(self, w: int, lo: int, hi: int) -> Rows:
        """The ``(shard, row)`` addresses of window ``w``'s positions ``[lo, hi)``."""
        if not self.shuffle:
            return w, slice(lo, hi)
        which, rows, _ = self._window_map(w)
        if self.k == 1 and self._bounds[w + 1] - self._bounds[w] == 1:
            return self._bounds[w], rows[lo:hi]
        return which[lo:hi], rows[lo:hi]

    def _group_rows(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Group ``g``'s records in their permuted order: the shard (plan index) and row of each."""
        cached = self._group_rows_cache.get(g)
        if cached is not None:
            return cached
        lo, hi = self._bounds[g], self._bounds[g + 1]
        count, run = int(self.group_counts[g]), int(self.run_rows[g])
        perm = keyed_permutation(count // run, plan_key(self.version, self.seed, self.epoch, 2, g))
        if run > 1:  # whole runs move; the short run stays last
            perm = (perm[:, None] * run + np.arange(run)).ravel()
            perm = np.concatenate([perm, np.arange(len(perm), count)])
        if hi - lo == 1:
            result = (np.full(len(perm), lo, dtype=np.int64), perm)
        else:
            ends = np.cumsum(self.counts[lo:hi])
            local = np.searchsorted(ends, perm, side="right")
            result = (local + lo, perm - (ends - self.counts[lo:hi])[local])
        self._group_rows_cache.put(g, result)
        return result

    def block_end(self, position: int) -> int:
        """The position after the shuffle block that holds ``position`` (without blocks:
        after its window)."""
        w = self.window_of(position)
        base, end = self._starts[w], self._starts[w + 1]
        if not self.block:
            return end
        starts = self._window_map(w)[2]
        after = int(np.searchsorted(starts, position - base, side="right"))
        return base + int(starts[after]) if after < len(starts) else end

    def _window_map(self, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For every position of window ``w``: its shard (plan index) and row; and the
        window-relative first position of each of its shuffle blocks."""
        cached = self._window_maps.get(w)
        if cached is not None:
            return cached
        which_parts, row_parts, run_parts, weight_parts = [], [], [], []
        runs = 0
        for j in range(self.k):
            g = w - j
            if 0 <= g < len(self.group_counts):
                a, b = self.parts[g, j], self.parts[g, j + 1]
                which, rows = self._group_rows(g)
                which_parts.append(which[a:b])
                row_parts.append(rows[a:b])
                if self.block and b > a:
                    run_parts.append(np.arange(b - a, dtype=np.int64) // self.run_rows[g] + runs)
                    weight_parts.append(np.full(b - a, self.row_weight[g]))
                    runs = int(run_parts[-1][-1]) + 1
        which = np.concatenate(which_parts)
        rows = np.concatenate(row_parts)
        if run_parts:  # with blocks (and records)
            order, block_starts = self._block_order(
                np.concatenate(run_parts), np.concatenate(weight_parts), runs, w
            )
        else:
            order = keyed_permutation(len(rows), plan_key(self.version, self.seed, self.epoch, 1, w))
            block_starts = np.zeros(1, dtype=np.int64)
        result = (which[order], rows[order], block_starts)
        self._window_maps.put(w, result)
        return result

    def _block_order(
        self, run_of: np.ndarray, weight: np.ndarray, runs: int, w: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w``'s order from the run and weight of each of its records (runs
        permuted, cut into blocks of about ``block``, records permuted within their
        block), and the first position of each block.

        The blocks share the window's weight evenly (their number rounded), so no block
        is a short remainder of a run or two, which a batch would then draw from alone.
        """
        perm = keyed_permutation(runs, plan_key(self.version, self.seed, self.epoch, 1, w))
        run_weight = np.bincount(run_of, weights=weight, minlength=runs).astype(np.int64)[perm]
        total = int(run_weight.sum())
        blocks = max(1, (total + self.block // 2) // self.block)
        block_of_run = np.empty(runs, dtype=np.int64)
        block_of_run[perm] = (np.cumsum(run_weight) - run_weight) * blocks // max(total, 1)
        block_of = block_of_run[run_of]
        sizes = np.bincount(block_of)
        starts = np.concatenate([[0], np.cumsum(sizes[sizes > 0])[:-1]]).astype(np.int64)
        return _sort_within(block_of, plan_key(self.version, self.seed, self.epoch, 3, w)), starts


def _sort_within(group_of: np.ndarray, key: int) -> np.ndarray:
    """The indices of ``group_of`` (non-negative ints) by group, in an order determined
    by ``key`` within each group: one sort of unique 64-bit keys (group, hash, index)."""
    n = len(group_of)
    index_bits = max(1, (n - 1).bit_length())
    group_bits = max(1, int(group_of.max(initial=0)).bit_length())
    hash_bits = min(32, 64 - index_bits - group_bits)
    hashed = _sort_keys(n, key) >> np.uint64(64 - hash_bits)
    if hash_bits < 16:  # a window of billions of records: sort in two passes
        return np.lexsort((hashed, group_of))
    x = group_of.astype(np.uint64) << np.uint64(hash_bits + index_bits)
    x |= hashed << np.uint64(index_bits)
    x |= np.arange(n, dtype=np.uint64)
    return np.argsort(x)


def make_plan(
    version: str,
    shards: Sequence[tuple[str, int]],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    window: int,
    weights: Sequence[int] | None = None,
    min_group: int = 0,
    block: int = 0,
) -> EpochPlan:
    """The plan of ``epoch`` over ``shards`` (version order); empty shards are left out.

    With ``shuffle``, shards are grouped (after their permutation) into runs that weigh
    at least ``min_group``; ``weights`` are the shards' weights in the units of
    ``min_group`` and ``block`` (such as decoded bytes), their record counts when None.
    With ``block`` windows are shuffled page-locally (see the module docstring).
    """
    if block < 0:
        raise BadInputError(f"shuffle block of {block} bytes", subject="shuffle_block", hint="use 0 or more")
    if window < 1:
        raise BadInputError(
            f"shuffle window of {window} shards", subject="shuffle_window", hint="use 1 or more"
        )
    if epoch < 0:
        raise BadInputError(f"epoch {epoch} is negative", subject="epoch")
    if weights is not None and len(weights) != len(shards):
        raise BadInputError(f"{len(weights)} weights for {len(shards)} shards", subject="weights")
    kept_at = [i for i, (_, n) in enumerate(shards) if int(n) > 0]
    ids = [str(shards[i][0]) for i in kept_at]
    counts = np.fromiter((int(shards[i][1]) for i in kept_at), dtype=np.int64, count=len(kept_at))
    weight = (
        counts if weights is None else np.fromiter((int(weights[i]) for i in kept_at), np.int64, len(kept_at))
    )
    groups = None
    if shuffle and kept_at:
        order = keyed_permutation(len(kept_at), plan_key(version, seed, epoch, 0))
        ids = [ids[i] for i in order]
        counts, weight = counts[order], weight[order]
        groups = _group_bounds(weight, min_group)
    return EpochPlan(version, seed, epoch, shuffle, window, tuple(ids), counts, groups, weight, block)


def _run_rows(counts: np.ndarray, weights: np.ndarray, block: int, window: int) -> np.ndarray:
    """Rows per run of each group: 1 for a group that weighs at most ``block``, else
    ``block / _RUNS_PER_BLOCK`` of its weight, but small enough that each of the group's
    ``window`` parts gets a few runs."""
    rows = (block // _RUNS_PER_BLOCK) * counts // np.maximum(weights, 1)
    rows = np.minimum(rows, counts // (_MIN_RUNS_PER_PART * window))
    return np.where(weights > block, np.maximum(rows, 1), 1).astype(np.int64)


def _group_bounds(weight: np.ndarray, min_group: int) -> np.ndarray:
    """Cut shards into consecutive runs weighing at least ``min_group`` each (the last one
    may weigh less); return the first shard of each run, then the shard count."""
    m = len(weight)
    if min_group <= 0 or m == 0:
        return np.arange(m + 1, dtype=np.int64)
    bounds = [0]
    total = 0
    for i, x in enumerate(weight.tolist()):
        total += x
        if total >= min_group:
            bounds.append(i + 1)
            total = 0
    if bounds[-1] != m:
        bounds.append(m)
    return np.asarray(bounds, dtype=np.int64)
