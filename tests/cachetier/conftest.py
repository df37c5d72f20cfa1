"""Fixtures for the cache-tier tests: a repository's object store, cache folders, configs.

RAM tiers live in a fresh folder under ``/dev/shm`` (real tmpfs, as in production), or
under the test's temp folder where there is no ``/dev/shm``; it is removed afterwards.
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cachetier.config import CacheConfig
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore


@pytest.fixture
def objects(tmp_path: Path) -> ObjectStore:
    """An empty object store in a local folder (the source of truth)."""
    return ObjectStore(LocalStore(tmp_path / "repo"))


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on tmpfs for a RAM tier."""
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else tmp_path
    path = base / f"tierdata-test-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_config(tmp_path: Path, shm_dir: Path) -> Callable[..., CacheConfig]:
    """Build a CacheConfig in this test's folders; keyword arguments override the fields."""

    def make(**changes: Any) -> CacheConfig:
        fields: dict[str, Any] = {
            "dir": tmp_path / "cache",
            "ram_dir": shm_dir,
            "ram_bytes": 1 << 20,
            "ssd_bytes": 2 << 20,
            "retry_backoff": 0.01,
            "fetch_retries": 2,
            "prefetch_depth": 0,
        }
        fields.update(changes)
        return CacheConfig(**fields)

    return make


@pytest.fixture
def put_blobs(objects: ObjectStore) -> Callable[..., list[str]]:
    """``put_blobs(sizes, seed=0)`` stores one pseudo-random blob per size; returns their ids."""

    def put(sizes: list[int], seed: int = 0) -> list[str]:
        rng = random.Random(seed)
        return [objects.put(rng.randbytes(n)) for n in sizes]

    return put
