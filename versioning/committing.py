"""Commit: turn a list of shards into a new version on a branch, safely against races and crashes.

Order of writes (crash safety): the shard table object, then the version record, then
the branch, moved by compare-and-swap. A crash at any point leaves the branch at the
old or the new version; at worst some unreferenced objects remain for ``gc``.

Races: when another writer moved the branch between our read and our swap,

* an **append** is rebased: its shards are put after the new head's shards and the
  swap is retried (a bounded number of times), so every racing append lands once;
* a **replace** is refused with a ConflictError: replacing data someone just changed
  could silently drop their change, so the user decides.

Rebasing is only done when the new head still descends from the parent the caller
expected; if the branch was rewritten (deleted, or moved to an unrelated history) the
commit is refused too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any, Literal

from cachetier.errors import BadInputError, ConflictError
from cachetier.objects import ObjectStore
from cachetier.store import Store
from versioning.history import load_version, save_version
from versioning.records import VersionRecord, utc_now
from versioning.refs import RefStore, validate_ref_name
from versioning.shardtable import ShardEntry, ShardTable, load_shard_table, save_shard_table

__all__ = ["DEFAULT_ATTEMPTS", "CommitMode", "commit"]

CommitMode = Literal["append", "replace"]
#: How many times an append is rebased onto a moving branch before giving up.
DEFAULT_ATTEMPTS = 64
# How far back a rebase looks for the expected parent in the new head's history.
_MAX_ANCESTRY_WALK = 10_000


def commit(
    store: Store,
    objects: ObjectStore,
    branch: str,
    *,
    shards: Sequence[ShardEntry] | ShardTable,
    schema: dict[str, Any],
    mode: CommitMode,
    expected_parent: str | None,
    message: str,
    author: str,
    operation: dict[str, Any],
    created: str | None = None,
    max_attempts: int = DEFAULT_ATTEMPTS,
) -> tuple[str, VersionRecord]:
    """Commit ``shards`` to ``branch`` as a new version and return ``(version_id, record)``.

    ``append`` keeps the parent's shards and adds these after them; ``replace`` makes
    these the whole data. ``expected_parent`` is the head the caller based its work on
    (None: the branch does not exist yet). On append, the parent's schema ``fields``
    must equal ``schema["fields"]`` (BadInputError naming both). Raises ConflictError
    (its message says "conflict" and what to do) when the race cannot be resolved.
    """
    if mode not in ("append", "replace"):
        raise BadInputError(f"commit mode must be 'append' or 'replace', got {mode!r}")
    if max_attempts < 1:
        raise BadInputError(f"max_attempts must be >= 1, got {max_attempts!r}")
    validate_ref_name(branch, "branch")
    refs = RefStore(store, algorithm=objects.algorithm)
    new = shards if isinstance(shards, ShardTable) else ShardTable.from_entries(shards)
    fixed = {
        "schema": schema,
        "message": message,
        "author": author,
        "operation": operation,
        "created": created or utc_now(),
    }
    known_descendants: set[str | None] = {expected_parent}
    head = refs.get_branch(branch)
    jitter = random.Random()
    for attempt in range(max_attempts):
        if head not in known_descendants:
            if mode == "replace":
                raise _replace_conflict(branch, expected_parent, head)
            if head is None or not _descends_from(store, objects.algorithm, head, known_descendants):
                raise _rewritten_conflict(branch, expected_parent, head)
            known_descendants.add(head)
        version_id, record = _write_version(store, objects, branch, head, new, mode, fixed)
        try:
            refs.set_branch(branch, version_id, head)
            return version_id, record
        except ConflictError:
            if mode == "replace":
                raise _replace_conflict(branch, head, refs.get_branch(branch)) from None
        if attempt >= 2:  # spread out writers that keep colliding (the first retry goes at once)
            time.sleep(jitter.uniform(0, min(0.001 * attempt, 0.05)))
        head = refs.get_branch(branch)
    raise ConflictError(
        f"conflict: branch {branch!r} kept moving; gave up after {max_attempts} attempts to append",
        subject=f"branch {branch!r}",
        hint="too many concurrent writers on one branch; retry the commit (nothing was changed)",
    )


def _write_version(
    store: Store,
    objects: ObjectStore,
    branch: str,
    head: str | None,
    new: ShardTable,
    mode: CommitMode,
    fixed: dict[str, Any],
) -> tuple[str, VersionRecord]:
    """Write the shard table and the version record for ``new`` on top of ``head``."""
    table = new
    if head is not None and mode == "append":
        parent = load_version(store, head, algorithm=objects.algorithm)
        parent_table = load_shard_table(objects, parent.data_hash)
        if len(parent_table):
            _check_schema(branch, parent.schema, fixed["schema"])
        table = parent_table.concat(new)
    data_hash = save_shard_table(objects, table)
    record = VersionRecord(
        parents=(head,) if head is not None else (),
        data_hash=data_hash,
        records=table.records_total,
        shards=len(table),
        bytes=table.bytes_total,
        **fixed,
    )
    return save_version(store, record, algorithm=objects.algorithm), record


def _check_schema(branch: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    if old.get("fields") != new.get("fields"):
        raise BadInputError(
            f"cannot append: the new data's schema ({_describe(new)}) differs from "
            f"the schema on branch {branch!r} ({_describe(old)})",
            subject=f"branch {branch!r}",
            hint="make the columns match, commit with --replace, or drop what is staged with `dataset reset`",
        )


def _describe(schema: dict[str, Any], limit: int = 8) -> str:
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return repr(fields)
    parts = [f"{f.get('name')}:{f.get('type')}" if isinstance(f, dict) else repr(f) for f in fields[:limit]]
    more = f", … {len(fields) - limit} more" if len(fields) > limit else ""
    return ", ".join(parts) + more


def _descends_from(store: Store, algorithm: str, head: str, ancestors: set[str | None]) -> bool:
    """True when ``head`` has one of ``ancestors`` in its history (None: any history)."""
    if None in ancestors:
        return True
    seen: set[str] = set()
    frontier = [head]
    while frontier and len(seen) < _MAX_ANCESTRY_WALK:
        version_id = frontier.pop()
        if version_id in ancestors:
            return True
        if version_id in seen:
            continue
        seen.add(version_id)
        frontier.extend(load_version(store, version_id, algorithm=algorithm).parents)
    return False


def _short(version_id: str | None) -> str:
    return version_id[:12] if version_id else "(no branch)"


def _replace_conflict(branch: str, expected: str | None, actual: str | None) -> ConflictError:
    return ConflictError(
        f"conflict: branch {branch!r} moved from {_short(expected)} to {_short(actual)} "
        "while you were replacing its data; nothing was committed",
        subject=f"branch {branch!r}",
        hint=f"look at the new versions (`dataset log {branch}`), then run the replace again",
    )


def _rewritten_conflict(branch: str, expected: str | None, actual: str | None) -> ConflictError:
    return ConflictError(
        f"conflict: branch {branch!r} was rewritten ({_short(expected)} is no longer in its history, "
        f"head is now {_short(actual)}); nothing was committed",
        subject=f"branch {branch!r}",
        hint=f"check `dataset log {branch}`, then commit again on the branch's new head",
    )
