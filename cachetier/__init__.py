"""Byte stores by key: the object-store tier (a local folder or ``s3://``), the LMDB (SSD)
and RAM tiers, and :class:`TieredStore`, the read path that places objects across them by
access frequency and announced future reads.

Names are imported on first use (PEP 562), so importing one module stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachetier.exports import lazy_exports

if TYPE_CHECKING:
    from cachetier.config import CacheConfig, load_cache_config, parse_size
    from cachetier.daemon import serve
    from cachetier.errors import (
        BadInputError,
        ConflictError,
        IntegrityError,
        NotFoundError,
        StoreUnavailableError,
        TierdataError,
        UsageError,
    )
    from cachetier.hashing import content_hash
    from cachetier.localstore import LocalStore
    from cachetier.objects import ObjectStore
    from cachetier.policy import PlacementPolicy, available_policies, get_policy, register_policy
    from cachetier.registry import open_store
    from cachetier.store import ObjectInfo, Store, Versioned
    from cachetier.tiered import TieredStore

_HOME = {
    "CacheConfig": "cachetier.config",
    "load_cache_config": "cachetier.config",
    "parse_size": "cachetier.config",
    "TierdataError": "cachetier.errors",
    "NotFoundError": "cachetier.errors",
    "ConflictError": "cachetier.errors",
    "IntegrityError": "cachetier.errors",
    "BadInputError": "cachetier.errors",
    "StoreUnavailableError": "cachetier.errors",
    "UsageError": "cachetier.errors",
    "content_hash": "cachetier.hashing",
    "LocalStore": "cachetier.localstore",
    "ObjectStore": "cachetier.objects",
    "PlacementPolicy": "cachetier.policy",
    "available_policies": "cachetier.policy",
    "get_policy": "cachetier.policy",
    "register_policy": "cachetier.policy",
    "open_store": "cachetier.registry",
    "ObjectInfo": "cachetier.store",
    "Store": "cachetier.store",
    "Versioned": "cachetier.store",
    "TieredStore": "cachetier.tiered",
    "serve": "cachetier.daemon",
}

__all__ = [
    "BadInputError",
    "CacheConfig",
    "ConflictError",
    "IntegrityError",
    "LocalStore",
    "NotFoundError",
    "ObjectInfo",
    "ObjectStore",
    "PlacementPolicy",
    "Store",
    "StoreUnavailableError",
    "TierdataError",
    "TieredStore",
    "UsageError",
    "Versioned",
    "available_policies",
    "content_hash",
    "get_policy",
    "load_cache_config",
    "open_store",
    "parse_size",
    "register_policy",
    "serve",
]


__getattr__, __dir__ = lazy_exports(__name__, _HOME, __all__)
