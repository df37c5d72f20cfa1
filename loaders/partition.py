"""Split the rest of an epoch among ranks and DataLoader workers, at the sample level.

**What is left.** The epoch's global order (:mod:`loaders.plan`) has positions
``0 .. N-1``. What remains of it is a :class:`Remaining`: an increasing sequence of
positions, described by the *levels* of what was taken out. A level ``(sections,
length, taken)`` says that the sequence was cut into ``sections`` consecutive sections
of ``length`` (its last ``size - sections * length`` positions, fewer than
``sections``, beyond them) and the first ``taken`` of each section were consumed. A
fresh epoch has no level; a run that stops after each of ``W`` ranks delivered ``m``
samples adds ``(W, K, m)``, a later stop with the same ranks merges into it, and only a
change of world size (elastic resume) adds a level. So the state of a whole run is
one level, a handful numbers, and the state of an old-style prefix ``c`` is the level
``(1, N, c)``.

**Ranks.** With ``W`` ranks and ``R`` positions remaining, rank ``r`` gets the
contiguous *section* ``[r*K, (r+1)*K)`` of the remaining sequence, ``K = R // W`` (the
remainder, fewer than ``W``, is left out this epoch so that every rank gets the same
count), cut into *chunks* of ``block`` samples (the batch size), the short one last. A
section of the order is a run of consecutive windows of the plan, so a rank reads
about ``1/W`` of the shards (those of its own windows, and the one or two it shares
with a neighbour), as a training node should at scale; interleaving ranks batch by
batch would make every rank read every shard.

Within a rank, chunk ``c`` goes to worker ``c % num_workers``; the DataLoader collects
from its workers round-robin, so the rank delivers its chunks in order, and after every
rank delivered ``m`` samples exactly the first ``m`` of each section are consumed:
:meth:`Partition.after` is what remains. A resume with any world size, worker count or
batch size partitions that afresh: nothing repeated, nothing lost. A chunk is one run
of consecutive positions, or a few after an elastic resume (where it crosses what an
earlier rank consumed); more ranks x workers than shards only leaves some readers with
fewer chunks (possibly none), never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetier.errors import BadInputError

__all__ = ["MAX_LEVELS", "Level", "Partition", "Remaining", "Runs"]

#: Levels a :class:`Remaining` may hold: one per change of world size within an epoch.
MAX_LEVELS = 16

#: ``(sections, length, taken)``, see the module docstring.
Level = tuple[int, int, int]
#: Consecutive positions ``(first, count)``, in increasing order.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Remaining:
    """The positions of an epoch of ``total`` records not consumed yet, in order."""

    total: int
    levels: tuple[Level, ...] = ()

    def __post_init__(self) -> None:
        size = self.total
        if len(self.levels) > MAX_LEVELS:
            raise BadInputError(
                f"{len(self.levels)} levels (at most {MAX_LEVELS})",
                subject="consumed",
                hint="the world size changed too often within one epoch: finish it with one world size",
            )
        if size < 0:
            raise BadInputError(f"an epoch of {size} records", subject="records")
        for sections, length, taken in self.levels:
            if sections < 1 or not 0 <= taken <= length or sections * length > size:
                raise BadInputError(
                    f"level ({sections}, {length}, {taken}) does not fit {size} remaining records",
                    subject="consumed",
                    hint="the state does not belong to this version",
                )
            size -= sections * taken

    @classmethod
    def prefix(cls, total: int, consumed: int) -> Remaining:
        """What is left once the first ``consumed`` positions are done."""
        if not 0 <= consumed <= total:
            raise BadInputError(
                f"position {consumed} is outside an epoch of {total} records",
                subject="consumed",
                hint="the state does not belong to this version",
            )
        return cls(total, ((1, total, consumed),) if consumed else ())

    @property
    def consumed(self) -> int:
        """Positions consumed so far (all ranks together)."""
        return sum(sections * taken for sections, _, taken in self.levels)

    @property
    def size(self) -> int:
        """Positions left."""
        return self.total - self.consumed

    def after(self, sections: int, length: int, taken: int) -> Remaining:
        """What is left once the first ``taken`` of each of ``sections`` sections of
        ``length`` of this sequence are consumed too."""
        if taken == 0:
            return self
        if self.levels:
            s, k, t = self.levels[-1]
            if s == sections and k - t == length:  # the same sections, consumed further
                return Remaining(self.total, (*self.levels[:-1], (s, k, t + taken)))
        return Remaining(self.total, (*self.levels, (sections, length, taken)))

    def runs(self, lo: int, hi: int) -> Runs:
        """The epoch positions of this sequence's items ``[lo, hi)``, as runs."""
        if not 0 <= lo <= hi <= self.size:
            raise IndexError(f"items [{lo}, {hi}) of {self.size}")
        runs = [(lo, hi - lo)] if hi > lo else []
        for sections, length, taken in reversed(self.levels):
            runs = [piece for run in runs for piece in _undo(run, sections, length, taken)]
        return tuple(runs)

    def to_list(self) -> list[list[int]]:
        """The levels as JSON-able lists."""
        return [list(level) for level in self.levels]


