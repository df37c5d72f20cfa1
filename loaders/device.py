"""Moving batches to the GPU: pinned memory, non-blocking copies, one batch ahead.

:func:`to_device` moves every tensor of a (nested) batch. :class:`DevicePrefetcher`
wraps a loader: while training works on batch ``k`` on the current CUDA stream, batch
``k + 1`` is pinned (unless the DataLoader pinned it already) and copied on a side
stream; the current stream waits for that copy only when the batch is handed out, and
each tensor is marked as used by the current stream so its memory is not reused early.

On a machine without CUDA, or for a CPU device, both are no-ops: batches pass through
unchanged and nothing is read ahead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["DevicePrefetcher", "to_device"]


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

    ``state_dict()`` / ``load_state_dict()`` pass through to the loader, leaving out the
    batch held ahead (it was not delivered to training yet).
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str | None = None) -> None:
        self.loader = loader
        self.device = _resolve(device)
        self.active = self.device.type == "cuda" and torch.cuda.is_available()
        self._held = 0

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if not self.active:
            yield from self.loader
            return
        stream = torch.cuda.Stream(device=self.device)
        batches = iter(self.loader)

        def start_copy(batch: Any) -> Any:
            with torch.cuda.stream(stream):
                return _map_tensors(batch, self._copy)

        try:
            nxt = next(batches, _END)
            pending = _END if nxt is _END else start_copy(nxt)
            self._held = 0 if pending is _END else 1
            while pending is not _END:
                current = torch.cuda.current_stream(self.device)
                current.wait_stream(stream)
                _map_tensors(pending, functools.partial(_record, stream=current))
                ready = pending
                nxt = next(batches, _END)
                pending = _END if nxt is _END else start_copy(nxt)
                self._held = 0 if pending is _END else 1
                yield ready
        finally:
            self._held = 0

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu":
            return t.to(self.device, non_blocking=True)
        if not t.is_pinned():
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state, without the batch read ahead."""
        holding_back = getattr(self.loader, "_state_dict_holding_back", None)
        if holding_back is not None:
            return holding_back(self._held)
        return self.loader.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Pass ``state`` to the loader."""
        self.loader.load_state_dict(state)  # type: ignore[attr-defined]


def _record(t: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    if t.is_cuda:
        t.record_stream(stream)
    return t


_END = object()
