"""Cache configuration: one small keyword-only object, read in one explicit function.

:class:`CacheConfig` says where the tiers live and how big they are. Nothing is read at
import time: :func:`load_cache_config` merges, lowest priority first, the defaults, the
``cache`` table of the workspace config (a dict the caller read), the environment
(``TIERDATA_CACHE_DIR``, ``TIERDATA_CACHE_RAM_BYTES``, ``TIERDATA_CACHE_SSD_BYTES``) and
explicit overrides (CLI flags; ``None`` means "not given"). Sizes accept integers or
strings such as ``"512MiB"``, ``"20G"`` or ``"1.5GiB"``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cachetier.errors import BadInputError
from cachetier.ramowner import default_name_prefix

__all__ = ["ENV_DIR", "ENV_RAM_BYTES", "ENV_SSD_BYTES", "CacheConfig", "load_cache_config", "parse_size"]

ENV_DIR = "TIERDATA_CACHE_DIR"
ENV_RAM_BYTES = "TIERDATA_CACHE_RAM_BYTES"
ENV_SSD_BYTES = "TIERDATA_CACHE_SSD_BYTES"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2,
    "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_VERIFY = ("checksum", "hash", "none")


def parse_size(value: int | str, *, name: str = "size") -> int:
    """Return ``value`` as a byte count (``"4GiB"`` → 4294967296); raise BadInputError."""
    if isinstance(value, bool):
        raise BadInputError(f"{name}: expected a byte size, got {value!r}", subject=name)
    if isinstance(value, int):
        if value < 0:
            raise BadInputError(f"{name}: a size cannot be negative ({value})", subject=name)
        return value
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise BadInputError(
            f"{name}: cannot read {value!r} as a byte size",
            subject=name,
            hint="use e.g. 1048576, 512MiB, 20G",
        )
    size = float(match.group(1)) * _UNITS[unit]
    if not size < 1 << 63:  # also inf, from a number with hundreds of digits
        raise BadInputError(f"{name}: {value!r} is too large a byte size", subject=name)
    return int(size)


def _default_dir(xdg_cache_home: str | None = None) -> Path:
    base = Path(xdg_cache_home) if xdg_cache_home else Path.home() / ".cache"
    return base / "tierdata"


@dataclass(frozen=True, kw_only=True, slots=True)
class CacheConfig:
    """Where the node cache lives and how it behaves.

    - ``dir``: the SSD tier's folder (an LMDB environment is created in ``dir/lmdb``).
    - ``ram_bytes`` / ``ssd_bytes``: byte budgets; 0 turns a tier off.
    - ``ram_dir``: the RAM tier's folder, by default ``/dev/shm/tierdata-<uid>-<hash of dir>``
      (``dir/ram`` where there is no ``/dev/shm``).
    - ``policy``: a name from :func:`cachetier.policy.available_policies`.
    - ``verify``: what a read from a cache tier checks: ``checksum`` (XXH3 of the frame,
      default), ``hash`` (also the content hash against the object id) or ``none``.
    - ``prefetch_depth`` / ``prefetch_workers``: how many announced objects to fetch
      ahead of each reader, with how many threads (0 turns prefetch off). The threads
      are per process, and each fill in flight holds the fetched object, its decoding
      and the copy for the RAM tier: with two DataLoader workers on two cores, 4
      threads each peaked about 140 MB higher than 2 for no measurable throughput.
    - ``fetch_retries`` / ``retry_backoff``: object-store attempts, and the first pause
      between them in seconds (doubling).
    - ``map_headroom``: the LMDB map is ``ssd_bytes × (1 + map_headroom)``, fixed at creation.
    """

    dir: Path = dataclasses.field(default_factory=_default_dir)
    ram_bytes: int = 512 << 20
    ssd_bytes: int = 20 << 30
    ram_dir: Path | None = None
    policy: str = "freq-hint"
    verify: str = "checksum"
    prefetch_depth: int = 4
    prefetch_workers: int = 2
    fetch_retries: int = 4
    retry_backoff: float = 0.2
    map_headroom: float = 0.1

    def __post_init__(self) -> None:
        # Resolved, so every spelling of one folder (relative, "..", a symlink) names one
        # cache, and one default RAM tier (named after the folder).
        object.__setattr__(self, "dir", Path(self.dir).expanduser().resolve())
        if self.ram_dir is not None:
            object.__setattr__(self, "ram_dir", Path(self.ram_dir).expanduser().resolve())
        for name in ("ram_bytes", "ssd_bytes"):
            object.__setattr__(self, name, parse_size(getattr(self, name), name=name))
        if self.verify not in _VERIFY:
            raise BadInputError(
                f"verify={self.verify!r}: expected one of {', '.join(_VERIFY)}", subject="verify"
            )
        for name in ("prefetch_depth", "prefetch_workers", "fetch_retries"):
            if getattr(self, name) < 0:
                raise BadInputError(f"{name}={getattr(self, name)} must be >= 0", subject=name)
        if not 0 <= self.map_headroom <= 1:
            raise BadInputError(
                f"map_headroom={self.map_headroom} must be within [0, 1]", subject="map_headroom"
            )

    @property
    def lmdb_dir(self) -> Path:
        """The LMDB environment's folder."""
        return self.dir / "lmdb"

    @property
    def resolved_ram_dir(self) -> Path:
        """The RAM tier's folder (``ram_dir``, or the default derived from ``dir``)."""
        if self.ram_dir is not None:
            return self.ram_dir
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            tag = hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
            return shm / f"{default_name_prefix()}{tag}"
        return self.dir / "ram"

    def replace(self, **changes: Any) -> CacheConfig:
        """Return a copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (paths as strings)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["dir"] = str(self.dir)
        out["ram_dir"] = str(self.resolved_ram_dir)
        return out


def load_cache_config(
    workspace: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> CacheConfig:
    """Build the cache config from the workspace's ``cache`` dict, the environment and overrides.

    Priority, highest first: ``overrides`` whose value is not None (e.g. CLI flags
    ``dir=``, ``ram_bytes=``, ``ssd_bytes=``), then ``environ`` (default ``os.environ``),
    then ``workspace``, then the defaults (``dir``: ``$XDG_CACHE_HOME/tierdata`` or
    ``~/.cache/tierdata``). Unknown keys raise BadInputError naming them.
    """
    known = {f.name for f in dataclasses.fields(CacheConfig)}
    values: dict[str, Any] = {}
    for key, value in (workspace or {}).items():
        if key not in known:
            raise BadInputError(
                f"unknown cache setting {key!r} in the workspace config",
                subject=key,
                hint=f"known: {sorted(known)}",
            )
        values[key] = value
    env = os.environ if environ is None else environ
    if env.get("XDG_CACHE_HOME") and "dir" not in values:
        values["dir"] = _default_dir(env["XDG_CACHE_HOME"])
    for var, key in ((ENV_DIR, "dir"), (ENV_RAM_BYTES, "ram_bytes"), (ENV_SSD_BYTES, "ssd_bytes")):
        if env.get(var):
            values[key] = parse_size(env[var], name=var) if key != "dir" else env[var]
    for key, value in overrides.items():
        if key not in known:
            raise BadInputError(f"unknown cache setting {key!r}", subject=key, hint=f"known: {sorted(known)}")
        if value is not None:
            values[key] = value
    return CacheConfig(**values)
