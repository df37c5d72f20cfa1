"""The resume state: where an epoch stands, as a small JSON-able dict.

::

    {"format": 2, "version": "<id>", "seed": 0, "epoch": 3, "consumed": 81920,
     "records": 100000, "shuffle": true, "window": 4, "group": 33554432,
     "block": 4194304, "levels": [[8, 12500, 10240]]}

``consumed`` counts global samples (all ranks together); ``levels`` says which (see
:class:`loaders.partition.Remaining`: here each of 8 ranks consumed the first 10,240
of its 12,500). Without ``levels`` the first ``consumed`` positions of the epoch's order
are done (one rank, and states written before ranks read sections). Either way a state
resumes under any world size, worker count or batch size. A state with ``levels`` has
``"format": 2``, so a version of tierdata that predates them refuses it instead of
reading ``consumed`` as a prefix; one without is ``"format": 1``, as before. ``records``, ``shuffle``,
``window``, ``group`` (the
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
from loaders.partition import MAX_LEVELS, Level, Remaining

__all__ = ["STATE_FORMAT", "LoaderState", "WorkerProgress"]

#: The format of a state with ``levels``; one without is format 1 (readable by older versions).
STATE_FORMAT = 2
_FORMATS = (1, STATE_FORMAT)
_SUBJECT = "loader state"


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """What one worker of a pool delivered: its first ``chunks`` chunks of a partition of
    the positions that remained when the pool started (``levels``, see :class:`Remaining`)."""

    levels: tuple[Level, ...]
    world_size: int
    rank: int
    block: int
    num_workers: int
    worker: int
    chunks: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (short keys keep the state small)."""
        return {
            "levels": [list(level) for level in self.levels],
            "world": self.world_size,
            "rank": self.rank,
            "block": self.block,
            "workers": self.num_workers,
            "worker": self.worker,
            "chunks": self.chunks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], records: int) -> WorkerProgress:
        """Parse :meth:`to_dict` output (or an older one with ``start``, a prefix of an
        epoch of ``records``); a bad value is quoted in the error."""
        if not isinstance(d, Mapping):
            raise BadInputError(f"bad worker {d!r}", subject=_SUBJECT)
        if "levels" in d:
            levels = _levels(d["levels"], "worker.levels")
        else:
            levels = Remaining.prefix(records, _int(d, "start", "worker.start")).levels
        keys = ("world", "rank", "block", "workers", "worker", "chunks")
        return cls(levels, *(_int(d, k, f"worker.{k}") for k in keys))


@dataclass(frozen=True, slots=True)
class LoaderState:
    """The position in an epoch: what ``remaining`` of ``epoch`` is left to deliver."""

    version: str
    seed: int
    epoch: int
    remaining: Remaining
    shuffle: bool
    window: int
    worker: WorkerProgress | None = None
    group: int = 0
    block: int = 0

    @property
    def consumed(self) -> int:
        """Samples of the epoch delivered (all ranks together)."""
        return self.remaining.consumed

    @property
    def records(self) -> int:
        """Records in the epoch."""
        return self.remaining.total

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict (well under 1 KB)."""
        d: dict[str, Any] = {
            "format": 1,
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
        if self.remaining != Remaining.prefix(self.records, self.consumed):
            d["format"] = STATE_FORMAT
            d["levels"] = self.remaining.to_list()
        if self.worker is not None:
            d["worker"] = self.worker.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LoaderState:
        """Parse a state dict; missing keys and bad values raise BadInputError quoting them."""
        if not isinstance(d, Mapping):
            raise BadInputError(f"expected a dict, got {type(d).__name__}", subject=_SUBJECT)
        fmt = d.get("format")
        if fmt not in _FORMATS:
            raise BadInputError(
                f"unknown format {fmt!r} (expected {' or '.join(map(str, _FORMATS))})", subject=_SUBJECT
            )
        version = d.get("version")
        if not isinstance(version, str) or not version:
            raise BadInputError(f"bad version {version!r}", subject=_SUBJECT)
        shuffle = d.get("shuffle")
        if not isinstance(shuffle, bool):
            raise BadInputError(f"bad shuffle {shuffle!r}", subject=_SUBJECT)
        records, consumed = _int(d, "records", "records"), _int(d, "consumed", "consumed")
        if "levels" in d:
            remaining = Remaining(records, _levels(d["levels"], "levels"))
            if remaining.consumed != consumed:
                raise BadInputError(
                    f"levels consume {remaining.consumed} samples, consumed says {consumed}", subject=_SUBJECT
                )
        else:
            remaining = Remaining.prefix(records, consumed)
        worker = None if d.get("worker") is None else WorkerProgress.from_dict(d["worker"], records)
        if worker is not None:
            Remaining(records, worker.levels)  # checks that they fit the epoch
        return cls(
            version=version,
            seed=_int(d, "seed", "seed", minimum=None),
            epoch=_int(d, "epoch", "epoch"),
            remaining=remaining,
            shuffle=shuffle,
            window=_int(d, "window", "window", minimum=1),
            worker=worker,
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


def _levels(value: Any, name: str) -> tuple[Level, ...]:
    ok = isinstance(value, list) and len(value) <= MAX_LEVELS
    ok = ok and all(
        isinstance(level, list)
        and len(level) == 3
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in level)
        for level in value
    )
    if not ok:
        raise BadInputError(
            f"bad {name} {value!r} (expected at most {MAX_LEVELS} lists of 3 non-negative integers)",
            subject=_SUBJECT,
        )
    return tuple((a, b, c) for a, b, c in value)
