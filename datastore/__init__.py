"""Datasets as versions: source readers, the shard format, ingest, checkout, the Repo facade
and the ``dataset`` CLI. Start with :class:`Repo`.

Names are imported on first use (PEP 562), so ``import datastore.cli`` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datastore.repo import DEFAULT_BRANCH, Repo, VersionInfo
    from datastore.source import RepoShardSource, open_shard_source

__all__ = ["DEFAULT_BRANCH", "Repo", "RepoShardSource", "VersionInfo", "open_shard_source"]

_HOME = {
    "DEFAULT_BRANCH": "datastore.repo",
    "Repo": "datastore.repo",
    "VersionInfo": "datastore.repo",
    "RepoShardSource": "datastore.source",
    "open_shard_source": "datastore.source",
}


def __getattr__(name: str) -> Any:
    try:
        module = _HOME[name]
    except KeyError:
        raise AttributeError(f"module 'datastore' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
