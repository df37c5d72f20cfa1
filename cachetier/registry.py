"""Open a store from a URL, choosing the backend by scheme and importing it lazily.

``./path``, ``/abs/path`` and ``file:///abs/path`` open a :class:`LocalStore`;
``s3://bucket/prefix`` opens an :class:`~cachetier.s3store.S3Store`. Backends are
imported only when their scheme is used, with an install hint when one is missing.
"""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import unquote, urlparse

from cachetier.errors import BadInputError
from cachetier.store import Store

__all__ = ["normalize_url", "open_store"]

_BACKENDS: dict[str, tuple[str, str, str]] = {
    "file": ("cachetier.localstore", "LocalStore", "tierdata"),
    "s3": ("cachetier.s3store", "S3Store", "minio"),
}


def normalize_url(url: str) -> str:
    """Return ``url`` with a scheme: plain paths become absolute ``file://`` URLs, with
    ``.`` and ``..`` taken out (so each spelling of a folder names one repository)."""
    import os
    from pathlib import Path

    if "://" not in url:
        return Path(os.path.abspath(os.path.expanduser(url))).as_uri()
    if url.startswith("file://"):
        from urllib.request import url2pathname

        return Path(os.path.abspath(url2pathname(urlparse(url).path))).as_uri()
    return url


def open_store(url: str, **options: Any) -> Store:
    """Open the store at ``url``; ``options`` go to the backend (e.g. S3 endpoint, keys)."""
    url = normalize_url(url)
    parsed = urlparse(url)
    try:
        module_name, class_name, package = _BACKENDS[parsed.scheme]
    except KeyError:
        known = ", ".join(sorted(_BACKENDS))
        raise BadInputError(
            f"unsupported URL scheme {parsed.scheme!r} (known: {known})", subject=url
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"{url}: the {parsed.scheme}:// backend needs {package!r}: pip install {package}"
        ) from e
    cls = getattr(module, class_name)
    if parsed.scheme == "file":
        return cls(unquote(parsed.path), **options)
    return cls.from_url(url, **options)
