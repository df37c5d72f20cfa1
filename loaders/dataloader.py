"""``StreamingDataLoader``: a DataLoader that counts what it delivered and owns the state.

Workers read ahead (``prefetch_factor`` batches each), so what the workers produced is
not what training saw. The loader counts batches when they reach the consumer, in the
training process, and derives the position from that count: batch ``k`` of a rank is
chunk ``k`` of its partition (see :mod:`loaders.partition`), so ``state_dict()`` is
exact at every batch boundary whatever ``num_workers`` and ``prefetch_factor`` are.

The loader also resolves where each iteration starts (epoch, what remains of it, ranks)
once, before its workers exist, and hands it to them; with ``persistent_workers`` it
passes it through a small shared-memory array (anonymous or already unlinked memory,
so a crash leaves nothing behind).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.multiprocessing
from torch.utils.data import DataLoader

from cachetier.errors import UsageError
from loaders.dataset import StreamingDataset, _Progress, _Spec
from loaders.partition import Partition
from loaders.world import World

__all__ = ["StreamingDataLoader"]


def _pass_through(batch: Any) -> Any:
    """The collate function of batch mode: the dataset's batches are delivered as they are."""
    return batch


class StreamingDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`StreamingDataset` with exact ``state_dict()`` resume.

    In batch mode (the dataset has ``batch_size``) leave ``batch_size`` unset here; in
    per-sample mode ``batch_size`` (default 1) and ``drop_last`` batch the samples. Other
    keyword arguments go to ``DataLoader`` (``num_workers``, ``pin_memory``,
    ``prefetch_factor``, ``persistent_workers``, ``timeout``, ``collate_fn``, ...).
    In batch mode the batches pass through unchanged (no ``default_convert``) unless a
    ``collate_fn`` is given. A new iteration continues where the last one stopped (and
    after a finished epoch starts the next one, unless ``dataset.set_epoch`` chose another).
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise UsageError(f"expected a StreamingDataset, got {type(dataset).__name__}", subject="dataset")
        for key in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(key):
                raise UsageError(
                    f"{key}= does not apply to a streaming dataset",
                    subject=key,
                    hint="set shuffle and seed on the StreamingDataset",
                )
        if dataset.batch_size is not None:
            if batch_size is not None or drop_last:
                raise UsageError(
                    f"the dataset already batches (batch_size={dataset.batch_size})",
                    subject="batch_size",
                    hint="leave batch_size and drop_last of the loader unset; set them on the dataset",
                )
            block, tail_drop, loader_batch = dataset.batch_size, dataset.drop_last, None
            # Batches are final already: skip default_convert, which walks every string of a batch.
            kwargs.setdefault("collate_fn", _pass_through)
        else:
            loader_batch = 1 if batch_size is None else int(batch_size)
            block, tail_drop = loader_batch, bool(drop_last)
        super().__init__(dataset, batch_size=loader_batch, drop_last=drop_last, **kwargs)
        self._block = block
        self._tail_drop = tail_drop
        self._progress: _Progress | None = None
        dataset._block = (block, tail_drop)
        if self.num_workers > 0:
            context = self.multiprocessing_context or torch.multiprocessing
            dataset._turns = context.RawArray("q", 2)  # see loaders.lead
            if self.persistent_workers:
                dataset._channel = context.RawArray("q", _Spec.INTS)

    @property
    def streaming_dataset(self) -> StreamingDataset:
        """The dataset, typed."""
        return self.dataset  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds = self.streaming_dataset
        spec = ds._begin(ds._detect_ranks(), self._block, self._tail_drop, by_loader=True)
        part = Partition(spec.remaining, spec.world_size, spec.rank, spec.block, spec.drop_last)
        progress = _Progress(spec, part, World(rank=spec.rank, world_size=spec.world_size), skipped=0)
        ds._progress = progress
        self._progress = progress
        if ds._channel is not None:
            ds._channel[:] = spec.to_ints()
        if ds._turns is not None:
            ds._turns[0] += 1
        ds._loader_spec = spec
        try:
            batches = super().__iter__()
        finally:
            ds._loader_spec = None
        return self._deliver(batches, progress)

    def _deliver(self, batches: Iterator[Any], progress: _Progress) -> Iterator[Any]:
        try:
            for batch in batches:
                progress.chunks += 1
                progress.samples = progress.part.samples_through(progress.chunks - 1)
                yield batch
        except GeneratorExit:
            raise  # the consumer stopped early: workers stop with the iterator (or persist)
        except (ConnectionError, EOFError) as e:
            # A worker died while handing over a batch (its end of the socket is gone).
            self._abandon(batches)
            raise RuntimeError(f"a DataLoader worker exited unexpectedly while sending a batch ({e})") from e
        except BaseException:
            self._abandon(batches)
            raise
        else:
            progress.complete = True
        finally:
            progress.open = False

    def _abandon(self, batches: Iterator[Any]) -> None:
        """Stop the workers now: an error's traceback would otherwise keep them (and torch's
        SIGCHLD handler) alive until the traceback is dropped."""
        self._iterator = None  # a persistent iterator is not reused after a failure
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # best effort while an error is already propagating
                pass

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the consumer (see loaders.state)."""
        return self.streaming_dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration (any num_workers, world size, batch size)."""
        self.streaming_dataset.load_state_dict(state)
        self._progress = None

    def _state_dict_holding_back(self, batches: int) -> dict[str, Any]:
        """The state as if the last ``batches`` delivered batches had not been delivered."""
        p = self._progress
        ds = self.streaming_dataset
        if p is None or ds._progress is not p or batches <= 0:
            return self.state_dict()
        held = dataclasses.replace(p)
        held.give_back(batches, batches=True)
        return ds._current_state(held).to_dict()

    def _give_back(self, batches: int) -> None:
        """Count the last ``batches`` delivered batches as not delivered, for good: a
        wrapper read them ahead and its loop ended before it handed them on (see
        loaders.device). The next iteration and ``state_dict()`` start from them."""
        p = self._progress
        if p is not None and self.streaming_dataset._progress is p:
            p.give_back(batches, batches=True)
