"""Datasets as versions: source readers, the shard format, ingest, checkout, the Repo facade
and the ``dataset`` CLI. Start with :class:`Repo`.

Names are imported on first use (PEP 562), so ``import datastore.cli`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachetier.exports import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
