"""Replayable read traces for the cache simulator.

A trace is a list of reads ``(job, key)`` plus, for each job, the plans it would
announce (one per epoch, in the order it reads them). Traces are pure functions of their
parameters and seed; :func:`save` / :func:`load` write them to a ``.json`` file so a run
can be replayed exactly, or a trace recorded elsewhere can be fed in.

- :func:`epoch_trace`: one job reads every shard once per epoch, in a new random order
  each epoch (the case where LRU thrashes).
- :func:`zipf_jobs_trace`: several jobs each train on their own dataset, a sample
  (without replacement) of the node's shards weighted by Zipf popularity, so popular
  shards are shared by several jobs; each job reads its dataset once per epoch in a new
  order, and the jobs interleave round robin (one read each in turn).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Trace", "epoch_trace", "load", "save", "zipf_jobs_trace"]


@dataclass
class Trace:
    """Reads in order and the plans each job announces (plans[job][epoch] = keys)."""

    name: str
    params: dict
    reads: list[tuple[int, int]]
    plans: list[list[list[int]]]
    epoch_of_read: list[int] = field(default_factory=list)

    @property
    def jobs(self) -> int:
        return len(self.plans)


def epoch_trace(*, shards: int = 1000, epochs: int = 10, seed: int = 0) -> Trace:
    """One job, ``epochs`` shuffled passes over ``shards`` shards."""
    rng = np.random.default_rng(seed)
    plans = [[rng.permutation(shards).tolist() for _ in range(epochs)]]
    reads = [(0, k) for plan in plans[0] for k in plan]
    epoch_of_read = [e for e in range(epochs) for _ in range(shards)]
    params = {"shards": shards, "epochs": epochs, "seed": seed}
    return Trace("epoch", params, reads, plans, epoch_of_read)


def zipf_jobs_trace(
    *,
    shards: int = 1000,
    jobs: int = 4,
    per_job: int = 350,
    epochs: int = 5,
    alpha: float = 1.0,
    seed: int = 0,
) -> Trace:
    """``jobs`` jobs, each on ``per_job`` Zipf(``alpha``)-sampled shards, ``epochs`` epochs each."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, shards + 1) ** alpha
    weights /= weights.sum()
    names = rng.permutation(shards)  # popularity rank -> shard id
    datasets = [names[rng.choice(shards, size=per_job, replace=False, p=weights)] for _ in range(jobs)]
    plans = [[rng.permutation(d).tolist() for _ in range(epochs)] for d in datasets]
    reads, epoch_of_read = [], []
    for e in range(epochs):
        for i in range(per_job):
            for j in range(jobs):
                reads.append((j, plans[j][e][i]))
                epoch_of_read.append(e)
    params = {
        "shards": shards,
        "jobs": jobs,
        "per_job": per_job,
        "epochs": epochs,
        "alpha": alpha,
        "seed": seed,
    }
    return Trace("zipf-jobs", params, reads, plans, epoch_of_read)


def save(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as JSON."""
    Path(path).write_text(json.dumps(asdict(trace)))


def load(path: str | Path) -> Trace:
    """Read a trace written by :func:`save`."""
    data = json.loads(Path(path).read_text())
    data["reads"] = [tuple(r) for r in data["reads"]]
    return Trace(**data)
