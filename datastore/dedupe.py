"""Deduplication as a recorded version: run :mod:`dedup` over a version's records, write the
kept records as shards, the removed ones as an audit object, and commit.

Only the content column is read for detection (``text`` or the ``--text-column``; the
``data`` bytes of a ``files`` dataset for exact dedup). Shards with nothing removed are
reused as they are (no rewrite, no new bytes); shards with removals are filtered and
re-encoded. The audit object (Parquet) lists every removed record with its global index
in the parent version, its cluster, the kept representative and the reason; the version
record's ``operation`` holds the parameters, the counts and the audit object id.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cachetier.errors import BadInputError, StoreUnavailableError
from datastore._pipeline import Uploader, store_as_delta
from datastore.recordhash import hash_records
from datastore.shards import PendingShard, ShardOptions, encode_shard, read_shard
from dedup import DedupConfig, DedupResult, find_duplicates
from versioning import ShardEntry, ShardTable

if TYPE_CHECKING:
    from datastore.repo import Repo

__all__ = [
    "content_column",
    "dask_client",
    "dedup_config",
    "dedup_shards",
    "dedup_staged_ingests",
    "dedup_version",
    "read_shard_column",
    "summary",
    "write_audit",
]

_RESULT_KEYS = ("records", "removed_records", "exact_removed", "near_removed", "clusters", "skipped")


def dedup_version(
    repo: Repo,
    ref: str | None,
    *,
    method: str,
    threshold: float,
    num_perm: int,
    text_column: str | None,
    scheduler: str | None,
    client: Any,
    message: str | None,
) -> dict[str, Any]:
    """Commit ``ref``'s data without its duplicates on HEAD's branch (see :meth:`Repo.dedup`)."""
    from versioning import make_operation

    head = repo.resolve()
    info = repo.show(ref)
    config, column = dedup_config(info.record.schema, method, threshold, num_perm, text_column)
    with dask_client(scheduler, client) as dask:
        entries, result = dedup_shards(
            repo, repo.shard_table(info.version), config, column=column, client=dask
        )
    audit = write_audit(repo, result)
    counts = summary(result, audit)
    operation = make_operation(
        "dedup", params={"ref": info.version, "column": column, **result.params}, audit=audit
    )
    operation["result"] = {k: counts[k] for k in _RESULT_KEYS}
    text = message or (
        f"dedup ({config.method}) of {info.version[:12]}: "
        f"removed {result.removed_records} of {result.records} records"
    )
    version = repo.commit_table(
        entries, schema=info.record.schema, base=head, message=text, operation=operation
    )
    return {**counts, "version": version.version}


def dedup_staged_ingests(
    repo: Repo, staged: dict[str, Any], *, method: str, threshold: float, num_perm: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Deduplicate staged ingests against themselves and the parent's records.

    Returns the replacement staging dict (one merged ingest that remembers the dedup
    parameters and audit) and the counts.
    """
    from datastore.repo import shard_to_dict, staged_shard_entries

    first = staged["ingests"][0]
    config, column = dedup_config(
        first["schema"], method, threshold, num_perm, first["params"].get("text_column")
    )
    base = repo.shard_table(staged["base"]) if staged.get("base") else ShardTable.from_entries([])
    table = base.concat(ShardTable.from_entries(staged_shard_entries(staged)))
    entries, result = dedup_shards(repo, table, config, column=column, first_affected=len(base))
    audit = write_audit(repo, result)
    kept = entries[len(base) :]
    counts = summary(result, audit)
    merged = {
        **first,
        "shards": [shard_to_dict(e) for e in kept],
        "records": sum(e.records for e in kept),
        "bytes": sum(e.bytes for e in kept),
        "sources": [src for ingest in staged["ingests"] for src in ingest["sources"]],
        "dedup": {
            "params": result.params,
            "audit": audit,
            "removed_records": counts["removed_records"],
            "clusters": counts["clusters"],
        },
    }
    return {**staged, "ingests": [merged]}, counts


def dedup_config(
    schema: dict[str, Any], method: str, threshold: float, num_perm: int, text_column: str | None
) -> tuple[DedupConfig, str]:
    """The dedup parameters and the column to compare, checked against the schema."""
    if method not in ("exact", "minhash"):
        raise BadInputError(f"unknown dedup method {method!r} (expected exact or minhash)", subject=method)
    column, content = content_column(schema.get("fields", []), text_column)
    if content == "bytes" and method == "minhash":
        raise BadInputError(
            "near-duplicate (minhash) dedup needs a text column; a files dataset supports --method exact",
            subject=column,
        )
    return DedupConfig(method=method, content=content, threshold=threshold, num_perm=num_perm), column


@contextmanager
def dask_client(scheduler: str | None, client: Any) -> Iterator[Any]:
    """Yield ``client``, or a Client connected to ``scheduler`` (closed afterwards), or None."""
    if client is not None or scheduler is None:
        yield client
        return
    from distributed import Client

    from dedup import tune_worker_malloc

    try:
        connected = Client(scheduler, timeout="10s")
    except OSError as e:  # dask raises OSError (a TimeoutError) when no scheduler answers
        raise StoreUnavailableError(
            f"cannot reach the dask scheduler: {e}", subject=scheduler, hint="is the scheduler running there?"
        ) from e
    with connected:
        tune_worker_malloc(connected)  # dask's MALLOC_TRIM_THRESHOLD_ doubles the CPU per document
        yield connected


