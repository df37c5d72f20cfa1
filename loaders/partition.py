"""Split the rest of an epoch among ranks and DataLoader workers, at the sample level.

The epoch's global order (:mod:`loaders.plan`) is consumed as a *prefix*: ``start``
positions are done, ``[start, N)`` remain. With ``W`` ranks each rank gets
``K = (N - start) // W`` samples (the remainder, fewer than ``W``, is left out this
epoch so that every rank gets the same count), cut into *chunks* of ``block`` samples
(the batch size). Rank chunks interleave over the global order::

    full rounds   chunk c < K // block:   positions start + (c*W + r)*block + [0, block)
    the tail      the last K % block:     positions base + r*e + [0, e)

so after every rank has delivered ``m`` samples, ``m`` a multiple of ``block`` (or all
``K``), exactly the positions ``[start, start + m*W)`` are consumed. The state stores
that one number, and a resume with any world size, worker count or batch size
partitions ``[start + m*W, N)`` afresh: nothing repeated, nothing lost.

Within a rank, chunk ``c`` goes to worker ``c % num_workers``; the DataLoader collects
from its workers round-robin, so the rank delivers its chunks in order. Every chunk is
a contiguous range of global positions, so more ranks x workers than shards only
leaves some readers with fewer chunks (possibly none), never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetier.errors import BadInputError

__all__ = ["Partition"]


@dataclass(frozen=True, slots=True)
class Partition:
    """The share of rank ``rank`` (of ``world_size``) of positions ``[start, total)``."""

    start: int
    total: int
    world_size: int
    rank: int
    block: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.block < 1:
            raise BadInputError(f"block of {self.block} samples", subject="batch_size", hint="use 1 or more")
        if not 0 <= self.start <= self.total:
            raise BadInputError(
                f"position {self.start} is outside an epoch of {self.total} records",
                subject="consumed",
                hint="the state does not belong to this version",
            )

    @property
    def per_rank(self) -> int:
        """Samples of the remaining stream that belong to each rank (before drop_last)."""
        return (self.total - self.start) // self.world_size

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

    def chunk(self, c: int) -> tuple[int, int]:
        """Chunk ``c`` of this rank as ``(first global position, length)``."""
        if not 0 <= c < self.num_chunks:
            raise IndexError(f"chunk {c} of {self.num_chunks}")
        w, b = self.world_size, self.block
        if c < self.full_chunks:
            return self.start + (c * w + self.rank) * b, b
        base = self.start + self.full_chunks * w * b
        return base + self.rank * self.tail, self.tail

    def worker_chunks(self, worker: int, num_workers: int, skip: int = 0) -> range:
        """Chunk indices of worker ``worker`` of ``num_workers``, after its first ``skip``."""
        return range(worker + skip * num_workers, self.num_chunks, num_workers)

    def samples_through(self, c: int) -> int:
        """Samples this rank holds in chunks ``0 .. c`` (``c = -1``: none)."""
        if c < 0:
            return 0
        return min((c + 1) * self.block, self.samples)

    def consumed_after(self, delivered: int) -> int:
        """Global prefix consumed once every rank has delivered ``delivered`` of its samples."""
        return self.start + delivered * self.world_size
