"""Default RAM tier folders of deleted caches are removed; nothing in use is touched."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cachetier.config import CacheConfig
from cachetier.errors import StoreUnavailableError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from cachetier.ramowner import OWNER_FILE, default_name_prefix, remove_owned_under, sweep_orphans
from cachetier.ramtier import RamTier
from cachetier.tiered import TieredStore

REPO_ROOT = Path(__file__).resolve().parents[2]


def _default_tier(parent: Path, name: str, owner: Path) -> RamTier:
    tier = RamTier(parent / f"{default_name_prefix()}{name}", budget=1 << 20, owner=owner)
    tier.put("k", b"value")
    return tier


def test_opening_a_default_tier_removes_those_whose_cache_is_gone(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    gone, alive = tmp_path / "cache-gone", tmp_path / "cache-alive"
    old = _default_tier(shm, "old", gone)
    kept = _default_tier(shm, "kept", alive)
    assert (old.root / OWNER_FILE).read_text() == str(gone)
    assert gone.is_dir()  # a RAM-only cache still makes its folder, so it is not taken for gone
    legacy = shm / f"{default_name_prefix()}legacy"  # no owner record (an older version's)
    (legacy / "v").mkdir(parents=True)
    chosen = shm / "my-ram"  # a ram_dir the user chose: never a default folder
    RamTier(chosen, budget=1 << 20).put("k", b"v")
    shutil.rmtree(gone)

    _default_tier(shm, "new", tmp_path / "cache-new")

    assert not old.root.exists()
    assert kept.get("k") == b"value" and legacy.is_dir() and chosen.is_dir()


def test_a_folder_being_admitted_into_is_left_alone(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    gone = tmp_path / "cache-gone"
    busy = _default_tier(shm, "busy", gone)
    shutil.rmtree(gone)
    # Another process holds the tier's admission lock, as during a put.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import fcntl, os, sys
                fd = os.open({str(busy.root / ".lock")!r}, os.O_RDWR)
                fcntl.lockf(fd, fcntl.LOCK_EX)
                print("locked", flush=True)
                sys.stdin.read()
            """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert sweep_orphans(shm) == []
        assert busy.get("k") == b"value"
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert sweep_orphans(shm) == [busy.root]
    assert not busy.root.exists()


def test_a_reader_keeps_its_view_of_a_removed_folder(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    gone = tmp_path / "cache-gone"
    tier = _default_tier(shm, "read", gone)
    view = tier.view("k")
    shutil.rmtree(gone)
    assert sweep_orphans(shm) == [tier.root]
    assert bytes(view) == b"value"


def test_remove_owned_under_takes_only_folders_of_caches_below_the_root(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    inside = _default_tier(shm, "inside", tmp_path / "session" / "t1" / "cache")
    outside = _default_tier(shm, "outside", tmp_path / "elsewhere" / "cache")
    assert remove_owned_under(shm, tmp_path / "session") == [inside.root]
    assert outside.root.is_dir()


def test_a_deleted_cache_folder_leaves_nothing_in_dev_shm(tmp_path: Path) -> None:
    # The real default: the RAM tier in /dev/shm, named after the cache folder.
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    oid = objects.put(b"some shard bytes" * 100)
    first = CacheConfig(dir=tmp_path / "cache-1", ssd_bytes=0)
    second = CacheConfig(dir=tmp_path / "cache-2", ssd_bytes=0)
    try:
        with TieredStore(objects, first) as cache:
            assert bytes(cache.read(oid)) == b"some shard bytes" * 100
        assert first.resolved_ram_dir.is_dir()
        shutil.rmtree(first.dir)
        with TieredStore(objects, second) as cache:
            cache.read(oid)
        assert not first.resolved_ram_dir.exists()
        assert second.resolved_ram_dir.is_dir()
    finally:
        for config in (first, second):
            shutil.rmtree(config.resolved_ram_dir, ignore_errors=True)


def test_an_owner_that_cannot_be_made_leaves_no_folder_behind(tmp_path: Path) -> None:
    # An unclaimed folder would never be swept: it would hold tmpfs until the node restarts.
    shm = tmp_path / "shm"
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")  # the cache folder cannot be made below a file
    tier = RamTier(shm / f"{default_name_prefix()}ro", budget=1 << 20, owner=blocked / "cache")
    with pytest.raises(StoreUnavailableError):
        tier.put("k", b"value")
    assert not tier.root.exists()


def test_a_cache_folder_that_cannot_be_made_uses_no_default_ram_tier(tmp_path: Path) -> None:
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    oid = objects.put(b"shard" * 1000)
    (tmp_path / "afile").write_text("")
    config = CacheConfig(dir=tmp_path / "afile" / "cache")
    try:
        with TieredStore(objects, config) as cache:
            for _ in range(3):
                assert bytes(cache.read(oid)) == b"shard" * 1000  # read through
            assert {"ram", "ssd"} <= set(cache.stats()["degraded"])
        # At most the node's empty fill-lock file is there (it lives beside the RAM tier).
        left = (
            {p.name for p in config.resolved_ram_dir.iterdir()} if config.resolved_ram_dir.exists() else set()
        )
        assert left <= {"flight.lock"}, left
    finally:
        shutil.rmtree(config.resolved_ram_dir, ignore_errors=True)
