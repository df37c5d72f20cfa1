"""The resume state: where an epoch stands, as a small JSON-able dict.

::

    {"format": 1, "version": "<id>", "seed": 0, "epoch": 3, "consumed": 81920,
     "records": 100000, "shuffle": true, "window": 4, "group": 33554432,
     "block": 4194304}

``consumed`` counts global samples (all ranks together) and is always a prefix of the
epoch's order (see :mod:`loaders.partition`), so a state resumes under any world size,
worker count or batch size. ``records``, ``shuffle``, ``window``, ``group`` (the
plan's ``min_group``: the decoded bytes that group small shards) and ``block`` (the
plan's shuffle block; a state without it predates blocks: 0) pin down the plan;
a state whose version, seed or plan differs from the dataset's is refused.

A state taken inside one DataLoader worker (torchdata's ``StatefulDataLoader`` asks
each worker) also carries ``"worker": {...}``, that worker's own progress, so each
worker of the same pool restarts exactly where it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cachetier.errors import BadInputError, UsageError

__all__ = ["STATE_FORMAT", "LoaderState", "WorkerProgress"]

STATE_FORMAT = 1
_SUBJECT = "loader state"


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """What one worker of a pool delivered: its first ``chunks`` chunks of a partition."""

    start: int
    world_size: int
    rank: int
    block: int
    num_workers: int
    worker: int
    chunks: int

    def to_dict(self) -> dict[str, int]:
        """The JSON form (short keys keep the state small)."""
        return {
            "start": self.start,
            "world": self.world_size,
            "rank": self.rank,
            "block": self.block,
            "workers": self.num_workers,
            "worker": self.worker,
            "chunks": self.chunks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerProgress:
        """Parse :meth:`to_dict` output; a bad value is quoted in the error."""
        keys = ("start", "world", "rank", "block", "workers", "worker", "chunks")
        vals = [_int(d, k, f"worker.{k}") for k in keys]
        return cls(*vals)


@dataclass(frozen=True, slots=True)
class LoaderState:
    """The position in an epoch: ``consumed`` global samples of ``epoch`` are done."""

    version: str
    seed: int
    epoch: int
    consumed: int
    records: int
    shuffle: bool
    window: int
    worker: WorkerProgress | None = None
    group: int = 0
    block: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict (well under 1 KB)."""
        d: dict[str, Any] = {
            "format": STATE_FORMAT,
            "version": self.version,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "records": self.records,
            "shuffle": self.shuffle,
            "window": self.window,
            "group": self.group,
            "block": self.block,
        }
        if self.worker is not None:
            d["worker"] = self.worker.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoaderState:
        """Parse a state dict; missing keys and bad values raise BadInputError quoting them."""
        if not isinstance(d, Mapping):
            raise BadInputError(f"expected a dict, got {type(d).__name__}", subject=_SUBJECT)
        fmt = d.get("format")
        if fmt != STATE_FORMAT:
            raise BadInputError(f"unknown format {fmt!r} (expected {STATE_FORMAT})", subject=_SUBJECT)
        version = d.get("version")
        if not isinstance(version, str) or not version:
            raise BadInputError(f"bad version {version!r}", subject=_SUBJECT)
        shuffle = d.get("shuffle")
        if not isinstance(shuffle, bool):
            raise BadInputError(f"bad shuffle {shuffle!r}", subject=_SUBJECT)
        worker = d.get("worker")
        return cls(
            version=version,
            seed=_int(d, "seed", "seed", minimum=None),
            epoch=_int(d, "epoch", "epoch"),
            consumed=_int(d, "consumed", "consumed"),
            records=_int(d, "records", "records"),
            shuffle=shuffle,
            window=_int(d, "window", "window", minimum=1),
            worker=None if worker is None else WorkerProgress.from_dict(worker),
            group=_int(d, "group", "group") if "group" in d else 0,
            block=_int(d, "block", "block") if "block" in d else 0,
        )

    def check_compatible(
        self,
        *,
        version: str,
        seed: int,
        records: int,
        shuffle: bool,
        window: int,
        group: int = 0,
        block: int = 0,
    ) -> None:
        """Refuse (UsageError) a state whose epoch order differs from the dataset's."""
        if self.version != version:
            raise UsageError(
                f"the state belongs to version {self.version[:12]}, the dataset reads version {version[:12]}",
                subject=_SUBJECT,
                hint="open the dataset at the version the checkpoint was trained on, or start fresh",
            )
        if self.seed != seed:
            raise UsageError(
                f"the state was made with seed {self.seed}, the dataset has seed {seed}",
                subject=_SUBJECT,
                hint=f"construct the dataset with seed={self.seed}",
            )
        mine, theirs = (self.shuffle, self.window, self.group, self.block), (shuffle, window, group, block)
        if mine != theirs and (self.shuffle or shuffle):
            raise UsageError(
                f"the state was made with shuffle={self.shuffle} shuffle_window={self.window} "
                f"shuffle_group={self.group} shuffle_block={self.block}, the dataset has "
                f"shuffle={shuffle} shuffle_window={window} shuffle_group={group} shuffle_block={block}",
                subject=_SUBJECT,
                hint="construct the dataset with the same shuffle settings",
            )
        if self.records != records:
            raise UsageError(
                f"the state counts {self.records} records, the version has {records}",
                subject=_SUBJECT,
            )


def _int(d: Mapping[str, Any], key: str, name: str, minimum: int | None = 0) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInputError(f"bad {name} {value!r} (expected an integer)", subject=_SUBJECT)
    if minimum is not None and value < minimum:
        raise BadInputError(f"bad {name} {value!r} (expected >= {minimum})", subject=_SUBJECT)
    return value
