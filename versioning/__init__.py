"""Versions of datasets: records, shard tables, refs, history, commit and gc reachability.

Works on a :class:`cachetier.store.Store` (the repository root) and a
:class:`cachetier.objects.ObjectStore` over it. Knows nothing of torch or of the
record layout inside shards.

Layout in the store::

    objects/<h[:2]>/<h>     shard tables (Parquet), shards and chunks (written by datastore)
    packs/<id>.pack|.idx    small objects stored together (see cachetier.packs)
    versions/<id>           canonical JSON of a VersionRecord; id = content hash of it
    refs/heads/<branch>     a version id, moved only by compare-and-swap
    refs/tags/<tag>         a version id, never moved
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachetier.exports import lazy_exports

if TYPE_CHECKING:
    from versioning.canonical import canonical_json, normalize, parse_json
    from versioning.committing import CommitMode, commit
    from versioning.history import VersionDiff, diff, load_version, log, save_version, version_key
    from versioning.reachability import Reachable, UnreachableItem, reachable, reachable_objects, unreachable
    from versioning.records import (
        FORMAT_VERSION,
        VersionRecord,
        format_timestamp,
        make_operation,
        parse_timestamp,
        utc_now,
    )
    from versioning.refs import RefStore, validate_ref_name
    from versioning.shardtable import ShardEntry, ShardTable, load_shard_table, save_shard_table


__all__ = [
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
]

#: Where each name lives: imported on first use (PEP 562), so reading refs and version
#: records never loads pyarrow (shard tables, commit and gc need it; a training process
#: streaming a warm version does not).
_HOME = {
    "CommitMode": "versioning.committing",
    "FORMAT_VERSION": "versioning.records",
    "Reachable": "versioning.reachability",
    "RefStore": "versioning.refs",
    "ShardEntry": "versioning.shardtable",
    "ShardTable": "versioning.shardtable",
    "UnreachableItem": "versioning.reachability",
    "VersionDiff": "versioning.history",
    "VersionRecord": "versioning.records",
    "canonical_json": "versioning.canonical",
    "commit": "versioning.committing",
    "diff": "versioning.history",
    "format_timestamp": "versioning.records",
    "load_shard_table": "versioning.shardtable",
    "load_version": "versioning.history",
    "log": "versioning.history",
    "make_operation": "versioning.records",
    "normalize": "versioning.canonical",
    "parse_json": "versioning.canonical",
    "parse_timestamp": "versioning.records",
    "reachable": "versioning.reachability",
    "reachable_objects": "versioning.reachability",
    "save_shard_table": "versioning.shardtable",
    "save_version": "versioning.history",
    "unreachable": "versioning.reachability",
    "utc_now": "versioning.records",
    "validate_ref_name": "versioning.refs",
    "version_key": "versioning.history",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
