"""The ingest index: what earlier ingests learned, so a re-ingest redoes only the change.

A workspace-local cache file (JSON; about 150 bytes per file, loads 20,000 entries in a
few tens of milliseconds) that remembers:

- per source **file** of a ``files`` ingest, keyed by absolute path and checked against
  (record path, size, mtime_ns): the record's hash, canonical size and chunk ids, so an
  unchanged file is not read again;
- per **shard**, keyed by the hash of its options, schema and record hashes: the stored
  shard's id and counts, so an unchanged shard is not encoded again (its object is
  checked to exist before it is reused);
- per tabular **source** (path, size, mtime_ns): the schema the last ingest settled on,
  so a source whose types widen midway does not restart the ingest every time;
- per large stored **shard**: its anchors (a bottom-k sketch of its record hashes, see
  :mod:`datastore.shardpatch`), so a shard rewritten by an edit can be stored as a delta
  over the shard it replaces. An index that never saw the shards an edit replaces (a
  fresh workspace, or none) learns their anchors from them when it first needs them
  (:meth:`IngestIndex.learn_anchors_from`).

It is a cache: a missing, unreadable or foreign (other repository, other format) index
is an empty one, and losing it costs time, never correctness. Like git and DVC it trusts
size and mtime; a file modified within ``RACY_NS`` of being read is not remembered, so
an edit in the same clock tick as the ingest is not missed.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from cachetier.errors import TierdataError
from datastore.files import FileEntry
from datastore.shards import ShardInfo

__all__ = ["RACY_NS", "FileHit", "IngestIndex"]

log = logging.getLogger(__name__)

INDEX_FORMAT = 1
RACY_NS = 100_000_000  # 0.1 s: above the mtime granularity of ext4, xfs, btrfs, tmpfs
_SHARD_CAPACITY = 200_000
_ANCHOR_CAPACITY = 400_000


@dataclass(frozen=True, slots=True)
class FileHit:
    """What the index knows of an unchanged file's record."""

    hash: bytes  # 16-byte record hash
    size: int  # canonical record size
    chunks: tuple[str, ...] | None


