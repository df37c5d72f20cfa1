"""Moving batches to the GPU: pinned memory, non-blocking copies, one batch ahead.

:func:`to_device` moves every tensor of a (nested) batch. :class:`DevicePrefetcher`
wraps a loader: while training works on batch ``k`` on the current CUDA stream, batch
``k + 1`` is pinned (unless the DataLoader pinned it already, or it is smaller than
:data:`PIN_MIN_BYTES`) and copied on a side stream; the current stream waits for that
copy only when the batch is handed out, and each tensor is marked as used by the current
stream so its memory is not reused early.

On a machine without CUDA, or for a CPU device, nothing is copied: ``to_device`` returns
the batch, ``DevicePrefetcher`` hands out the loader's batches unchanged (reading one
ahead, through the same loop, so what it counts as delivered does not depend on the
device).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["PIN_MIN_BYTES", "DevicePrefetcher", "to_device"]

#: Host tensors at least this big are pinned before their copy. A smaller one is copied
#: from pageable memory: the copy takes microseconds either way, and pinning it would cost
#: the consumer thread more (an allocation and its bookkeeping) than it could save.
PIN_MIN_BYTES = 1 << 20


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map_tensors(v, fn) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    return batch


def _resolve(device: torch.device | str | None) -> torch.device:
    if device is None:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
    return torch.device(device)


def to_device(batch: Any, device: torch.device | str | None = None, *, non_blocking: bool = True) -> Any:
    """``batch`` with every tensor on ``device`` (default: the current CUDA device, else CPU).

    Strings, numbers and other values are returned as they are. For a CPU device the
    batch itself is returned.
    """
    target = _resolve(device)
    if target.type == "cpu":
        return batch
    return _map_tensors(batch, lambda t: t.to(target, non_blocking=non_blocking))


class DevicePrefetcher:
    """Iterate ``loader`` with batches already on ``device``, copied one batch ahead.

    A batch counts as delivered once it is handed out: ``state_dict()`` leaves out the
    batch held ahead, and when the loop stops early (``break``, an error) the loader takes
    that batch back, so ``state_dict()`` and the next iteration go on from the first
    batch not handed out. A :class:`~loaders.StreamingDataLoader` or
    :class:`~loaders.StreamingDataset` does this itself (also one that a plain
    ``DataLoader`` with no workers passes through in batch mode); any other loader with
    ``state_dict()`` / ``load_state_dict()`` (torchdata's ``StatefulDataLoader``, say) has
    its state saved before each batch is read ahead, and restored when the loop stops
    early. Without CUDA (or for a CPU device) the same loop runs with no copy: batches
    pass through unchanged, one read ahead.
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str | None = None) -> None:
        self.loader = loader
        self.device = _resolve(device)
        self.active = self.device.type == "cuda" and torch.cuda.is_available()
        self._held = 0  # batches taken from the loader and not handed out yet
        self._holder = _holder(loader)
        # A loader that cannot leave out batches by itself: its state just before the
        # batch held ahead was read (and, once a loop stopped early, the state it was
        # rewound to), which is what ``state_dict()`` reports while a batch is held.
        self._saves_states = self._holder is None and callable(getattr(loader, "state_dict", None))
        self._before_held: dict[str, Any] | None = None
        self._rewound = False

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        transfer = _CudaTransfer(self.device) if self.active else _NoTransfer()
        batches = iter(self.loader)
        self._held = 0
        self._rewound = False
        try:
            pending = self._take(batches, transfer)
            while pending is not _END:
                ready = transfer.finish(pending)
                pending = self._take(batches, transfer)
                self._held -= 1  # ``ready`` is handed out: delivered
                yield ready
        finally:
            _close(batches)  # the loader's iteration is over before it takes a batch back
            if self._held:
                if self._holder is not None:
                    self._holder._give_back(self._held)
                elif self._before_held is not None:
                    self.loader.load_state_dict(self._before_held)  # type: ignore[attr-defined]
                    self._rewound = True
            self._held = 0

    def _take(self, batches: Iterator[Any], transfer: _Transfer) -> Any:
        """The next batch of the loader, its copy started (``_END`` after the last)."""
        if self._saves_states:
            self._before_held = self.loader.state_dict()  # type: ignore[attr-defined]
        batch = next(batches, _END)
        if batch is _END:
            return _END
        self._held += 1
        return transfer.start(batch)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state, without the batch read ahead."""
        if self._holder is not None:
            return self._holder._state_dict_holding_back(self._held)  # type: ignore[no-any-return]
        if self._before_held is not None and (self._held or self._rewound):
            return self._before_held
        return self.loader.state_dict()  # type: ignore[attr-defined,no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Pass ``state`` to the loader (or to the dataset a plain ``DataLoader`` passes through)."""
        target = self.loader if hasattr(self.loader, "load_state_dict") else self._holder
        target.load_state_dict(state)  # type: ignore[union-attr]
        self._before_held, self._rewound = None, False


def _holder(loader: Any) -> Any:
    """What takes back the batches read ahead: the loader itself (a StreamingDataLoader or
    StreamingDataset), or the StreamingDataset that a plain ``DataLoader`` passes through
    in this process (no workers, no batching of its own); None for any other loader."""
    if hasattr(loader, "_give_back"):
        return loader
    if callable(getattr(loader, "state_dict", None)):
        return None  # a stateful loader keeps its own state (torchdata's, say)
    dataset = getattr(loader, "dataset", None)
    passes_through = getattr(loader, "num_workers", None) == 0 and getattr(loader, "batch_size", 0) is None
    return dataset if passes_through and hasattr(dataset, "_give_back") else None


class _Transfer:
    """How a batch reaches the device: ``start`` the copy, ``finish`` it before handing out."""

    def start(self, batch: Any) -> Any:
        return batch

    def finish(self, pending: Any) -> Any:
        return pending


class _NoTransfer(_Transfer):
    """No device to copy to: batches pass through unchanged."""


class _CudaTransfer(_Transfer):
    """Copies from pinned memory on a side stream; the current stream waits at hand-out."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def start(self, batch: Any) -> Any:
        with torch.cuda.stream(self.stream):
            return _map_tensors(batch, self._copy)

    def finish(self, pending: Any) -> Any:
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        return _map_tensors(pending, functools.partial(_record, stream=current))

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and t.numel() * t.element_size() >= PIN_MIN_BYTES:
            t = t.pin_memory()  # returns ``t`` itself when the DataLoader pinned it already
        return t.to(self.device, non_blocking=True)


def _close(iterator: Iterator[Any]) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


def _record(t: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    if t.is_cuda:
        t.record_stream(stream)
    return t


_END = object()
