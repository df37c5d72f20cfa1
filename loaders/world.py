"""Who is reading: the rank among training processes and the worker among DataLoader workers.

:class:`World` is a small value object; every partition decision takes one, so the
partition is a pure function that tests can drive with any world. Ranks come from
``torch.distributed`` when it is initialized, else from the ``RANK`` / ``WORLD_SIZE``
environment variables (torchrun, Lightning and SLURM launchers set them); the worker
comes from ``torch.utils.data.get_worker_info()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cachetier.errors import BadInputError

__all__ = ["World"]


@dataclass(frozen=True, slots=True)
class World:
    """Rank ``rank`` of ``world_size`` training processes, worker ``worker`` of ``num_workers``.

    ``num_workers`` is 1 when the dataset is iterated in the training process itself
    (DataLoader ``num_workers=0``).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise BadInputError(
                f"rank {self.rank} is not in a world of size {self.world_size}",
                subject=f"RANK={self.rank} WORLD_SIZE={self.world_size}",
                hint="need 0 <= RANK < WORLD_SIZE",
            )
        if self.num_workers < 1 or not 0 <= self.worker < self.num_workers:
            raise BadInputError(
                f"worker {self.worker} is not in a pool of {self.num_workers} workers",
                subject=f"worker={self.worker} num_workers={self.num_workers}",
            )

    @classmethod
    def detect_ranks(cls, environ: Mapping[str, str] | None = None) -> World:
        """The ranks of this process (worker fields left at 0 of 1).

        ``torch.distributed`` wins when it is initialized; else ``RANK`` and ``WORLD_SIZE``
        from ``environ`` (default ``os.environ``); else a single rank.
        """
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), world_size=dist.get_world_size())
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env and "RANK" not in env:
            return cls()
        rank = _env_int(env, "RANK", 0)
        size = _env_int(env, "WORLD_SIZE", 1)
        return cls(rank=rank, world_size=size)

    def with_worker_info(self) -> World:
        """This world with the worker fields of the current DataLoader worker (if any)."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return replace(self, worker=0, num_workers=1)
        return replace(self, worker=info.id, num_workers=info.num_workers)

    @property
    def in_worker_pool(self) -> bool:
        """True when the reader is one of several DataLoader workers of its rank."""
        return self.num_workers > 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadInputError(f"{name}={raw!r} is not an integer", subject=name) from None
