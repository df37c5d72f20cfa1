"""A store in a local folder: one file per key, written by temp file + atomic rename.

Compare-and-swap holds an ``fcntl`` lock on a per-key lock file under ``.locks/`` while it
reads the current value, checks the token (a hash of the value) and renames the new value
into place, so it is atomic against every process on this host that uses this class
(and on network filesystems whose locks work). Names that begin with ``.`` (temp files,
locks) are never listed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cachetier.errors import BadInputError, ConflictError, NotFoundError, StoreUnavailableError
from cachetier.hashing import content_hash
from cachetier.store import BytesLike, ObjectInfo, Store, Versioned

__all__ = ["LocalStore"]

_TEMP_PREFIX = ".tmp."  # a write in progress: written, then renamed into place


class LocalStore(Store):
    """Keys are relative paths below ``root``; the folder is created on first write."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).expanduser().absolute()
        self.url = self.root.as_uri()

    @property
    def supports_cas(self) -> bool:
        return True

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise BadInputError(f"invalid store key {key!r}", subject=key)
        return self.root.joinpath(*parts)

    def get(self, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        path = self._path(key)
        if byte_range is not None and min(byte_range) < 0:
            raise BadInputError(f"invalid byte range {byte_range!r}", subject=f"{self.url}/{key}")
        try:
            with open(path, "rb") as f:
                if byte_range is None:
                    return f.read()
                start, end = byte_range
                f.seek(start)
                return f.read(max(0, end - start))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            # a folder of other keys, or a path below a value, is not a key either
            raise NotFoundError("no such key", subject=f"{self.url}/{key}") from e

    def put(self, key: str, data: BytesLike) -> None:
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(data)

        self._replace(key, write)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        self._replace(key, lambda tmp: shutil.copyfile(path, tmp))

    def _replace(self, key: str, write: Callable[[Path], object]) -> None:
        """Write a temp file next to ``key``'s path with ``write``, then rename it into place."""
        target = self._path(key)
        tmp = self._temp_path(target)
        try:
            write(tmp)
            os.replace(tmp, target)
        except IsADirectoryError as e:
            tmp.unlink(missing_ok=True)
            raise _folder_clash(key) from e
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get_to_file(self, key: str, path: str | os.PathLike[str]) -> None:
        source = self._path(key)
        if not source.is_file():
            raise NotFoundError("no such key", subject=f"{self.url}/{key}")
        shutil.copyfile(source, path)

    def _temp_path(self, target: Path) -> Path:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as e:
            raise _folder_clash(os.path.relpath(target, self.root)) from e
        except OSError as e:
            raise _translate(e, str(target.parent)) from e
        return target.parent / f"{_TEMP_PREFIX}{os.getpid()}.{uuid.uuid4().hex[:12]}.{target.name}"

    def touch(self, key: str) -> None:
        try:
            os.utime(self._path(key))
        except FileNotFoundError as e:
            raise NotFoundError("no such key", subject=f"{self.url}/{key}") from e

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def info(self, key: str) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise NotFoundError("no such key", subject=f"{self.url}/{key}") from e
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            if self._path(key).is_file():
                raise

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return (info for info in self._files(prefix, temporary=False) if info.key.startswith(prefix))

    def temporaries(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The temp files of writes that never finished (a process killed mid-write), below
        ``prefix``'s folder: ``key`` is their path relative to the root. ``list`` skips them."""
        return self._files(prefix, temporary=True)

    def _files(self, prefix: str, *, temporary: bool) -> Iterator[ObjectInfo]:
        # Walk only the deepest folder that the prefix fixes (the caller filters by the full
        # prefix); hidden folders never, hidden files only as temp files when asked for.
        folder = prefix.rpartition("/")[0]
        base = self.root / folder if folder else self.root
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                wanted = name.startswith(_TEMP_PREFIX) if temporary else not name.startswith(".")
                if not wanted:
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted (or renamed into place) while we listed
                key = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                yield ObjectInfo(key, st.st_size, st.st_mtime)

    def delete_temporary(self, key: str) -> None:
        """Remove a temp file listed by :meth:`temporaries` (gone already is fine)."""
        if not key.rpartition("/")[2].startswith(_TEMP_PREFIX):
            raise ValueError(f"not a temp file: {key!r}")
        (self.root / key).unlink(missing_ok=True)

    def read_versioned(self, key: str) -> Versioned:
        data = self.get(key)
        return Versioned(data, content_hash(data))

    def compare_and_swap(self, key: str, data: BytesLike, expected: str | None) -> str:
        path = self._path(key)
        with self._locked(key):
            try:
                current = content_hash(path.read_bytes())
            except FileNotFoundError:
                current = None
            if current != expected:
                raise ConflictError(
                    "compare-and-swap failed: the value changed since it was read",
                    subject=key,
                )
            self.put(key, data)
        return content_hash(data)

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        lock_path = lock_dir / (key.replace("/", "%") + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _folder_clash(key: str) -> BadInputError:
    return BadInputError(
        "a key cannot also be a folder of other keys in a local store",
        subject=key,
        hint="use keys that are not prefixes of other keys followed by '/'",
    )


def _translate(err: OSError, where: str) -> Exception:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreUnavailableError("no space left on device", subject=where)
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return StoreUnavailableError("permission denied", subject=where)
    return err
