"""Version records in the store, the history they form, and what changed between two versions.

Records live at ``versions/<id>``. :func:`save_version` writes one (a no-op when it is
already there: same content, same id); :func:`load_version` reads one back and checks
that its bytes hash to the id, so a damaged or swapped record is caught. :func:`log`
walks first parents; :func:`diff` compares two versions' shard tables as multisets and,
given a way to read a shard's record hashes, counts added and removed records by
reading only the shards that differ.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cachetier.errors import BadInputError, IntegrityError, NotFoundError
from cachetier.hashing import DEFAULT_HASH, content_hash, is_object_id
from cachetier.objects import ObjectStore
from cachetier.store import Store
from versioning.records import VersionRecord

if TYPE_CHECKING:
    from versioning.shardtable import ShardTable

__all__ = [
    "VERSIONS_PREFIX",
    "VersionDiff",
    "diff",
    "load_version",
    "log",
    "save_version",
    "version_key",
]

VERSIONS_PREFIX = "versions/"

#: ``record_hashes(shard_id)`` yields one hash (bytes) per record of that shard.
RecordHashes = Callable[[str], Iterable[bytes]]


def version_key(version_id: str) -> str:
    """Return the store key of version ``version_id``."""
    return VERSIONS_PREFIX + version_id


def save_version(store: Store, record: VersionRecord, *, algorithm: str = DEFAULT_HASH) -> str:
    """Store ``record`` at ``versions/<id>`` (unless already there) and return its id."""
    data = record.encode()
    version_id = content_hash(data, algorithm)
    key = version_key(version_id)
    if not store.exists(key):
        store.put(key, data)
    return version_id


def load_version(store: Store, version_id: str, *, algorithm: str = DEFAULT_HASH) -> VersionRecord:
    """Read version ``version_id``; NotFoundError if absent, IntegrityError if its bytes do not match."""
    if not isinstance(version_id, str) or not is_object_id(version_id):
        raise BadInputError(f"not a version id: {version_id!r}", subject=str(version_id))
    key = version_key(version_id)
    try:
        data = store.get(key)
    except NotFoundError:
        raise NotFoundError("no such version", subject=f"version {version_id}") from None
    actual = content_hash(data, algorithm)
    if actual != version_id:
        raise IntegrityError(
            f"version record is corrupt: content hashes to {actual[:16]}…",
            subject=key,
            hint="run `dataset verify` to list every damaged object",
        )
    try:
        return VersionRecord.decode(data, subject=key)
    except BadInputError as e:
        raise IntegrityError(e.message, subject=key, hint=e.hint) from e


def log(
    store: Store, start_id: str, limit: int | None = None, *, algorithm: str = DEFAULT_HASH
) -> Iterator[tuple[str, VersionRecord]]:
    """Yield ``(id, record)`` from ``start_id`` back along first parents, newest first."""
    if limit is not None and limit < 0:
        raise BadInputError(f"log limit must be >= 0, got {limit!r}")
    version_id: str | None = start_id
    count = 0
    while version_id is not None and (limit is None or count < limit):
        record = load_version(store, version_id, algorithm=algorithm)
        yield version_id, record
        count += 1
        version_id = record.parents[0] if record.parents else None


@dataclass(frozen=True)
class VersionDiff:
    """What changed from version ``a`` to version ``b``.

    Shard counts are multiset differences of the two shard tables (a shard listed twice
    counts twice). ``added_records``/``removed_records`` are exact record-level counts
    when ``record_level`` is true (record hashes of the differing shards compared as
    multisets); otherwise they are the record counts of the added/removed shards.
    """

    a: str
    b: str
    added_shards: int
    removed_shards: int
    added_records: int
    removed_records: int
    added_shard_records: int
    removed_shard_records: int
    records_before: int
    records_after: int
    record_level: bool

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (the ``dataset diff --json`` keys)."""
        return asdict(self)


def diff(
    objects: ObjectStore,
    a_id: str,
    b_id: str,
    record_hashes: RecordHashes | None = None,
) -> VersionDiff:
    """Compare versions ``a_id`` → ``b_id``; read records only of shards that differ."""
    from versioning.shardtable import load_shard_table  # pyarrow: only a diff reads shard tables

    store, algorithm = objects.store, objects.algorithm
    record_a = load_version(store, a_id, algorithm=algorithm)
    record_b = load_version(store, b_id, algorithm=algorithm)
    table_a = load_shard_table(objects, record_a.data_hash)
    table_b = (
        table_a if record_b.data_hash == record_a.data_hash else load_shard_table(objects, record_b.data_hash)
    )
    counts_a, counts_b = _shard_counts(table_a), _shard_counts(table_b)
    removed, added = counts_a - counts_b, counts_b - counts_a
    records_of = {**_records_per_shard(table_a, removed), **_records_per_shard(table_b, added)}
    added_shard_records = sum(records_of[h] * k for h, k in added.items())
    removed_shard_records = sum(records_of[h] * k for h, k in removed.items())
    added_records, removed_records = added_shard_records, removed_shard_records
    if record_hashes is not None:
        old = _record_counts(removed, record_hashes)
        new = _record_counts(added, record_hashes)
        added_records, removed_records = (new - old).total(), (old - new).total()
    return VersionDiff(
        a=a_id,
        b=b_id,
        added_shards=added.total(),
        removed_shards=removed.total(),
        added_records=added_records,
        removed_records=removed_records,
        added_shard_records=added_shard_records,
        removed_shard_records=removed_shard_records,
        records_before=record_a.records,
        records_after=record_b.records,
        record_level=record_hashes is not None,
    )


def _shard_counts(table: ShardTable) -> Counter[bytes]:
    return Counter(_raw_ids(table))


def _records_per_shard(table: ShardTable, wanted: Counter[bytes]) -> dict[bytes, int]:
    if not wanted:
        return {}
    return {shard: count for shard, count in zip(_raw_ids(table), table.records.tolist()) if shard in wanted}


def _raw_ids(table: ShardTable) -> list[bytes]:
    raw = table.raw_hashes().tobytes()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


def _record_counts(shards: Counter[bytes], record_hashes: RecordHashes) -> Counter[bytes]:
    counts: Counter[bytes] = Counter()
    for shard, times in shards.items():
        for record_hash in record_hashes(shard.hex()):
            counts[bytes(record_hash)] += times
    return counts