def content_column(schema_fields: Sequence[dict[str, Any]], text_column: str | None) -> tuple[str, str]:
    """Return ``(column, content)``: which column to compare and whether as text or bytes."""
    names = {f["name"]: f["type"] for f in schema_fields}
    if text_column:
        if text_column not in names:
            raise BadInputError(
                f"no column {text_column!r} to deduplicate on",
                subject=text_column,
                hint=f"columns: {', '.join(names)}",
            )
        return text_column, "text"
    if "text" in names:
        return "text", "text"
    if {"path", "data", "chunks"} <= set(names):
        return "data", "bytes"
    strings = [n for n, t in names.items() if t in ("string", "large_string")]
    if len(strings) == 1:
        return strings[0], "text"
    raise BadInputError(
        "cannot tell which column holds the content to deduplicate",
        subject=", ".join(names),
        hint="pass --text-column COL",
    )


def dedup_shards(
    repo: Repo,
    table: ShardTable,
    config: DedupConfig,
    *,
    column: str,
    first_affected: int = 0,
    client: Any = None,
    shard_size: int | None = None,
) -> tuple[list[ShardEntry], DedupResult]:
    """Find duplicates over the shards of ``table``; return the kept shards and the result.

    Records of shards before index ``first_affected`` are never removed (they are the
    parent's data when deduplicating a staged ingest against it); they still count as
    the first of their cluster.
    """
    hashes = table.hashes()

    def parts() -> Iterator[pa.Table]:
        for _oid, data in repo.objects.get_many(hashes):
            yield read_shard(data, [column])

    # On a cluster each part reads its own shard on a worker (from the repository URL).
    source: Any = (
        [functools.partial(read_shard_column, repo.url, oid, column, repo.algorithm) for oid in hashes]
        if client is not None
        else parts
    )
    offsets = np.concatenate([[0], np.cumsum([int(n) for n in table.records])])
    found = find_duplicates(source, column=column, config=config, client=client)
    result = found.keeping_first(int(offsets[first_affected]))
    keep = result.keep
    options = (
        ShardOptions(shard_size=shard_size, algorithm=repo.algorithm)
        if shard_size
        else ShardOptions(algorithm=repo.algorithm)
    )
    entries: list[ShardEntry] = []
    # Through an Uploader, so small re-encoded shards (a files dataset's) go into packs.
    with Uploader(repo.objects, workers=1, budget=options.max_size) as up:
        for i, entry in enumerate(table):
            mask = keep[offsets[i] : offsets[i + 1]]
            if mask.all():
                entries.append(entry)
                continue
            if not mask.any():
                continue
            data = repo.objects.get(entry.hash)
            kept = read_shard(data).filter(pa.array(mask))
            digests = hash_records(kept)
            pending = PendingShard(kept, digests.hashes, digests.sizes)
            encoded = encode_shard(pending, options)
            # The shard less its duplicates: a delta over the shard it came from, when large.
            large = len(encoded.data) >= up.pack_below
            stored = store_as_delta(up, encoded, pending, options, entry.hash, data) if large else "whole"
            if stored not in ("delta", "stored"):
                up.put(encoded.hash, encoded.data, shard=True, checked=stored != "whole")
            entries.append(
                ShardEntry(
                    encoded.hash,
                    encoded.records,
                    encoded.bytes,
                    encoded.uncompressed_bytes,
                    0,
                    encoded.chunks,
                )
            )
    return entries, result


def read_shard_column(url: str, oid: str, column: str, algorithm: str) -> pa.Table:
    """Read one column of shard ``oid`` from the repository at ``url`` (runs on dask workers)."""
    from cachetier.registry import open_store
    from datastore.shardpatch import shard_objects

    with open_store(url) as store:
        return read_shard(shard_objects(store, algorithm=algorithm).get(oid), [column])


def write_audit(repo: Repo, result: DedupResult) -> str:
    """Store the audit as one Parquet object and return its id.

    One row per removed record (``action="removed"``, its cluster, kept representative,
    reason, and for exact copies the record it copies) and one per record kept without
    comparison (``action="kept"``, the reason: empty, null, too large, ...). ``record``
    is the record's index in the deduplicated input, in version order.
    """
    removed = result.removed.append_column(
        "action", pa.array(["removed"] * result.removed.num_rows, pa.string())
    )
    skipped = result.skipped.append_column(
        "action", pa.array(["kept"] * result.skipped.num_rows, pa.string())
    )
    audit = pa.concat_tables([removed, skipped], promote_options="default").sort_by("record")
    buf = io.BytesIO()
    pq.write_table(audit, buf, compression="zstd")
    return repo.objects.put(buf.getvalue())


def summary(result: DedupResult, audit: str, version: str | None = None) -> dict[str, Any]:
    """The JSON the CLI prints: ``removed_records``, ``clusters``, ``version`` and more."""
    s = result.summary()
    out = {
        "removed_records": s["removed_records"],
        "clusters": s["clusters"],
        "records": s["records"],
        "kept_records": s["kept_records"],
        "exact_removed": s["exact_removed"],
        "near_removed": s["near_removed"],
        "skipped": s["skipped"],
        "params": s["params"],
        "audit": audit,
    }
    if version is not None:
        out["version"] = version
    return out
