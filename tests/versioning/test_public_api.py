"""Freeze the public API of versioning: a change here is a deliberate, reviewed change."""

from __future__ import annotations

import inspect

import versioning

EXPECTED = {
    "FORMAT_VERSION",
    "CommitMode",
    "Reachable",
    "RefStore",
    "ShardEntry",
    "ShardTable",
    "UnreachableItem",
    "VersionDiff",
    "VersionRecord",
    "canonical_json",
    "commit",
    "diff",
    "format_timestamp",
    "load_shard_table",
    "load_version",
    "log",
    "make_operation",
    "normalize",
    "parse_json",
    "parse_timestamp",
    "reachable",
    "reachable_objects",
    "save_shard_table",
    "save_version",
    "unreachable",
    "utc_now",
    "validate_ref_name",
    "version_key",
}


def test_exported_names():
    assert set(versioning.__all__) == EXPECTED
    for name in versioning.__all__:
        assert hasattr(versioning, name), name


def test_public_callables_are_documented():
    for name in versioning.__all__:
        obj = getattr(versioning, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_commit_signature():
    params = inspect.signature(versioning.commit).parameters
    assert list(params)[:3] == ["store", "objects", "branch"]
    keyword_only = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {
        "shards",
        "schema",
        "mode",
        "expected_parent",
        "message",
        "author",
        "operation",
        "created",
    } <= keyword_only
