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

from versioning.canonical import canonical_json, normalize, parse_json
from versioning.commit import CommitMode, commit
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
