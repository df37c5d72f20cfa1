"""The epoch plan: the global order of one epoch, a pure function of (version, seed, epoch).

Positions ``0 .. N-1`` of an epoch map to records ``(shard, row)``:

- **shuffle off**: version order; each shard is its own *window*.
- **shuffle on**: the shards are permuted, cut into consecutive windows of
  ``window`` shards, and the records of each window are permuted among themselves.
  A reader therefore holds about one window of decoded shards at a time (bounded
  memory), every batch mixes records of several shards, and the shards of a window
  are read together (locality).

The order depends on nothing else: not on ranks, workers, batch size or numpy's random
stream. Permutations come from sorting a keyed SplitMix64 hash of the indices, a function
fixed here forever, so two machines (or two numpy versions) agree on every position.
Any position is reachable directly (resume never replays), and permutations are
computed per window, lazily.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

from cachetier.errors import BadInputError

__all__ = ["EpochPlan", "make_plan", "keyed_permutation", "plan_key"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def plan_key(version: str, seed: int, epoch: int, *salt: int) -> int:
    """A 64-bit key for one permutation: a hash of the version, seed, epoch and salt."""
    text = ":".join([version, str(seed), str(epoch), *map(str, salt)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def keyed_permutation(n: int, key: int) -> np.ndarray:
    """A permutation of ``range(n)`` (int64) determined by ``key`` alone."""
    x = np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN + np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    return np.argsort(x, kind="stable")


class EpochPlan:
    """The order of one epoch: shards in plan order, grouped in windows (read-only).

    ``segments(start, stop)`` splits a range of positions by window; ``window_rows``
    turns positions within a window into rows of the window's concatenated shards.
    """

    __slots__ = ("_perm_cache", "counts", "epoch", "seed", "shard_ids", "shuffle", "version", "window",
                 "window_first", "window_starts")

    def __init__(self, version: str, seed: int, epoch: int, shuffle: bool, window: int,
                 shard_ids: tuple[str, ...], counts: np.ndarray) -> None:
        self.version = version
        self.seed = seed
        self.epoch = epoch
        self.shuffle = shuffle
        self.window = window
        self.shard_ids = shard_ids
        self.counts = counts
        n = len(shard_ids)
        per = window if shuffle else 1
        #: index (in plan order) of the first shard of each window, plus a sentinel
        self.window_first = np.append(np.arange(0, n, per, dtype=np.int64), n)
        bounds = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        #: global position where each window starts, plus the total as a sentinel
        self.window_starts = bounds[self.window_first]
        self._perm_cache: dict[int, np.ndarray] = {}

    @property
    def records(self) -> int:
        """Records in one epoch."""
        return int(self.window_starts[-1])

    @property
    def num_windows(self) -> int:
        """Number of windows in the epoch."""
        return len(self.window_first) - 1

    def window_of(self, position: int) -> int:
        """The window that holds ``position``."""
        if not 0 <= position < self.records:
            raise IndexError(f"position {position} outside an epoch of {self.records} records")
        return int(np.searchsorted(self.window_starts, position, side="right")) - 1

    def window_shards(self, w: int) -> tuple[str, ...]:
        """The shard ids of window ``w``, in the order their rows are concatenated."""
        return self.shard_ids[self.window_first[w] : self.window_first[w + 1]]

    def segments(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """Split positions ``[start, stop)`` into ``(window, lo, hi)`` with window-relative bounds."""
        if start >= stop:
            return
        w = self.window_of(start)
        while start < stop:
            base = int(self.window_starts[w])
            end = min(stop, int(self.window_starts[w + 1]))
            if end > start:
                yield w, start - base, end - base
            start = end
            w += 1

    def window_rows(self, w: int, lo: int, hi: int) -> slice | np.ndarray:
        """Rows (of window ``w``'s concatenated shards) at window positions ``[lo, hi)``."""
        if not self.shuffle:
            return slice(lo, hi)
        perm = self._perm_cache.get(w)
        if perm is None:
            size = int(self.window_starts[w + 1] - self.window_starts[w])
            perm = keyed_permutation(size, plan_key(self.version, self.seed, self.epoch, 1, w))
            if len(self._perm_cache) >= 4:
                self._perm_cache.pop(next(iter(self._perm_cache)))
            self._perm_cache[w] = perm
        return perm[lo:hi]


def make_plan(version: str, shards: Sequence[tuple[str, int]], *, seed: int, epoch: int,
              shuffle: bool, window: int) -> EpochPlan:
    """The plan of ``epoch`` over ``shards`` (version order); empty shards are left out."""
    if window < 1:
        raise BadInputError(f"shuffle window of {window} shards", subject="shuffle_window", hint="use 1 or more")
    if epoch < 0:
        raise BadInputError(f"epoch {epoch} is negative", subject="epoch")
    kept = [(str(sid), int(n)) for sid, n in shards if int(n) > 0]
    ids = [sid for sid, _ in kept]
    counts = np.fromiter((n for _, n in kept), dtype=np.int64, count=len(kept))
    if shuffle and kept:
        order = keyed_permutation(len(kept), plan_key(version, seed, epoch, 0))
        ids = [ids[i] for i in order]
        counts = counts[order]
    return EpochPlan(version, seed, epoch, shuffle, window, tuple(ids), counts)
