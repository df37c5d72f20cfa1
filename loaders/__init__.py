"""Streaming loaders: a version of a dataset as a prefetching, resumable torch IterableDataset.

``StreamingDataset`` reads shards through a :class:`ShardSource` (a repository through
the tiered cache, or plain Arrow files) in an order fixed by (version, seed, epoch),
split over ranks and DataLoader workers at the sample level; ``StreamingDataLoader``
counts what reached training so ``state_dict()`` resumes exactly, under any world size;
``DevicePrefetcher`` / ``to_device`` move batches to the GPU one batch ahead.
"""

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
