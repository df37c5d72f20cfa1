"""Worker 0 first: the other workers of a DataLoader pool start reading once it has a batch.

A DataLoader takes batch 0 from worker 0, batch 1 from worker 1, and so on. If every
worker starts reading shards at once, they share the cores and the first batch waits
for all of them; after a resume, where each worker first needs a whole shuffle window
decoded, that nearly doubles the wait. So the other workers announce their shards (a
cache starts fetching them) but hold back their reads until worker 0 has handed over
its first batch, or ``_LEAD_WAIT_S`` at most (a slow or failed worker 0 costs them that
much, never a hang), then read and decode as usual.

The loader and its workers share two counters (:class:`StreamingDataLoader` makes them
before the workers exist): the iteration the loader started, and the last iteration
whose first batch worker 0 has built.
"""

from __future__ import annotations

import time
from typing import Any

from loaders.world import World

__all__ = ["Lead"]

_LEAD_WAIT_S = 0.5


class Lead:
    """One worker's part in "worker 0 first" for the iteration that ``turns[0]`` names."""

    def __init__(self, turns: Any, worker: int) -> None:
        self._turns = turns
        self._turn = int(turns[0])
        self._worker = worker

    @classmethod
    def of(cls, turns: Any, world: World) -> Lead | None:
        """The lead for ``world``'s worker, or None outside a pool of several workers."""
        if turns is None or world.num_workers < 2:
            return None
        return cls(turns, world.worker)

    def wait(self) -> None:
        """Block until worker 0 has its first batch (workers other than 0; a short time at most)."""
        if self._worker == 0:
            return
        deadline = time.monotonic() + _LEAD_WAIT_S
        while self._turns[1] < self._turn and time.monotonic() < deadline:
            time.sleep(0.002)

    def done(self) -> None:
        """Worker 0 has its first batch: let the others go."""
        if self._worker == 0 and self._turns[1] < self._turn:
            self._turns[1] = self._turn
