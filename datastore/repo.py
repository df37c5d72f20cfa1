"""The ``Repo`` facade: one object per repository, the API the ``dataset`` CLI calls.

A repository lives at a URL (a local folder or ``s3://bucket/prefix``); a workspace
(``.dataset/`` in a project directory) adds HEAD, staging and the ingest index. A Repo
opened without a workspace keeps HEAD on ``main`` and stages in memory, which is what
scripts and training jobs want.

Writes follow the crash-safety order of DESIGN.md §2: content-addressed objects first
(ingest), then the shard table and version record, then the ref by compare-and-swap
(commit). Staging is written only after an ingest succeeded, so a failed ingest leaves
the repository and the workspace as they were (at most unreferenced objects, for gc).
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cachetier.errors import BadInputError, ConflictError, NotFoundError, TierdataError, UsageError
from cachetier.hashing import DEFAULT_HASH
from cachetier.registry import normalize_url, open_store
from cachetier.store import Store
from datastore.shardobjects import shard_objects
from datastore.workspace import Head, Workspace, find_workspace
from versioning import (
    RefStore,
    VersionDiff,
    VersionRecord,
    load_version,
    log,
    make_operation,
    utc_now,
    validate_ref_name,
)
from versioning import diff as diff_versions

if TYPE_CHECKING:
    import pyarrow as pa

    from versioning import ShardEntry, ShardTable

_logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_BRANCH", "Repo", "VersionInfo", "schema_from_dict", "schema_to_dict"]

DEFAULT_BRANCH = "main"
REPO_FORMAT = 1
_REPO_JSON = "repo.json"
_LEARN_THREADS = 4  # shards read at once to learn delta bases (each up to a shard of memory)


@dataclass(frozen=True)
class VersionInfo:
    """A version id with its record; ``to_dict()`` is the CLI's JSON form."""

    version: str
    record: VersionRecord

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "version": self.version,
            "records": r.records,
            "shards": r.shards,
            "bytes": r.bytes,
            "parents": list(r.parents),
            "message": r.message,
            "created": r.created,
            "author": r.author,
            "data_hash": r.data_hash,
            "operation": r.operation,
            "schema": r.schema.get("fields", []),
        }


