"""Which cache tiers are usable now: faults make a tier skipped, then retried later.

A tier whose folder cannot be opened (permission, missing mount) is *down*: reads skip
it. A tier that fails a write (full disk, read-only file system) is *read-only*: reads
still use it, nothing is offered to it. Either state is retried after
``retry_after`` seconds, so a fixed fault heals without a restart, and a fault never
breaks a read: the next tier (ultimately the object store) serves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lmdb

from cachetier.errors import StoreUnavailableError

__all__ = ["TIER_ERRORS", "TierHealth"]

#: The errors a cache tier may raise that mean "skip this tier", never "fail the read".
TIER_ERRORS = (StoreUnavailableError, OSError, lmdb.Error)
RETRY_TIER_AFTER = 30.0


class TierHealth:
    """Track down and read-only tiers for one process.

    ``openers`` maps each configured tier name to a function that opens it (raising one
    of :data:`TIER_ERRORS` when it cannot); ``on_error(tier)`` is called for every fault
    recorded, to count it.
    """

    def __init__(
        self,
        openers: dict[str, Callable[[], Any]],
        on_error: Callable[[str], None],
        *,
        retry_after: float = RETRY_TIER_AFTER,
    ):
        self._openers = openers
        self._on_error = on_error
        self._retry_after = retry_after
        self._down: dict[str, tuple[str, float]] = {}
        self._read_only: dict[str, tuple[str, float]] = {}

    def usable(self, tier: str) -> bool:
        """True when ``tier`` is configured, not marked down, and opens."""
        opener = self._openers.get(tier)
        if opener is None:
            return False
        down = self._down.get(tier)
        if down is not None:
            if time.monotonic() - down[1] < self._retry_after:
                return False
            del self._down[tier]
        try:
            opener()
        except TIER_ERRORS as e:
            self.mark_down(tier, e)
            return False
        read_only = self._read_only.get(tier)
        if read_only is not None and time.monotonic() - read_only[1] >= self._retry_after:
            del self._read_only[tier]
        return True

    def writable(self, tier: str) -> bool:
        """True unless a write to ``tier`` failed within the retry period."""
        return tier not in self._read_only

    def mark_down(self, tier: str, error: BaseException) -> None:
        """Skip ``tier`` for reads and writes until the retry period passes."""
        self._down[tier] = (str(error), time.monotonic())
        self._on_error(tier)

    def mark_read_only(self, tier: str, error: BaseException) -> None:
        """Offer nothing to ``tier`` until the retry period passes; reads still use it."""
        self._read_only[tier] = (str(error), time.monotonic())
        self._on_error(tier)

    def guarded(self, tier: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; a tier fault marks ``tier`` read-only and returns None."""
        try:
            return fn(*args)
        except TIER_ERRORS as e:
            self.mark_read_only(tier, e)
            return None

    def reset(self) -> None:
        """Forget every fault: the next use tries each tier again."""
        self._down.clear()
        self._read_only.clear()

    def degraded(self) -> dict[str, str]:
        """Tiers currently skipped (or read-only), with the reason."""
        out = {name: f"unusable: {why}" for name, (why, _) in self._down.items()}
        out.update(
            {name: f"not writable: {why}" for name, (why, _) in self._read_only.items() if name not in out}
        )
        return out