class IngestIndex:
    """Load with :meth:`load`, query and update during an ingest, then :meth:`save`."""

    def __init__(self, path: str | os.PathLike[str] | None, repo: str = ""):
        self.path = Path(path) if path is not None else None
        self.repo = repo
        self._files: dict[str, list] = {}
        self._file_scope = ""
        self._shards: dict[str, list] = {}
        self._schemas: dict[str, list] = {}
        self._anchors: dict[str, str] = {}  # anchor -> shard id, oldest first
        self._anchors_lock = threading.Lock()  # uploader threads remember and forget
        self._anchors_by_shard: dict[str, list[str]] | None = None  # made at the first forget
        self._learn_from: Callable[[AbstractSet[str]], Iterable[tuple[str, Sequence[str]]]] | None = None
        self._learn_lock = threading.Lock()
        self._generation = 0
        self._changes: list[tuple] | None = None
        self.dirty = False

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, repo: str = "") -> IngestIndex:
        """Read the index at ``path``; anything unusable gives an empty index."""
        index = cls(path, repo)
        try:
            raw = json.loads(Path(path).read_bytes())
        except (OSError, ValueError):
            return index
        if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT or raw.get("repo") != repo:
            return index
        try:
            index._files = dict(raw["files"])
            index._file_scope = str(raw["file_scope"])
            index._shards = dict(raw["shards"])
            index._schemas = dict(raw["schemas"])
            index._anchors = {str(k): str(v) for k, v in raw.get("anchors", {}).items()}
            index._generation = int(raw["generation"]) + 1
        except (KeyError, TypeError, ValueError):
            return cls(path, repo)
        return index

    # ---------------------------------------------------------------- files

    def file(self, abspath: str, rel: str, size: int, mtime_ns: int, scope: str) -> FileHit | None:
        """The remembered record of a file, if it has the same path, size and mtime."""
        if scope != self._file_scope:
            return None
        entry = self._files.get(abspath)
        if entry is None or entry[0] != rel or entry[1] != size or entry[2] != mtime_ns:
            return None
        chunks = entry[5]
        return FileHit(bytes.fromhex(entry[3]), entry[4], tuple(chunks) if chunks is not None else None)

    def files(self, entries: Sequence[FileEntry], scope: str) -> list[FileHit | None]:
        """:meth:`file` for each of ``entries`` (a walk's listing), in order."""
        if scope != self._file_scope:
            return [None] * len(entries)
        get = self._files.get
        hits: list[FileHit | None] = []
        for e in entries:
            entry = get(e.abspath)
            if entry is None or entry[0] != e.path or entry[1] != e.size or entry[2] != e.mtime_ns:
                hits.append(None)
            else:
                chunks = entry[5]
                hits.append(
                    FileHit(bytes.fromhex(entry[3]), entry[4], None if chunks is None else tuple(chunks))
                )
        return hits

    def remember_file(
        self,
        abspath: str,
        rel: str,
        size: int,
        mtime_ns: int,
        scope: str,
        record_hash: bytes,
        record_size: int,
        chunks: tuple[str, ...] | list[str] | None,
        *,
        read_started_ns: int,
    ) -> None:
        """Remember a file's record, unless its mtime is too recent to be trusted."""
        if mtime_ns >= read_started_ns - RACY_NS:
            self._set_file(scope, abspath, None)
            return
        chunk_list = list(chunks) if chunks is not None else None
        self._set_file(scope, abspath, [rel, size, mtime_ns, record_hash.hex(), int(record_size), chunk_list])

    def remember_files(
        self,
        records: Sequence[tuple[FileEntry, bytes, int, tuple[str, ...] | None]],
        scope: str,
        *,
        read_started_ns: int,
    ) -> None:
        """:meth:`remember_file` for each ``(entry, record hash, record size, chunks)``."""
        for e, record_hash, record_size, chunks in records:
            if e.mtime_ns >= read_started_ns - RACY_NS:
                self._set_file(scope, e.abspath, None)
                continue
            chunk_list = list(chunks) if chunks is not None else None
            value = [e.path, e.size, e.mtime_ns, record_hash.hex(), int(record_size), chunk_list]
            self._set_file(scope, e.abspath, value)

    def _set_file(self, scope: str, abspath: str, value: list | None) -> None:
        """Remember (or, with None, forget) one file's entry under ``scope``."""
        if self._changes is not None:
            self._changes.append(("file", scope, abspath, value))
        if value is None:
            self._files.pop(abspath, None)
            return
        if scope != self._file_scope:
            self._files.clear()
            self._file_scope = scope
        self._files[abspath] = value
        self.dirty = True

    def forget_files_under(self, root: str, keep: set[str]) -> None:
        """Drop entries below ``root`` that the latest walk did not see (deleted files)."""
        prefix = root.rstrip(os.sep) + os.sep
        stale = [p for p in self._files if (p == root or p.startswith(prefix)) and p not in keep]
        for p in stale:
            del self._files[p]
        self.dirty = self.dirty or bool(stale)

    # ---------------------------------------------------------------- shards

    def shard(self, key: str) -> ShardInfo | None:
        """The stored shard with these exact records and options, if one was made before."""
        entry = self._shards.get(key)
        if entry is None:
            return None
        entry[5] = self._generation
        if self._changes is not None:
            self._changes.append(("shard", key, entry))
        return ShardInfo(entry[0], entry[1], entry[2], entry[3], tuple(entry[4]))

    def remember_shard(self, key: str, info: ShardInfo) -> None:
        """Remember which shard these records and options made."""
        entry = [
            info.hash,
            info.records,
            info.bytes,
            info.uncompressed_bytes,
            list(info.chunks),
            self._generation,
        ]
        self._shards[key] = entry
        if self._changes is not None:
            self._changes.append(("shard", key, entry))
        self.dirty = True

    def remember_anchors(self, shard_id: str, anchors: Sequence[str]) -> None:
        """Remember the anchors of a stored shard (see :meth:`similar_shard`)."""
        self._add_anchors(shard_id, anchors, replace=True)

    def _add_anchors(self, shard_id: str, anchors: Sequence[str], *, replace: bool) -> None:
        """Map ``anchors`` to ``shard_id``, as the newest; with ``replace`` False only the
        anchors that map to no shard yet."""
        with self._anchors_lock:
            added = list(anchors) if replace else [a for a in anchors if a not in self._anchors]
            if not added:
                return
            for anchor in added:
                self._anchors.pop(anchor, None)  # re-inserted as the newest
                self._anchors[anchor] = shard_id
            if self._anchors_by_shard is not None:
                self._anchors_by_shard.setdefault(shard_id, []).extend(added)
            if self._changes is not None:
                self._changes.append(("anchors", shard_id, added))
            self.dirty = True

    def forget_anchors_of(self, shard_id: str) -> None:
        """Forget the anchors of a shard that is no longer stored."""
        with self._anchors_lock:
            if self._anchors_by_shard is None:
                self._anchors_by_shard = {}
                for anchor, sid in self._anchors.items():
                    self._anchors_by_shard.setdefault(sid, []).append(anchor)
            stale = [a for a in self._anchors_by_shard.pop(shard_id, []) if self._anchors.get(a) == shard_id]
            for anchor in stale:
                del self._anchors[anchor]
            if stale and self._changes is not None:
                self._changes.append(("forget", shard_id))
            self.dirty = self.dirty or bool(stale)

    def similar_shard(self, anchors: Sequence[str], *, exclude: str = "") -> str | None:
        """The remembered shard sharing the most of ``anchors`` (at least two), or None.

        When none does and :meth:`learn_anchors_from` gave a source, that source is read
        first (once, by the first thread that asks; the others wait for it).
        """
        found = self._most_similar(anchors, exclude)
        if found is None and self._learn_from is not None:
            self._learn()
            found = self._most_similar(anchors, exclude)
        return found

    def learn_anchors_from(
        self, shards: Callable[[AbstractSet[str]], Iterable[tuple[str, Sequence[str]]]]
    ) -> None:
        """Where to learn anchors that were never remembered here: ``shards(known)`` yields
        (shard id, anchors) of stored shards but the ``known`` ones (those this index has
        anchors of), such as the shards of the version an ingest joins, which a workspace
        that did not write them (a fresh one) does not know. It is called only when a shard
        finds no similar one, at most once; what it yields never replaces an anchor
        remembered here, and a failure in it only means fewer deltas."""
        self._learn_from = shards

    def _most_similar(self, anchors: Sequence[str], exclude: str) -> str | None:
        votes: dict[str, int] = {}
        with self._anchors_lock:
            for anchor in anchors:
                shard_id = self._anchors.get(anchor)
                if shard_id is not None and shard_id != exclude:
                    votes[shard_id] = votes.get(shard_id, 0) + 1
        if not votes:
            return None
        best = max(votes, key=lambda k: votes[k])
        return best if votes[best] >= 2 else None

    def _learn(self) -> None:
        with self._learn_lock:  # threads that ask meanwhile wait here for what it learns
            shards = self._learn_from
            if shards is None:
                return
            try:
                with self._anchors_lock:
                    known = set(self._anchors.values())
                for shard_id, anchors in shards(known):
                    self._add_anchors(shard_id, anchors, replace=False)
            except (TierdataError, pa.ArrowException, OSError) as e:
                log.debug("anchors of the joined version not learned: %s", e)
            finally:
                self._learn_from = None

    # ---------------------------------------------------------------- another process's changes

    def record_changes(self) -> None:
        """Keep a list of every file and shard remembered from now on (see :meth:`changes`)."""
        self._changes = []

    def changes(self) -> list[tuple]:
        """What was remembered since :meth:`record_changes`, for :meth:`apply_changes`
        on the index of another process (a forked copy of this one)."""
        return list(self._changes or [])

    def apply_changes(self, changes: Sequence[tuple]) -> None:
        """Remember what another process's copy of this index remembered, in order."""
        for change in changes:
            if change[0] == "file":
                _, scope, abspath, value = change
                self._set_file(scope, abspath, value)
            elif change[0] == "anchors":
                self.remember_anchors(change[1], change[2])
            elif change[0] == "forget":
                self.forget_anchors_of(change[1])
            else:
                _, key, entry = change
                self._shards[key] = [*entry[:5], self._generation]
                self.dirty = True

    # ---------------------------------------------------------------- schemas

    def schema_hint(self, abspath: str, size: int, mtime_ns: int, context: str) -> pa.Schema | None:
        """The schema an earlier ingest of this unchanged source settled on, read in the same
        ``context`` (the same format and reader options, beside the same other sources)."""
        entry = self._schemas.get(abspath)
        if entry is None or len(entry) < 4 or entry[0] != size or entry[1] != mtime_ns or entry[3] != context:
            return None
        try:
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(entry[2])))
        except (ValueError, pa.ArrowInvalid):
            return None

    def remember_schema(
        self, abspath: str, size: int, mtime_ns: int, schema: pa.Schema, context: str
    ) -> None:
        """Remember the schema a source was read with, in ``context`` (see :meth:`schema_hint`)."""
        encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
        self._schemas[abspath] = [size, mtime_ns, encoded, context]
        self.dirty = True

    # ---------------------------------------------------------------- persistence

    def save(self) -> None:
        """Write the index atomically (temp file + rename); a no-op without a path or changes."""
        if self.path is None or not self.dirty:
            return
        if len(self._shards) > _SHARD_CAPACITY:
            newest = sorted(self._shards.items(), key=lambda kv: kv[1][5], reverse=True)
            self._shards = dict(newest[:_SHARD_CAPACITY])
        if len(self._anchors) > _ANCHOR_CAPACITY:
            self._anchors = dict(list(self._anchors.items())[-_ANCHOR_CAPACITY:])
            self._anchors_by_shard = None
        payload = {
            "format": INDEX_FORMAT,
            "repo": self.repo,
            "generation": self._generation,
            "file_scope": self._file_scope,
            "files": self._files,
            "shards": self._shards,
            "schemas": self._schemas,
            "anchors": self._anchors,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ingest-index.", dir=self.path.parent)
        try:
            # json.dumps uses the C encoder; json.dump to a file would not (3x slower here).
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(payload, separators=(",", ":")).encode("utf-8"))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.dirty = False

    def __len__(self) -> int:
        return len(self._files) + len(self._shards)
