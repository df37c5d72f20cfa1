"""Branches and tags: names for version ids, moved only by compare-and-swap.

A branch lives at ``refs/heads/<name>``, a tag at ``refs/tags/<name>``; each holds one
version id and a newline. Branches move by :meth:`RefStore.set_branch`, which presents
the id the caller last saw, so two writers racing on one branch cannot both win: the
loser gets a :class:`~cachetier.errors.ConflictError` saying so. Tags never move.

Names follow git's rules (``git check-ref-format``): ``/``-separated components that
do not start with ``.`` or end with ``.lock``; no ``..``, ``@{``, spaces, control
characters or any of ``~^:?*[\\``; no leading ``-`` or ``/``, no trailing ``/`` or
``.``. :meth:`RefStore.resolve` turns what a user types (branch, tag, full id, id
prefix of 4+ hex digits, each optionally followed by ``~N``) into a version id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from cachetier.errors import (
    BadInputError,
    ConflictError,
    IntegrityError,
    NotFoundError,
    TierdataError,
    UsageError,
)
from cachetier.hashing import DEFAULT_HASH, is_object_id
from cachetier.store import Store
from versioning.history import VERSIONS_PREFIX, load_version, version_key

__all__ = ["BRANCHES_PREFIX", "MIN_PREFIX", "TAGS_PREFIX", "RefStore", "validate_ref_name"]

BRANCHES_PREFIX = "refs/heads/"
TAGS_PREFIX = "refs/tags/"
#: The shortest id prefix :meth:`RefStore.resolve` accepts.
MIN_PREFIX = 4
_MAX_NAME = 200
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_VERSION_ID = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]+")
_ANCESTRY = re.compile(r"~(\d*)$")
_UNKNOWN_HINT = "list branches with `dataset branch`, history with `dataset log`"


def validate_ref_name(name: str, kind: str = "ref") -> str:
    """Return ``name`` if it is a valid branch/tag name; raise BadInputError quoting it otherwise."""
    problem = _name_problem(name)
    if problem:
        raise BadInputError(
            f"invalid {kind} name {name!r}: {problem}",
            subject=str(name),
            hint="use letters, digits, '-', '_', '.' and '/'-separated parts",
        )
    return name


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return "not a string"
    if not name:
        return "empty"
    if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME:
        return f"longer than {_MAX_NAME} bytes"
    bad = _BAD_CHARS.search(name)
    if bad:
        return f"contains {bad.group()!r}"
    if name.startswith("-"):
        return "starts with '-'"
    if name.startswith("/") or name.endswith("/"):
        return "starts or ends with '/'"
    if name.endswith("."):
        return "ends with '.'"
    if ".." in name:
        return "contains '..'"
    if "@{" in name or name == "@":
        return "contains '@{' or is '@'"
    for part in name.split("/"):
        if not part:
            return "contains '//'"
        if part.startswith("."):
            return f"a part starts with '.' ({part!r})"
        if part.endswith(".lock"):
            return f"a part ends with '.lock' ({part!r})"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid UTF-8 text"
    return None


class RefStore:
    """Read, create, move and resolve refs in a repository ``store``.

    Moving refs needs a store with atomic compare-and-swap (``store.supports_cas``);
    reading and resolving work on any store. ``algorithm`` is the repository's hash,
    used to verify version records read while resolving ``REF~N``.
    """

    def __init__(self, store: Store, *, algorithm: str = DEFAULT_HASH):
        self.store = store
        self.algorithm = algorithm

    # -- branches -----------------------------------------------------------------------

    def get_branch(self, name: str) -> str | None:
        """Return the version id branch ``name`` points at, or None if the branch does not exist."""
        return self._read(BRANCHES_PREFIX + validate_ref_name(name, "branch"))

    def set_branch(self, name: str, new_id: str, expected: str | None) -> None:
        """Point branch ``name`` at ``new_id`` if it still points at ``expected`` (None: absent).

        Raises ConflictError (message says "conflict" and what to do) when the branch
        moved, and NotFoundError when ``new_id`` is not a stored version.
        """
        key = BRANCHES_PREFIX + validate_ref_name(name, "branch")
        self._require_version(new_id)
        self._require_cas()
        token: str | None = None
        if expected is not None:
            try:
                current = self.store.read_versioned(key)
            except NotFoundError:
                raise self._moved(name, expected, None) from None
            actual = self._parse(current.data, key)
            if actual != expected:
                raise self._moved(name, expected, actual)
            token = current.token
        try:
            self.store.compare_and_swap(key, _encode(new_id), token)
        except ConflictError as e:
            raise self._moved(name, expected, self._read(key)) from e

    def create_branch(self, name: str, version_id: str) -> None:
        """Create branch ``name`` at ``version_id``; UsageError if it exists (or clashes with one,
        or with a tag: see :meth:`_check_unambiguous`)."""
        validate_ref_name(name, "branch")
        self._check_unambiguous(name, "branch")
        self._check_path_clash(BRANCHES_PREFIX, name, "branch")
        try:
            self.set_branch(name, version_id, None)
        except ConflictError:
            raise UsageError(
                "branch already exists", subject=f"branch {name!r}", hint="pick another name"
            ) from None

    def delete_branch(self, name: str) -> str:
        """Delete branch ``name`` and return the id it pointed at; NotFoundError if absent."""
        key = BRANCHES_PREFIX + validate_ref_name(name, "branch")
        current = self._read(key)
        if current is None:
            raise NotFoundError("no such branch", subject=f"branch {name!r}")
        self.store.delete(key)
        return current

    def list_branches(self) -> dict[str, str]:
        """Return ``{branch name: version id}`` sorted by name."""
        return self._list(BRANCHES_PREFIX)

    # -- tags ---------------------------------------------------------------------------

    def get_tag(self, name: str) -> str | None:
        """Return the version id of tag ``name``, or None if there is no such tag."""
        return self._read(TAGS_PREFIX + validate_ref_name(name, "tag"))

    def create_tag(self, name: str, version_id: str) -> None:
        """Create tag ``name`` at ``version_id``; tags never move, so an existing one is a UsageError."""
        key = TAGS_PREFIX + validate_ref_name(name, "tag")
        self._check_unambiguous(name, "tag")
        self._check_path_clash(TAGS_PREFIX, name, "tag")
        self._require_version(version_id)
        self._require_cas()
        try:
            self.store.compare_and_swap(key, _encode(version_id), None)
        except ConflictError:
            raise UsageError(
                f"tag already exists at {self._read(key)}",
                subject=f"tag {name!r}",
                hint="tags never move; pick another name",
            ) from None

    def _check_unambiguous(self, name: str, kind: str) -> None:
        """Refuse a new ref name that would resolve two ways: ``HEAD``, a whole version id,
        or the name of a ref of the other kind (branches win over tags, so either would
        hide the other)."""
        if name == "HEAD" or _VERSION_ID.fullmatch(name):
            what = "HEAD" if name == "HEAD" else "a version id"
            raise UsageError(
                f"{kind} name {name!r} is {what}, which refs already name",
                subject=name,
                hint="pick another name",
            )
        other, prefix = ("tag", TAGS_PREFIX) if kind == "branch" else ("branch", BRANCHES_PREFIX)
        if self._read(prefix + name) is not None:
            raise UsageError(
                f"a {other} named {name!r} exists: a {kind} of that name would make {name!r} ambiguous",
                subject=name,
                hint="pick another name",
            )

    def list_tags(self) -> dict[str, str]:
        """Return ``{tag name: version id}`` sorted by name."""
        return self._list(TAGS_PREFIX)

    # -- resolving ----------------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        """Return the version id ``ref`` names: a branch, a tag, an id or id prefix, then ``~N``.

        Branches win over tags, tags over id prefixes. ``REF~N`` follows first parents N
        times (``REF~`` is ``REF~1``). Unknown refs raise NotFoundError naming ``ref``; a
        prefix that several versions share raises BadInputError listing some of them.
        """
        if not isinstance(ref, str) or not ref:
            raise BadInputError(f"empty or invalid ref {ref!r}", subject=str(ref))
        base, steps = _split_ancestry(ref)
        version_id = self._resolve_base(base, ref)
        for step in range(steps):
            parents = load_version(self.store, version_id, algorithm=self.algorithm).parents
            if not parents:
                raise NotFoundError(
                    f"version {version_id[:12]} has no parent (history ends {step} step(s) back)",
                    subject=ref,
                )
            version_id = parents[0]
        return version_id

    def _resolve_base(self, base: str, ref: str) -> str:
        validate_ref_name(base, "ref")
        for prefix in (BRANCHES_PREFIX, TAGS_PREFIX):
            found = self._read(prefix + base)
            if found is not None:
                return found
        if _HEX.fullmatch(base) and len(base) >= MIN_PREFIX:
            return self._resolve_prefix(base, ref)
        hint = _UNKNOWN_HINT
        if _HEX.fullmatch(base):
            hint = f"an id prefix needs at least {MIN_PREFIX} hex digits"
        raise _unknown(ref, hint)

    def _resolve_prefix(self, prefix: str, ref: str) -> str:
        if is_object_id(prefix):
            if self.store.exists(version_key(prefix)):
                return prefix
            raise NotFoundError("no such version", subject=ref)
        matches = sorted(
            info.key[len(VERSIONS_PREFIX) :] for info in self.store.list(VERSIONS_PREFIX + prefix)
        )
        matches = [m for m in matches if is_object_id(m)]
        if not matches:
            raise _unknown(ref, _UNKNOWN_HINT)
        if len(matches) > 1:
            shown = ", ".join(m[:12] for m in matches[:5])
            raise BadInputError(
                f"ambiguous version prefix {prefix!r}: {len(matches)} versions match ({shown}…)",
                subject=ref,
                hint="type more digits of the id",
            )
        return matches[0]

    # -- helpers ------------------------------------------------------------------------

    def _read(self, key: str) -> str | None:
        try:
            data = self.store.get(key)
        except NotFoundError:
            return None
        return self._parse(data, key)

    def _parse(self, data: bytes, key: str) -> str:
        text = data.decode("ascii", "replace").strip()
        if not is_object_id(text):
            raise IntegrityError(f"ref does not hold a version id: {text[:80]!r}", subject=key)
        return text

    def scan(self) -> tuple[dict[str, str], list[tuple[str, TierdataError]]]:
        """Every branch and tag as ``{store key: version id}``, and each ref that cannot be
        read (a ref file that does not hold a version id) with its error; never raises for one."""
        found: dict[str, str] = {}
        bad: list[tuple[str, TierdataError]] = []
        for prefix in (BRANCHES_PREFIX, TAGS_PREFIX):
            for name in sorted(self._iter_names(prefix)):
                key = prefix + name
                try:
                    version = self._read(key)
                except TierdataError as e:
                    bad.append((key, e))
                    continue
                if version is not None:  # deleted while we listed
                    found[key] = version
        return found, bad

    def _list(self, prefix: str) -> dict[str, str]:
        names = sorted(info.key[len(prefix) :] for info in self.store.list(prefix))
        refs = {}
        for name in names:
            if _name_problem(name) is None:
                found = self._read(prefix + name)
                if found is not None:  # deleted while we listed
                    refs[name] = found
        return refs

    def _iter_names(self, prefix: str) -> Iterator[str]:
        for info in self.store.list(prefix):
            yield info.key[len(prefix) :]

    def _check_path_clash(self, prefix: str, name: str, kind: str) -> None:
        # 'a' and 'a/b' cannot both exist: one would be a file, the other a folder.
        parts = name.split("/")
        ancestors = {"/".join(parts[:i]) for i in range(1, len(parts))}
        for other in self._iter_names(prefix):
            if other in ancestors or other.startswith(name + "/"):
                raise UsageError(
                    f"{kind} name {name!r} clashes with existing {kind} {other!r}",
                    subject=name,
                    hint=f"a {kind} cannot be both a name and a folder of names",
                )

    def _require_version(self, version_id: str) -> None:
        if not isinstance(version_id, str) or not is_object_id(version_id):
            raise BadInputError(f"not a version id: {version_id!r}", subject=str(version_id))
        if not self.store.exists(version_key(version_id)):
            raise NotFoundError("no such version", subject=f"version {version_id}")

    def _require_cas(self) -> None:
        if not self.store.supports_cas:
            raise UsageError(
                "this store cannot compare-and-swap, so refs cannot be moved safely",
                subject=self.store.url,
                hint="use a local path or an S3 store with conditional writes",
            )

    @staticmethod
    def _moved(name: str, expected: str | None, actual: str | None) -> ConflictError:
        was = expected[:12] if expected else "absent"
        now = actual[:12] if actual else "absent"
        return ConflictError(
            f"conflict: branch {name!r} moved (expected {was}, now {now}); another writer got there first",
            subject=f"branch {name!r}",
            hint=f"re-read the branch (`dataset log {name}`) and retry your operation on the new head",
        )


def _split_ancestry(ref: str) -> tuple[str, int]:
    """Split ``main~2~1`` into ``("main", 3)``."""
    steps = 0
    base = ref
    while True:
        match = _ANCESTRY.search(base)
        if not match:
            return base, steps
        steps += int(match.group(1)) if match.group(1) else 1
        base = base[: match.start()]
        if not base:
            raise BadInputError(f"ref {ref!r} has nothing before '~'", subject=ref)


def _unknown(ref: str, hint: str) -> NotFoundError:
    return NotFoundError(
        f"unknown ref {ref!r}: no branch, tag or version by that name", subject=ref, hint=hint
    )


def _encode(version_id: str) -> bytes:
    return f"{version_id}\n".encode("ascii")
