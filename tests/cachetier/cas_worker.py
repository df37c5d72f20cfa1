"""A compare-and-swap counter, run by the conformance suite in threads and in processes.

``python -m tests.cachetier.cas_worker URL KEY COUNT`` opens the store at ``URL`` (S3
settings from the ``AWS_*`` environment), adds ``COUNT`` to the integer at ``KEY`` one
CAS at a time, and prints how many of its swaps lost a race and were retried. It prints
``ready`` once the store is open and starts when a line arrives on stdin, so that the
workers of a test really run at the same time.
"""

from __future__ import annotations

import sys

from cachetier.errors import ConflictError, NotFoundError
from cachetier.store import Store

__all__ = ["increment_by_cas"]


def increment_by_cas(store: Store, key: str, count: int) -> int:
    """Add ``count`` to the counter at ``key`` by read + CAS retry loops; return the conflicts."""
    done = conflicts = 0
    while done < count:
        try:
            current = store.read_versioned(key)
            value, token = int(current.data), current.token
        except NotFoundError:
            value, token = 0, None
        try:
            store.compare_and_swap(key, str(value + 1).encode(), token)
        except ConflictError:
            conflicts += 1
            continue
        done += 1
    return conflicts


def main(argv: list[str]) -> None:
    from cachetier.registry import open_store

    url, key, count = argv[0], argv[1], int(argv[2])
    with open_store(url) as store:
        store.exists(key)  # connect before the start signal
        print("ready", flush=True)
        sys.stdin.readline()
        print(increment_by_cas(store, key, count))


if __name__ == "__main__":
    main(sys.argv[1:])
