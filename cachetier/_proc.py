"""Process helpers shared by the tiers that clean up after dead processes."""

from __future__ import annotations

import os

__all__ = ["process_alive"]


def process_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
