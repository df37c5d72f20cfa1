"""Datasets as versions: source readers, the shard format, ingest, checkout, the Repo facade
and the ``dataset`` CLI. Start with :class:`Repo`."""

from datastore.repo import DEFAULT_BRANCH, Repo, VersionInfo
from datastore.source import RepoShardSource, open_shard_source

__all__ = ["DEFAULT_BRANCH", "Repo", "RepoShardSource", "VersionInfo", "open_shard_source"]
