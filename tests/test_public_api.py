"""The public names of cachetier and datastore are frozen: a change here is an API change.

(versioning, dedup and loaders freeze theirs in their own test packages.)"""

from __future__ import annotations

import importlib

import pytest

import cachetier
import datastore

CACHETIER = {
    "BadInputError", "CacheConfig", "ConflictError", "IntegrityError", "LocalStore", "NotFoundError",
    "ObjectInfo", "ObjectStore", "PlacementPolicy", "Store", "StoreUnavailableError", "TierdataError",
    "TieredStore", "UsageError", "Versioned", "available_policies", "content_hash", "get_policy",
    "load_cache_config", "open_store", "parse_size", "register_policy", "serve",
}  # fmt: skip
DATASTORE = {"DEFAULT_BRANCH", "Repo", "RepoShardSource", "VersionInfo", "open_shard_source"}
REPO_METHODS = {
    "init", "open", "close", "head", "head_version", "resolve", "staged", "unstage", "ingest", "status",
    "commit", "commit_table", "show", "log", "diff", "shard_table", "tag", "branch", "branches", "tags",
    "checkout", "dedup", "dedup_staged", "verify", "gc", "staged_object_ids",
}  # fmt: skip


@pytest.mark.parametrize(("module", "names"), [(cachetier, CACHETIER), (datastore, DATASTORE)])
def test_exported_names_are_frozen_and_resolve(module, names) -> None:
    assert set(module.__all__) == names
    for name in names:
        assert getattr(module, name) is not None


def test_repo_public_methods_are_frozen() -> None:
    repo_class = importlib.import_module("datastore.repo").Repo
    public = {name for name in vars(repo_class) if not name.startswith("_")}
    assert public == REPO_METHODS


def test_errors_are_also_builtin_types() -> None:
    assert issubclass(cachetier.NotFoundError, FileNotFoundError)
    assert issubclass(cachetier.BadInputError, ValueError)
    assert issubclass(cachetier.StoreUnavailableError, OSError)
