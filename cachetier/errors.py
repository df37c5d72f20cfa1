"""The tierdata error hierarchy, shared by every layer.

::

    TierdataError                       base of everything we raise on purpose
    ├── NotFoundError (FileNotFoundError)   a key, object, ref or path that does not exist
    ├── ConflictError                   a compare-and-swap lost a race (someone moved the ref)
    ├── IntegrityError                  stored bytes do not match their content hash
    ├── BadInputError (ValueError)      malformed user input: a source file, a ref name, a flag
    ├── StoreUnavailableError (OSError) the object store cannot be reached after retries
    └── UsageError (ValueError)         an operation that makes no sense in this state

Every error carries the thing at fault (``subject``: a key, ref, path or ``file:line``)
and, where one helps, a ``hint`` saying what to do. ``str(err)`` is one line that names
both, so the CLI prints it as is. Errors of backends (botocore, minio, fsspec, lmdb,
OSError) are translated where they enter, with ``raise ... from``.
"""

from __future__ import annotations

__all__ = [
    "BadInputError",
    "ConflictError",
    "IntegrityError",
    "NotFoundError",
    "StoreUnavailableError",
    "TierdataError",
    "UsageError",
]


class TierdataError(Exception):
    """Base class: a one-line message, the subject at fault and an optional hint."""

    def __init__(self, message: str, *, subject: str | None = None, hint: str | None = None):
        if subject is None and hint is None:
            message = self._unwrap_worker_message(message)
        self.message = message
        self.subject = subject
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        text = self.message
        if self.subject and self.subject not in text:
            text = f"{self.subject}: {text}"
        if self.hint:
            text = f"{text} ({self.hint})"
        return text.replace("\n", " ")

    def _unwrap_worker_message(self, message: str) -> str:
        """The original one line of an error torch re-raised from a DataLoader worker.

        torch rebuilds a worker's error as ``type(err)(text)``, ``text`` being "Caught X in
        DataLoader worker process N." and the worker's whole traceback, whose last line is
        ``module.X: str(err)``. That line is returned (it names the subject and the hint);
        the traceback is kept as a note, so it still prints with the error. Any other
        message is returned as it is.
        """
        if not (message.startswith("Caught ") and "\nOriginal Traceback" in message):
            return message
        head, sep, original = message.rstrip("\n").rsplit("\n", 1)[-1].partition(": ")
        if not sep or head.rsplit(".", 1)[-1] != type(self).__name__:
            return message
        self.add_note(message)
        return original

    def __reduce__(self) -> tuple:
        # Keep the subject and hint across a pickle (an error raised in another process).
        return (_rebuild, (type(self), self.message, self.subject, self.hint))


def _rebuild(cls: type[TierdataError], message: str, subject: str | None, hint: str | None) -> TierdataError:
    return cls(message, subject=subject, hint=hint)


class NotFoundError(TierdataError, FileNotFoundError):
    """A key, object, ref or path that does not exist."""


class ConflictError(TierdataError):
    """A compare-and-swap lost: the ref moved since it was read."""


class IntegrityError(TierdataError):
    """Bytes read back do not hash to the id they were stored under."""


class BadInputError(TierdataError, ValueError):
    """Malformed input: a source file (with its line), a ref name, a parameter."""


class StoreUnavailableError(TierdataError, OSError):
    """The object store could not be reached, even after retries."""


class UsageError(TierdataError, ValueError):
    """An operation that cannot be done in the current state (e.g. commit with nothing staged)."""
