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
    x |= index
    return np.argsort(x)


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
        #: part j of group g covers its permuted rows [parts[g, j], parts[g, j+1])
        self.parts = (
            (np.arange(k + 1, dtype=np.int64)[None, :] * self.group_counts[:, None]) // k
            if g_count
            else np.zeros((0, k + 1), np.int64)
        )
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
        which, rows = self._window_map(w)
        if self.k == 1 and self._bounds[w + 1] - self._bounds[w] == 1:
            return self._bounds[w], rows[lo:hi]
        return which[lo:hi], rows[lo:hi]

    def _group_rows(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """Group ``g``'s records in their permuted order: the shard (plan index) and row of each."""
        cached = self._group_rows_cache.get(g)
        if cached is not None:
            return cached
        lo, hi = self._bounds[g], self._bounds[g + 1]
        perm = keyed_permutation(
            int(self.group_counts[g]), plan_key(self.version, self.seed, self.epoch, 2, g)
        )
        if hi - lo == 1:
            result = (np.full(len(perm), lo, dtype=np.int64), perm)
        else:
            ends = np.cumsum(self.counts[lo:hi])
            local = np.searchsorted(ends, perm, side="right")
            result = (local + lo, perm - (ends - self.counts[lo:hi])[local])
        self._group_rows_cache.put(g, result)
        return result

    def _window_map(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """For every position of window ``w``: its shard (plan index) and row."""
        cached = self._window_maps.get(w)
        if cached is not None:
            return cached
        which_parts, row_parts = [], []
        for j in range(self.k):
            g = w - j
            if 0 <= g < len(self.group_counts):
                a, b = self.parts[g, j], self.parts[g, j + 1]
                which, rows = self._group_rows(g)
                which_parts.append(which[a:b])
                row_parts.append(rows[a:b])
        which = np.concatenate(which_parts)
        rows = np.concatenate(row_parts)
        order = keyed_permutation(len(rows), plan_key(self.version, self.seed, self.epoch, 1, w))
        result = (which[order], rows[order])
        self._window_maps.put(w, result)
        return result


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
) -> EpochPlan:
    """The plan of ``epoch`` over ``shards`` (version order); empty shards are left out.

    With ``shuffle``, shards are grouped (after their permutation) into runs that weigh
    at least ``min_group``; ``weights`` are the shards' weights in the units of
    ``min_group`` (such as decoded bytes), their record counts when None.
    """
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
    return EpochPlan(version, seed, epoch, shuffle, window, tuple(ids), counts, groups)


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
