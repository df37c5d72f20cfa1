"""Version records: what one version (commit) of a dataset is, as a frozen value.

A :class:`VersionRecord` names its parents, its shard table (``data_hash``, the id of the
table object: equal data ⇒ equal data hash), the schema, counts, who made it, when and
how (``operation``). Its canonical JSON (see :mod:`versioning.canonical`) is what gets
stored at ``versions/<id>``; the id is the content hash of exactly those bytes, so a
record cannot change without changing its id.

The dict form carries ``format`` (:data:`FORMAT_VERSION`); a record of a newer format
is refused with a hint to upgrade rather than half-read. Every parse error quotes the
field and the bad value.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cachetier.errors import BadInputError
from cachetier.hashing import DEFAULT_HASH, content_hash, is_object_id
from versioning.canonical import canonical_json, normalize, parse_json

__all__ = [
    "FORMAT_VERSION",
    "VersionRecord",
    "format_timestamp",
    "make_operation",
    "parse_timestamp",
    "utc_now",
]

#: The format of the dict/JSON form written by this code.
FORMAT_VERSION = 1

_FIELDS = (
    "format",
    "parents",
    "data_hash",
    "schema",
    "records",
    "shards",
    "bytes",
    "message",
    "author",
    "created",
    "operation",
)


@dataclass(frozen=True)
class VersionRecord:
    """One immutable version. Construction validates every field (BadInputError quoting it).

    ``schema`` and ``operation`` are deep-copied into plain JSON values (tuples become
    lists); treat them as read-only. ``operation`` holds at least ``op`` (a name such as
    ``ingest``/``append``/``replace``/``dedup``) and may hold ``params``, ``sources`` and
    ``audit`` (an object id or None) — see :func:`make_operation`.
    """

    parents: tuple[str, ...]
    data_hash: str
    schema: dict[str, Any]
    records: int
    shards: int
    bytes: int
    message: str
    author: str
    created: str
    operation: dict[str, Any]
    format: int = field(default=FORMAT_VERSION)

    def __post_init__(self) -> None:
        if self.format != FORMAT_VERSION:
            _check_format(self.format)
        if isinstance(self.parents, str) or not isinstance(self.parents, (tuple, list)):
            raise BadInputError(f"'parents' must be a list of version ids, got {self.parents!r}")
        parents = tuple(self.parents)
        for parent in parents:
            _check_id(parent, "parents")
        if len(set(parents)) != len(parents):
            raise BadInputError(f"'parents' lists a version twice: {list(parents)!r}")
        object.__setattr__(self, "parents", parents)
        _check_id(self.data_hash, "data_hash")
        for name in ("records", "shards", "bytes"):
            _check_count(getattr(self, name), name)
        for name in ("message", "author"):
            if not isinstance(getattr(self, name), str):
                raise BadInputError(f"'{name}' must be a string, got {getattr(self, name)!r}")
        parse_timestamp(self.created)
        object.__setattr__(self, "schema", _json_dict(self.schema, "schema"))
        object.__setattr__(self, "operation", _check_operation(self.operation))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-able dict form (with ``format``); :meth:`from_dict` inverts it."""
        return {
            "format": self.format,
            "parents": list(self.parents),
            "data_hash": self.data_hash,
            "schema": normalize(self.schema),
            "records": self.records,
            "shards": self.shards,
            "bytes": self.bytes,
            "message": self.message,
            "author": self.author,
            "created": self.created,
            "operation": normalize(self.operation),
        }

    @classmethod
    def from_dict(cls, data: Any, subject: str = "version record") -> VersionRecord:
        """Parse the dict form; BadInputError (naming ``subject``) quotes a missing/bad field."""
        if not isinstance(data, dict):
            raise BadInputError(f"expected a JSON object, got {data!r:.80}", subject=subject)
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise BadInputError(f"unknown field(s) {unknown!r}", subject=subject)
        missing = [name for name in _FIELDS if name not in data]
        if missing:
            raise BadInputError(f"missing field(s) {missing!r}", subject=subject)
        try:
            _check_format(data["format"])
            return cls(**data)
        except BadInputError as e:
            raise BadInputError(e.message, subject=subject, hint=e.hint) from e

    def encode(self) -> builtins.bytes:
        """Return the canonical JSON bytes that are stored and hashed."""
        return canonical_json(self.to_dict(), "version record")

    @classmethod
    def decode(cls, data: builtins.bytes, subject: str = "version record") -> VersionRecord:
        """Parse canonical JSON bytes (any valid JSON is accepted; the id check is the caller's)."""
        return cls.from_dict(parse_json(data, subject), subject)

    def version_id(self, algorithm: str = DEFAULT_HASH) -> str:
        """Return the id of this record: the content hash of :meth:`encode`."""
        return content_hash(self.encode(), algorithm)


def make_operation(
    op: str,
    *,
    params: dict[str, Any] | None = None,
    sources: list[Any] | None = None,
    audit: str | None = None,
) -> dict[str, Any]:
    """Build an ``operation`` dict: the op name, its parameters, source provenance, audit object."""
    return _check_operation({"op": op, "params": params or {}, "sources": sources or [], "audit": audit})


def utc_now() -> str:
    """Return the current time as an ISO 8601 UTC string (``2024-05-01T12:00:00.000000Z``)."""
    return format_timestamp(datetime.now(UTC))


def format_timestamp(moment: datetime) -> str:
    """Return ``moment`` (timezone-aware) as an ISO 8601 UTC string with microseconds and ``Z``."""
    if moment.tzinfo is None:
        raise BadInputError(f"timestamp {moment!r} has no timezone")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(text: Any) -> datetime:
    """Parse an ISO 8601 UTC timestamp (``Z`` or ``+00:00``); BadInputError quotes a bad one."""
    if not isinstance(text, str):
        raise BadInputError(f"'created' must be an ISO 8601 UTC string, got {text!r}")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadInputError(f"'created' is not an ISO 8601 timestamp: {text!r}") from None
    if moment.tzinfo is None or moment.utcoffset().total_seconds() != 0:
        raise BadInputError(f"'created' must be in UTC (end in 'Z'), got {text!r}")
    return moment


def _check_format(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"'format' must be a positive integer, got {value!r}")
    if value > FORMAT_VERSION:
        raise BadInputError(
            f"version record format {value} is newer than this tierdata reads ({FORMAT_VERSION})",
            hint="upgrade tierdata",
        )


def _check_id(value: Any, name: str) -> None:
    if not isinstance(value, str) or not is_object_id(value):
        raise BadInputError(f"'{name}' must be a 64-digit lowercase hex id, got {value!r}")


def _check_count(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInputError(f"'{name}' must be a non-negative integer, got {value!r}")


def _json_dict(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadInputError(f"'{name}' must be a JSON object, got {value!r:.80}")
    return normalize(value, name)  # type: ignore[return-value]


def _check_operation(value: Any) -> dict[str, Any]:
    operation = _json_dict(value, "operation")
    op = operation.get("op")
    if not isinstance(op, str) or not op:
        raise BadInputError(f"'operation.op' must be a non-empty string, got {op!r}")
    audit = operation.get("audit")
    if audit is not None:
        _check_id(audit, "operation.audit")
    return operation
