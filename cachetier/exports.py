"""Package names imported on first use (PEP 562), so importing a package stays light.

The packages ``cachetier``, ``datastore``, ``versioning`` and ``loaders`` list where each
public name lives; a name's module is imported when the name is first read. Reading a
repository or streaming a warm version then loads only what it uses (no pyarrow, say).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, home: Mapping[str, str], names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public ``names`` live in
    the modules ``home`` maps them to; an unknown name raises AttributeError."""
    listed = sorted(names)

    def getattr_(name: str) -> Any:
        try:
            module = home[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        return getattr(importlib.import_module(module), name)

    def dir_() -> list[str]:
        return listed

    return getattr_, dir_