class Repo:
    """A repository (store + objects + refs), optionally with a workspace."""

    def __init__(self, store: Store, *, workspace: Workspace | None = None, algorithm: str = DEFAULT_HASH):
        self.store = store
        self.url = store.url
        self.algorithm = algorithm
        self.objects = shard_objects(store, algorithm=algorithm)
        self.refs = RefStore(store, algorithm=algorithm)
        self.workspace = workspace
        self._head = workspace.head if workspace else Head(branch=DEFAULT_BRANCH)
        self._staged: dict[str, Any] | None = None
        self._staged_lock = threading.Lock()  # for staging in memory (no workspace)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into DataLoader workers started by spawn or forkserver: not the lock.
        return {k: v for k, v in self.__dict__.items() if k != "_staged_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._staged_lock = threading.Lock()

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def init(
        cls,
        url: str | os.PathLike[str] = "data-repo",
        *,
        workspace: str | os.PathLike[str] | None = ".",
        **options: Any,
    ) -> Repo:
        """Create the repository at ``url`` (or attach to an existing one) and a workspace.

        For ``s3://`` URLs the bucket is created when missing. ``workspace=None`` skips
        writing ``.dataset/``. ``options`` go to the store backend (e.g. ``endpoint``).
        """
        url = normalize_url(_path_or_url(url))
        old_workspace = Workspace.check_repoint(workspace, url) if workspace is not None else None
        try:
            store = open_store(url, **options)
            ensure_bucket = getattr(store, "ensure_bucket", None)
            if ensure_bucket is not None:
                ensure_bucket()
            algorithm = _init_repo_json(store)
        except OSError as e:
            if isinstance(e, TierdataError):
                raise
            raise BadInputError(f"cannot create a repository there: {e.strerror or e}", subject=url) from e
        ws = (
            Workspace.create(workspace, url, settings=_public_options(options), existing=old_workspace)
            if workspace is not None
            else None
        )
        return cls(store, workspace=ws, algorithm=algorithm)

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> Repo:
        """Open a repository by URL, or the one of the workspace found in ``workspace`` / cwd."""
        ws: Workspace | None = None
        if workspace is not None:
            ws = Workspace.load(workspace)
        elif url is None:
            ws = find_workspace()
            if ws is None:
                raise NotFoundError(
                    "no repository given and no .dataset/ workspace here",
                    subject=os.getcwd(),
                    hint="run `dataset init [URL]` or pass the repository URL",
                )
        if url is None:
            assert ws is not None
            url = ws.repo_url
        url = normalize_url(_path_or_url(url))
        if ws is not None and normalize_url(ws.repo_url) != url:
            ws = None  # a URL that is not the workspace's: use that repository, without the workspace
        s3 = dict(ws.settings.get("s3", {})) if ws else {}
        store = open_store(url, **{**s3, **options})
        algorithm = _read_repo_json(store)
        return cls(store, workspace=ws, algorithm=algorithm)

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()

    def __enter__(self) -> Repo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Repo({self.url!r})"

    # -- HEAD -------------------------------------------------------------------------------
    @property
    def head(self) -> Head:
        """The checked-out branch (possibly without commits yet) or detached version."""
        return self._head

    @property
    def head_version(self) -> str | None:
        """The version id HEAD points at, or None on a branch with no commits."""
        if self._head.branch:
            return self.refs.get_branch(self._head.branch)
        return self._head.version

    def resolve(self, ref: str | None = None) -> str:
        """Return the version id of ``ref`` (default HEAD); NotFoundError names the ref."""
        if ref is not None and not isinstance(ref, str):
            raise BadInputError(f"a ref is a branch, tag or version id, not {ref!r}", subject="ref")
        if ref is None or ref == "HEAD":
            version = self.head_version
            if version is None:
                raise NotFoundError(
                    f"branch {self._head.branch!r} has no versions yet",
                    subject="HEAD",
                    hint="ingest data and run `dataset version -m MSG` first",
                )
            return version
        if ref.startswith("HEAD~"):
            try:
                return self.refs.resolve(self.resolve() + ref[4:])
            except NotFoundError as e:  # name the ref as it was written, not HEAD's id
                raise NotFoundError(e.message, subject=ref, hint=e.hint) from None
        return self.refs.resolve(ref)

    def _set_head(self, head: Head) -> None:
        self._head = head
        if self.workspace is not None:
            self.workspace.set_head(head)

    # -- staging ----------------------------------------------------------------------------
    def staged(self) -> dict[str, Any] | None:
        """The staged ingests (a JSON-able dict) or None."""
        if self.workspace is not None:
            return self.workspace.read_staged()
        return self._staged

    def _write_staged(self, staged: dict[str, Any] | None) -> None:
        if self.workspace is not None:
            self.workspace.write_staged(staged)
        else:
            self._staged = staged

    def _staging(self) -> AbstractContextManager[Any]:
        """Hold the staging area for one read-and-rewrite (the workspace's lock)."""
        return self.workspace.locked() if self.workspace is not None else self._staged_lock

    def unstage(self) -> None:
        """Drop everything staged (the objects stay until gc)."""
        with self._staging():
            self._write_staged(None)

    def ingest(
        self,
        sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        format: str = "auto",
        shard_size: int | None = None,
        text_column: str | None = None,
        on_error: str = "fail",
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Read ``sources`` into shards in the object store and stage them; return a summary.

        Nothing is staged unless the whole ingest succeeds. The summary has ``records``,
        ``shards``, ``bytes`` (stored size of the shards), ``new_bytes`` (bytes actually
        written), ``skipped`` and ``staged_records`` (all staged so far).
        """
        from datastore.ingest import ingest as run_ingest

        paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        if not paths:
            raise BadInputError("nothing to ingest: no source paths given")
        index = self.workspace.index_dir if self.workspace is not None else None
        joining = self.staged() or {"base": self.head_version, "ingests": []}
        result = run_ingest(
            [os.fspath(p) for p in paths],
            self.objects,
            format=format,
            shard_size=shard_size,
            text_column=text_column,
            on_error=on_error,
            index=index,
            progress=progress,
            prefer_schema=self._schema_to_join(joining),
            delta_bases=self._delta_bases(joining, paths),
        )
        entry = {
            "format": result.format,
            "schema": schema_to_dict(result.schema),
            "shards": [shard_to_dict(s) for s in result.shards],
            "records": result.records,
            "bytes": sum(s.bytes for s in result.shards),
            "skipped": result.skipped,
            "sources": result.sources,
            "params": {
                "format": result.format,
                "shard_size": result.shard_size,
                "text_column": text_column,
                "on_error": on_error,
            },
        }
        with self._staging():  # read again: another command may have staged or committed meanwhile
            staged = self.staged() or {"base": self.head_version, "ingests": []}
            if staged["ingests"]:
                _check_same_schema(staged["ingests"][0], entry, paths)
            staged["ingests"].append(entry)
            self._write_staged(staged)
        return {
            "records": result.records,
            "shards": len(result.shards),
            "bytes": entry["bytes"],
            "new_bytes": result.new_bytes,
            "skipped": result.skipped,
            "format": result.format,
            "staged_records": sum(i["records"] for i in staged["ingests"]),
        }

    def _schema_to_join(self, staged: dict[str, Any]) -> pa.Schema | None:
        """The schema of the data a new ingest joins: what is staged, else HEAD's data."""
        if staged["ingests"]:
            return schema_from_dict(staged["ingests"][0]["schema"])
        if staged["base"] is None:
            return None
        record = load_version(self.store, staged["base"], algorithm=self.algorithm)
        return schema_from_dict(record.schema) if record.records else None

    def status(self) -> dict[str, Any]:
        """HEAD and what is staged, as a JSON-able dict."""
        staged = self.staged()
        ingests = staged["ingests"] if staged else []
        return {
            "repo": self.url,
            "branch": self._head.branch,
            "version": self.head_version,
            "detached": self._head.branch is None,
            "staged": {
                "ingests": len(ingests),
                "records": sum(i["records"] for i in ingests),
                "shards": sum(len(i["shards"]) for i in ingests),
                "bytes": sum(i["bytes"] for i in ingests),
                "sources": [s.get("path") for i in ingests for s in i["sources"]],
            },
        }

    # -- committing -------------------------------------------------------------------------
    def commit(
        self, message: str, *, tag: str | None = None, replace: bool = False, author: str | None = None
    ) -> VersionInfo:
        """Commit the staged shards as a new version on HEAD's branch.

        Appends to the parent's data by default; ``replace=True`` makes the staged data
        the whole version. Refuses (UsageError) when nothing is staged or HEAD is detached.
        Holds the staging area throughout, so two commits at once commit it once.
        """
        with self._staging():
            return self._commit_staged(message, tag=tag, replace=replace, author=author)

    def _commit_staged(
        self, message: str, *, tag: str | None, replace: bool, author: str | None
    ) -> VersionInfo:
        staged = self.staged()
        if not staged or not staged["ingests"]:
            raise UsageError(
                "nothing staged to commit", subject="staging", hint="run `dataset ingest SRC...` first"
            )
        branch = self._require_branch("commit")
        if tag is not None:
            validate_ref_name(tag, "tag")
            if self.refs.get_tag(tag) is not None:
                raise UsageError(
                    f"tag {tag!r} already exists", subject=tag, hint="tags never move; pick another name"
                )
        ingests = staged["ingests"]
        shards = staged_shard_entries(staged)
        missing = [entry.hash for entry in shards if not self.objects.exists(entry.hash)]
        if missing:
            raise NotFoundError(
                f"{len(missing)} staged shard(s) are missing from the repository (removed by gc?)",
                subject=f"object {missing[0]}",
                hint="drop what is staged with `dataset reset`, then ingest the sources again",
            )
        dedup = next((i["dedup"] for i in ingests if i.get("dedup")), None)
        operation = make_operation(
            "replace" if replace else ("ingest" if staged.get("base") is None else "append"),
            params={**ingests[0]["params"], **({"dedup": dedup["params"]} if dedup else {})},
            sources=[s for i in ingests for s in i["sources"]],
            audit=dedup["audit"] if dedup else None,
        )
        if dedup:
            operation["result"] = {"removed_records": dedup["removed_records"], "clusters": dedup["clusters"]}
        from versioning import commit  # loads pyarrow, which reading a repository does not need

        version, record = commit(
            self.store,
            self.objects,
            branch,
            shards=shards,
            schema=ingests[0]["schema"],
            mode="replace" if replace else "append",
            expected_parent=staged.get("base"),
            message=message,
            author=author or _default_author(),
            operation=operation,
        )
        self._write_staged(None)
        if tag is not None:
            self.refs.create_tag(tag, version)
        return VersionInfo(version, record)

    def commit_table(
        self,
        shards: Sequence[ShardEntry],
        *,
        schema: dict[str, Any],
        base: str | None,
        message: str,
        operation: dict[str, Any],
        branch: str | None = None,
        author: str | None = None,
    ) -> VersionInfo:
        """Commit ``shards`` as the whole data of a new version whose parent is ``base``.

        Used by derived operations (dedup): the branch must still be at ``base``.
        """
        branch = branch or self._require_branch("commit")
        from versioning import commit  # loads pyarrow, which reading a repository does not need

        version, record = commit(
            self.store,
            self.objects,
            branch,
            shards=shards,
            schema=schema,
            mode="replace",
            expected_parent=base,
            message=message,
            author=author or _default_author(),
            operation=operation,
        )
        return VersionInfo(version, record)

    def _require_branch(self, action: str) -> str:
        if self._head.branch is None:
            raise UsageError(
                f"HEAD is detached at {self._head.version}: cannot {action}",
                subject="HEAD",
                hint="`dataset checkout BRANCH` or create one with `dataset branch NAME`",
            )
        return self._head.branch

    # -- history ----------------------------------------------------------------------------
    def show(self, ref: str | None = None) -> VersionInfo:
        """The version ``ref`` names (default HEAD)."""
        version = self.resolve(ref)
        return VersionInfo(version, load_version(self.store, version, algorithm=self.algorithm))

    def log(self, ref: str | None = None, *, limit: int | None = None) -> list[VersionInfo]:
        """History from ``ref`` (default HEAD) back along first parents, newest first."""
        if ref is None and self.head_version is None:
            return []
        start = self.resolve(ref)
        return [VersionInfo(v, r) for v, r in log(self.store, start, limit=limit, algorithm=self.algorithm)]

    def diff(self, a: str, b: str | None = None) -> VersionDiff:
        """What changed from ``a`` to ``b`` (default HEAD), counted per record."""
        from datastore.shards import read_record_hashes

        a_id, b_id = self.resolve(a), self.resolve(b)
        return diff_versions(
            self.objects, a_id, b_id, record_hashes=lambda oid: read_record_hashes(self.objects.get(oid))
        )

    def shard_table(self, ref: str | None = None) -> ShardTable:
        """The shard table of the version ``ref`` names."""
        from versioning import load_shard_table

        return load_shard_table(self.objects, self.show(ref).record.data_hash)

    def tag(self, name: str, ref: str | None = None) -> str:
        """Create tag ``name`` at ``ref`` (default HEAD); tags never move. Returns the id."""
        version = self.resolve(ref)
        self.refs.create_tag(name, version)
        return version

    def branch(self, name: str, ref: str | None = None) -> str:
        """Create branch ``name`` at ``ref`` (default HEAD). Returns the id."""
        version = self.resolve(ref)
        self.refs.create_branch(name, version)
        return version

    def branches(self) -> dict[str, str]:
        """Branch name → version id."""
        return self.refs.list_branches()

    def tags(self) -> dict[str, str]:
        """Tag name → version id."""
        return self.refs.list_tags()

    def checkout(
        self, ref: str | None, *, to: str | os.PathLike[str] | None = None, format: str | None = None
    ) -> VersionInfo:
        """Switch HEAD to ``ref``; with ``to``, also write the version's data into that folder.

        A branch is checked out attached (commits go there); a tag or id detaches HEAD;
        ``HEAD`` (or None) leaves HEAD where it is.
        Materializing never writes outside ``to`` and fails loudly on corrupt data.
        """
        from datastore.checkout import materialize

        info = self.show(ref)
        if to is not None:
            materialize(self, info, Path(to), format=format)
        if ref is None or ref == "HEAD":
            return info  # HEAD stays as it is (on its branch, or detached)
        is_branch = ref in self.refs.list_branches()
        if is_branch or (self._head.branch == ref):
            self._set_head(Head(branch=ref))
        else:
            self._set_head(Head(version=info.version))
        return info

    # -- dedup ------------------------------------------------------------------------------
    def dedup(
        self,
        ref: str | None = None,
        *,
        method: str = "minhash",
        threshold: float = 0.8,
        num_perm: int = 128,
        text_column: str | None = None,
        scheduler: str | None = None,
        client: Any = None,
        message: str | None = None,
    ) -> dict[str, Any]:
        """Commit a new version of ``ref``'s data (default HEAD) without its duplicates.

        The version goes on HEAD's branch (parent: the branch head); its record holds the
        parameters, the counts and the audit object id. ``scheduler`` (an address) or
        ``client`` (a ``distributed.Client``) runs the detection on a dask cluster.
        Returns ``removed_records``, ``clusters``, ``version``, ``audit`` and more.
        """
        from datastore.dedupe import dedup_version

        branch = self._require_branch("dedup")
        if ref is not None and self.resolve(ref) != self.head_version:
            _logger.warning(
                "the new version on branch %r holds %s's data without duplicates, not the branch head's",
                branch,
                ref,
            )
        return dedup_version(
            self,
            ref,
            method=method,
            threshold=threshold,
            num_perm=num_perm,
            text_column=text_column,
            scheduler=scheduler,
            client=client,
            message=message,
        )

    def dedup_staged(
        self, *, method: str = "minhash", threshold: float = 0.8, num_perm: int = 128
    ) -> dict[str, Any]:
        """Remove from the staged data its duplicates (within it and of the parent's records).

        The parent's records come first in version order, so they are always the ones
        kept. The staged shards are replaced; the next commit records the dedup.
        """
        from datastore.dedupe import dedup_staged_ingests

        staged = self.staged()
        if not staged or not staged["ingests"]:
            raise UsageError(
                "nothing staged to deduplicate", subject="staging", hint="run `dataset ingest SRC...` first"
            )
        replaced, counts = dedup_staged_ingests(
            self, staged, method=method, threshold=threshold, num_perm=num_perm
        )
        with self._staging():
            if self.staged() != staged:
                raise ConflictError(
                    "conflict: the staged data changed while it was being deduplicated",
                    subject="staging",
                    hint="run the dedup again",
                )
            self._write_staged(replaced)
        return counts

    # -- maintenance --------------------------------------------------------------------------
    def verify(self, ref: str | None = None, *, all_refs: bool = False) -> dict[str, Any]:
        """Re-hash every object a version references; see :func:`datastore.maintenance.verify`."""
        from datastore.maintenance import verify

        return verify(self, None if all_refs else self.resolve(ref))

    def gc(self, *, dry_run: bool = False, grace_seconds: float = 3600.0) -> dict[str, Any]:
        """Delete unreferenced objects older than the grace period; see :func:`datastore.maintenance.gc`."""
        from datastore.maintenance import gc

        return gc(self, dry_run=dry_run, grace_seconds=grace_seconds)

    def _delta_bases(
        self, joining: dict[str, Any], paths: Sequence[Any]
    ) -> Callable[[AbstractSet[str]], Iterator[tuple[str, list[str]]]] | None:
        """The large shards of the data an ingest joins (staged, else the base version), as
        (shard id, anchors) read from the shards on demand, when a source of the ingest has
        the name of one of that data's sources (an edited file ingested again); else None.

        A workspace that wrote those shards remembers their anchors already; this is for
        one that did not (a fresh clone, a CI job), so its re-ingest of an edit still stores
        deltas. It happens only when some shard of the ingest is new, and reads the record
        hashes of each large shard the index has no anchors of; a shard stored as a delta is
        not rebuilt for them (:func:`~datastore.shardpatch.stored_record_hashes`).
        """
        names = {os.path.basename(os.fspath(p).rstrip("/")) for p in paths}
        sources = [s for ingest in joining["ingests"] for s in ingest["sources"]]
        if joining["base"] is not None:
            sources += self.show(joining["base"]).record.operation.get("sources") or []
        if not names & {os.path.basename(str(s.get("path", "")).rstrip("/")) for s in sources}:
            return None

        def shards(known: AbstractSet[str]) -> Iterator[tuple[str, list[str]]]:
            from cachetier.packs import PACK_MEMBER_LIMIT
            from datastore.shardpatch import anchors, stored_record_hashes

            entries = [(s["hash"], s["bytes"]) for ingest in joining["ingests"] for s in ingest["shards"]]
            if joining["base"] is not None:
                entries += [(e.hash, e.bytes) for e in self.shard_table(joining["base"])]
            large = [h for h, size in dict(entries).items() if size >= PACK_MEMBER_LIMIT and h not in known]

            def sketch(shard_id: str) -> list[str] | None:  # in a thread: only anchors stay in memory
                try:
                    return anchors(stored_record_hashes(self.objects, shard_id))
                except TierdataError:  # a damaged shard or delta is verify's to report
                    return None

            with ThreadPoolExecutor(_LEARN_THREADS) as pool:
                for shard_id, found in zip(large, pool.map(sketch, large)):
                    if found is not None:
                        yield shard_id, found

        return shards

    def staged_object_ids(self) -> set[str]:
        """Objects that staged ingests reference (gc keeps them)."""
        staged = self.staged() or {"ingests": []}
        ids: set[str] = set()
        for ingest in staged["ingests"]:
            if ingest.get("dedup"):
                ids.add(ingest["dedup"]["audit"])
            for shard in ingest["shards"]:
                ids.add(shard["hash"])
                ids.update(shard["chunks"])
        return ids


def schema_to_dict(schema: pa.Schema) -> dict[str, Any]:
    """The version record's schema: readable fields plus the exact Arrow schema (base64 IPC)."""
    import base64

    fields = [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema]
    return {"fields": fields, "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")}


def schema_from_dict(data: dict[str, Any]) -> pa.Schema:
    """Invert :func:`schema_to_dict`."""
    import base64

    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["arrow"])))


