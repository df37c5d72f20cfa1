"""The workspace: a ``.dataset/`` folder in the user's project directory.

It remembers the repository URL, the checked-out ref (HEAD: a branch, or a detached
version id), staged-but-uncommitted ingests, the ingest index (what was ingested, by
path, size and mtime) and cache settings. Credentials are never written here.

Files::

    .dataset/config.json     {"repo": URL, "head": {"branch": B} | {"version": ID},
                              "cache": {...}, "s3": {...}}
    .dataset/staged.json     {"base": ID | null, "ingests": [ ... ]}  (absent when nothing is staged)
    .dataset/ingest-index/   the ingest index (see datastore.ingestindex)
    .dataset/lock            locked while the staging area changes (see Workspace.locked)

Every write goes through a temp file and an atomic rename, so a crash leaves the old
file or the new one.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachetier.errors import BadInputError, NotFoundError, UsageError
from cachetier.registry import normalize_url

__all__ = ["WORKSPACE_DIR", "Head", "Workspace", "find_workspace"]

WORKSPACE_DIR = ".dataset"
_SECRET_KEYS = frozenset({"secret_key", "access_key", "session_token", "aws_secret_access_key"})


@dataclass(frozen=True, slots=True)
class Head:
    """What HEAD points at: a branch (possibly unborn) or a detached version id."""

    branch: str | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {"branch": self.branch} if self.branch else {"version": self.version or ""}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Head:
        if data.get("branch"):
            return cls(branch=str(data["branch"]))
        if data.get("version"):
            return cls(version=str(data["version"]))
        raise BadInputError(f"HEAD must name a branch or a version, got {data!r}", subject="HEAD")


@dataclass
class Workspace:
    """A ``.dataset/`` folder; ``root`` is the project directory that holds it."""

    root: Path
    repo_url: str
    head: Head = field(default_factory=lambda: Head(branch="main"))
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return self.root / WORKSPACE_DIR

    @property
    def index_dir(self) -> Path:
        return self.dir / "ingest-index"

    @classmethod
    def create(
        cls,
        root: str | os.PathLike[str],
        repo_url: str,
        *,
        settings: dict[str, Any] | None = None,
        existing: Workspace | None = None,
    ) -> Workspace:
        """Write a new workspace (or re-point an existing one at ``repo_url``: see
        :meth:`check_repoint`; ``existing`` is what that returned, when the caller ran it)."""
        ws = cls(Path(root).absolute(), repo_url, settings=dict(settings or {}))
        old = existing if existing is not None else cls.check_repoint(root, repo_url)
        if old is not None and normalize_url(old.repo_url) == normalize_url(repo_url):
            ws.head, ws.settings = old.head, {**old.settings, **ws.settings}
        ws.save()
        return ws

    @classmethod
    def check_repoint(cls, root: str | os.PathLike[str], repo_url: str) -> Workspace | None:
        """The workspace in ``root`` (None if there is none), if it may be pointed at
        ``repo_url``; UsageError if it holds staged data of another repository (its
        shards live there: they could never be committed here)."""
        if not (Path(root).absolute() / WORKSPACE_DIR / "config.json").exists():
            return None
        old = cls.load(root)
        if normalize_url(old.repo_url) != normalize_url(repo_url) and old.read_staged():
            raise UsageError(
                f"this workspace has staged data for {old.repo_url}",
                subject=str(old.root),
                hint="commit it there first, or drop it with `dataset reset`",
            )
        return old

    @classmethod
    def load(cls, root: str | os.PathLike[str]) -> Workspace:
        """Read the workspace in ``root``; NotFoundError if there is none."""
        path = Path(root).absolute() / WORKSPACE_DIR / "config.json"
        try:
            data = json.loads(path.read_text("utf-8"))
        except FileNotFoundError as e:
            raise NotFoundError(
                "not a tierdata workspace",
                subject=str(path.parent.parent),
                hint="run `dataset init [URL]` first",
            ) from e
        except json.JSONDecodeError as e:
            raise BadInputError(f"corrupt workspace config: {e.msg}", subject=f"{path}:{e.lineno}") from e
        settings = {k: v for k, v in data.items() if k not in ("repo", "head", "format")}
        return cls(path.parent.parent, data["repo"], Head.from_dict(data.get("head") or {}), settings)

    def save(self) -> None:
        """Write config.json atomically (never with credentials)."""
        data = {
            "format": 1,
            "repo": self.repo_url,
            "head": self.head.to_dict(),
            **_without_secrets(self.settings),
        }
        self.write_json("config.json", data)

    def set_head(self, head: Head) -> None:
        """Point HEAD at a branch or a version and save."""
        self.head = head
        self.save()

    # -- staging ---------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the workspace's lock (``flock`` on ``.dataset/lock``) while the staging area
        is read and rewritten, so concurrent commands neither lose nor repeat an ingest.
        Not reentrant: take it once per operation."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read_staged(self) -> dict[str, Any] | None:
        """Return the staged ingests, or None when nothing is staged."""
        path = self.dir / "staged.json"
        try:
            return json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return None

    def write_staged(self, staged: dict[str, Any] | None) -> None:
        """Replace the staging area (None clears it)."""
        if staged is None:
            (self.dir / "staged.json").unlink(missing_ok=True)
        else:
            # Compact: the C encoder; an indented dump of thousands of shards takes ~0.5 s.
            self.write_json("staged.json", staged, compact=True)

    def write_json(self, name: str, data: Any, *, compact: bool = False) -> None:
        """Write ``.dataset/<name>`` atomically (indented for people unless ``compact``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.dir / name
        tmp = self.dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            layout: dict[str, Any] = {"separators": (",", ":")} if compact else {"indent": 1}
            text = json.dumps(data, sort_keys=True, ensure_ascii=False, **layout)
            tmp.write_text(text + "\n", "utf-8")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def find_workspace(start: str | os.PathLike[str] | None = None) -> Workspace | None:
    """Return the workspace in ``start`` (default: cwd) or its nearest parent, or None."""
    here = Path(start or os.getcwd()).absolute()
    for folder in (here, *here.parents):
        if (folder / WORKSPACE_DIR / "config.json").is_file():
            return Workspace.load(folder)
    return None


def _without_secrets(settings: dict[str, Any]) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for key, value in settings.items():
        if key.lower() in _SECRET_KEYS:
            continue
        clean[key] = _without_secrets(value) if isinstance(value, dict) else value
    return clean
