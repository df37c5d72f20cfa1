"""Streaming loaders: a version of a dataset as a prefetching, resumable torch IterableDataset.

``StreamingDataset`` reads shards through a :class:`ShardSource` (a repository through
the tiered cache, or plain Arrow files) in an order fixed by (version, seed, epoch),
split over ranks and DataLoader workers at the sample level; ``StreamingDataLoader``
counts what reached training so ``state_dict()`` resumes exactly, under any world size;
``DevicePrefetcher`` / ``to_device`` move batches to the GPU one batch ahead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachetier.exports import lazy_exports

if TYPE_CHECKING:
    from loaders.dataloader import StreamingDataLoader
    from loaders.dataset import StreamingDataset
    from loaders.device import DevicePrefetcher, to_device
    from loaders.filesource import ArrowFileSource
    from loaders.partition import Partition
    from loaders.plan import EpochPlan, make_plan
    from loaders.source import ShardSource, open_source
    from loaders.state import LoaderState, WorkerProgress
    from loaders.world import World

__all__ = [
    "ArrowFileSource",
    "DevicePrefetcher",
    "EpochPlan",
    "LoaderState",
    "Partition",
    "ShardSource",
    "StreamingDataLoader",
    "StreamingDataset",
    "WorkerProgress",
    "World",
    "make_plan",
    "open_source",
    "to_device",
]

#: Where each name lives, imported on first use (PEP 562): the repository layer imports
#: :mod:`loaders.ipcview` without loading torch and the whole loader.
_HOME = {
    "ArrowFileSource": "loaders.filesource",
    "DevicePrefetcher": "loaders.device",
    "EpochPlan": "loaders.plan",
    "LoaderState": "loaders.state",
    "Partition": "loaders.partition",
    "ShardSource": "loaders.source",
    "StreamingDataLoader": "loaders.dataloader",
    "StreamingDataset": "loaders.dataset",
    "WorkerProgress": "loaders.state",
    "World": "loaders.world",
    "make_plan": "loaders.plan",
    "open_source": "loaders.source",
    "to_device": "loaders.device",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