def staged_shard_entries(staged: dict[str, Any]) -> list[ShardEntry]:
    """The shards of every staged ingest, in order, as shard-table entries."""
    from versioning import ShardEntry

    return [
        ShardEntry(**{**s, "chunks": tuple(s["chunks"]), "first_record": 0})
        for ingest in staged["ingests"]
        for s in ingest["shards"]
    ]


def shard_to_dict(shard: Any) -> dict[str, Any]:
    """The staging form of a written shard or shard-table entry."""
    return {
        "hash": shard.hash,
        "records": shard.records,
        "bytes": shard.bytes,
        "uncompressed_bytes": shard.uncompressed_bytes,
        "chunks": list(shard.chunks),
    }


def _check_same_schema(first: dict[str, Any], entry: dict[str, Any], paths: Sequence[Any]) -> None:
    if first["schema"]["fields"] != entry["schema"]["fields"]:
        raise BadInputError(
            f"schema ({_fields(entry)}) differs from the data already staged ({_fields(first)})",
            subject=os.fspath(paths[0]),
            hint="one version has one schema: commit what is staged first, or drop it with `dataset reset`",
        )


def _path_or_url(url: Any) -> str:
    if not isinstance(url, (str, os.PathLike)):
        raise BadInputError(f"a repository is a path or URL, not {url!r}", subject="url")
    return os.fspath(url)


