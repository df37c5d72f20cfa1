"""Builders shared by the versioning tests: real shard objects, versions and schemas."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from cachetier.objects import ObjectStore
from cachetier.store import Store
from versioning import (
    ShardEntry,
    ShardTable,
    VersionRecord,
    make_operation,
    save_shard_table,
    save_version,
)

SCHEMA = {"fields": [{"name": "text", "type": "string", "nullable": True}], "arrow": "c2NoZW1h"}
OTHER_SCHEMA = {"fields": [{"name": "text", "type": "large_string", "nullable": True}], "arrow": "eA=="}
CREATED = "2024-05-01T12:00:00.000000Z"


def put_shard(objects: ObjectStore, records: Iterable[str], chunks: tuple[str, ...] = ()) -> ShardEntry:
    """Store a real shard object (one record per line) and return its entry."""
    lines = list(records)
    data = "\n".join(lines).encode()
    oid = objects.put(data)
    return ShardEntry(oid, len(lines), len(data), len(data), 0, chunks)


def record_hashes(objects: ObjectStore):
    """Return a ``record_hashes(shard_id)`` callable that reads the shard and hashes its lines."""

    def hashes(shard_id: str) -> Iterator[bytes]:
        data = objects.get(shard_id)
        for line in data.decode().split("\n") if data else []:
            yield hashlib.blake2b(line.encode(), digest_size=16).digest()

    return hashes


def make_version(
    store: Store,
    objects: ObjectStore,
    entries: list[ShardEntry],
    parents: tuple[str, ...] = (),
    message: str = "m",
    audit: str | None = None,
) -> str:
    """Write a shard table and a version record directly (no ref); return the version id."""
    table = ShardTable.from_entries(entries)
    record = VersionRecord(
        parents=parents,
        data_hash=save_shard_table(objects, table),
        schema=SCHEMA,
        records=table.records_total,
        shards=len(table),
        bytes=table.bytes_total,
        message=message,
        author="tester",
        created=CREATED,
        operation=make_operation("ingest", audit=audit),
    )
    return save_version(store, record)