def _undo(run: tuple[int, int], sections: int, length: int, taken: int) -> list[tuple[int, int]]:
    """Map a run of items after a level to the runs they were before it."""
    left = length - taken  # items left in each section
    pos, n = run
    out = []
    while n:
        if pos >= sections * left:  # beyond the sections: shifted by what they lost
            out.append((pos + sections * taken, n))
            break
        section, offset = divmod(pos, left)
        m = min(n, left - offset)
        out.append((section * length + taken + offset, m))
        pos, n = pos + m, n - m
    return out


@dataclass(frozen=True, slots=True)
class Partition:
    """The share of rank ``rank`` (of ``world_size``) of the ``remaining`` positions."""

    remaining: Remaining
    world_size: int
    rank: int
    block: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.block < 1:
            raise BadInputError(f"block of {self.block} samples", subject="batch_size", hint="use 1 or more")

    @property
    def per_rank(self) -> int:
        """Samples of the remaining stream that belong to each rank (before drop_last)."""
        return self.remaining.size // self.world_size

    @property
    def full_chunks(self) -> int:
        """Chunks of exactly ``block`` samples per rank."""
        return self.per_rank // self.block

    @property
    def tail(self) -> int:
        """Samples in the rank's last, short chunk (0 when none)."""
        return self.per_rank % self.block

    @property
    def num_chunks(self) -> int:
        """Chunks this rank delivers (the short tail chunk is left out under drop_last)."""
        return self.full_chunks + (1 if self.tail and not self.drop_last else 0)

    @property
    def samples(self) -> int:
        """Samples this rank delivers."""
        return self.full_chunks * self.block + (0 if self.drop_last else self.tail)

    def chunk(self, c: int) -> Runs:
        """Chunk ``c`` of this rank as runs of epoch positions (one, except after an elastic resume)."""
        if not 0 <= c < self.num_chunks:
            raise IndexError(f"chunk {c} of {self.num_chunks}")
        lo = self.rank * self.per_rank + c * self.block
        return self.remaining.runs(lo, lo + (self.block if c < self.full_chunks else self.tail))

    def worker_chunks(self, worker: int, num_workers: int, skip: int = 0) -> range:
        """Chunk indices of worker ``worker`` of ``num_workers``, after its first ``skip``."""
        return range(worker + skip * num_workers, self.num_chunks, num_workers)

    def samples_through(self, c: int) -> int:
        """Samples this rank holds in chunks ``0 .. c`` (``c = -1``: none)."""
        if c < 0:
            return 0
        return min((c + 1) * self.block, self.samples)

    def after(self, delivered: int) -> Remaining:
        """What remains once every rank has delivered the first ``delivered`` of its samples."""
        return self.remaining.after(self.world_size, self.per_rank, delivered)