def _fields(entry: dict[str, Any], limit: int = 6) -> str:
    fields = entry["schema"]["fields"]
    text = ", ".join(f"{f['name']}:{f['type']}" for f in fields[:limit])
    return text + (f", … {len(fields) - limit} more" if len(fields) > limit else "")


def _init_repo_json(store: Store) -> str:
    try:
        return _read_repo_json(store)
    except NotFoundError:
        pass
    data = {"format": REPO_FORMAT, "hash": DEFAULT_HASH, "created": utc_now(), "tool": "tierdata"}
    payload = json.dumps(data, sort_keys=True).encode()
    try:
        store.compare_and_swap(_REPO_JSON, payload, None)
    except TierdataError:
        return _read_repo_json(store)  # another process initialized it first
    return DEFAULT_HASH


def _read_repo_json(store: Store) -> str:
    try:
        raw = store.get(_REPO_JSON)
    except NotFoundError as e:
        raise NotFoundError(
            "not a tierdata repository (no repo.json)",
            subject=store.url,
            hint="create it with `dataset init URL`",
        ) from e
    try:
        data = json.loads(raw)
        fmt, algorithm = data["format"], data["hash"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadInputError(f"corrupt repo.json: {raw[:80]!r}", subject=f"{store.url}/{_REPO_JSON}") from e
    if fmt != REPO_FORMAT:
        raise BadInputError(
            f"repository format {fmt} is not supported (this tierdata reads format {REPO_FORMAT})",
            subject=store.url,
            hint="upgrade tierdata",
        )
    return str(algorithm)


def _default_author() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _public_options(options: dict[str, Any]) -> dict[str, Any]:
    s3 = {k: v for k, v in options.items() if k in ("endpoint", "region", "secure")}
    return {"s3": s3} if s3 else {}
