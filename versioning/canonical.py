"""The one canonical JSON encoding of everything whose id is a hash of its bytes.

Canonical means: keys sorted, compact separators (``,`` and ``:``), UTF-8 without
``\\u`` escapes for non-ASCII text (``ensure_ascii=False``), no NaN or infinity. Only
JSON values are accepted (``None``, ``bool``, ``int``, finite ``float``, ``str``,
``list``/``tuple`` and ``dict`` with ``str`` keys), so a value that is encoded and
parsed back compares equal to :func:`normalize` of itself: nothing is silently turned
into something else (an ``int`` key into a string, a NaN into ``NaN``).
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

from cachetier.errors import BadInputError

__all__ = ["JSONValue", "canonical_json", "normalize", "parse_json"]

JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def normalize(value: Any, where: str = "value") -> JSONValue:
    """Return a deep copy of ``value`` with tuples as lists; raise BadInputError on non-JSON parts.

    ``where`` names the value in the error (e.g. ``operation.params``), and the path
    inside it is appended, so the message points at the exact bad element.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise BadInputError(f"{where}: {value!r} is not allowed in canonical JSON (finite numbers only)")
        return float(value)
    if isinstance(value, (list, tuple)):
        return [normalize(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadInputError(f"{where}: key {key!r} is not a string")
            out[key] = normalize(item, f"{where}.{key}")
        return out
    raise BadInputError(f"{where}: {value!r} ({type(value).__name__}) is not a JSON value")


def canonical_json(value: Any, where: str = "value") -> bytes:
    """Return the canonical UTF-8 JSON bytes of ``value`` (validated by :func:`normalize`)."""
    text = json.dumps(
        normalize(value, where),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end]
        raise BadInputError(f"{where}: text holds {bad!r}, which is not encodable as UTF-8") from e


def parse_json(data: bytes | str, subject: str) -> Any:
    """Parse JSON bytes; a malformed document raises BadInputError naming ``subject`` and the spot."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
        return json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        raise BadInputError(f"not UTF-8 at byte {e.start}", subject=subject) from e
    except json.JSONDecodeError as e:
        raise BadInputError(
            f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", subject=subject
        ) from e
    except ValueError as e:  # from _reject_constant
        raise BadInputError(str(e), subject=subject) from e


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed in canonical JSON")
