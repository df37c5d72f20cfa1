"""Reads in place from the SSD and RAM tiers leave no pages mapped in the reader's RSS,
and what was read stays readable (and unchanged) after its pages are dropped."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cachetier.lmdbtier import LmdbTier, SharedEnv
from cachetier.pages import drop_mapping
from cachetier.ramtier import RamTier

VALUE = 8 << 20


def resident(path_part: str) -> int:
    """Bytes of this process's mappings of files whose path contains ``path_part``, in RAM."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=6)
            if "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) > 5 and path_part in head[5]
            elif inside and head[0] == "Rss:":
                total += int(head[1]) * 1024
    return total


def test_an_lmdb_read_in_place_unmaps_the_value_when_done(tmp_path: Path) -> None:
    env = SharedEnv(tmp_path / "env", map_size=64 << 20, budget=32 << 20)
    tier = LmdbTier(env, budget=32 << 20)
    data = os.urandom(VALUE)
    tier.put("v", data)
    seen: list[int] = []

    def use(view: memoryview) -> bytes:
        digest = hashlib.blake2b(view).digest()
        seen.append(resident(str(tmp_path / "env")))
        return digest

    assert tier.read("v", use) == hashlib.blake2b(data).digest()
    assert seen[0] >= VALUE // 2  # reading in place mapped the value's pages...
    assert resident(str(tmp_path / "env")) < 1 << 20  # ...and they are gone once it is read
    assert tier.read_bytes("v") == data
    assert resident(str(tmp_path / "env")) < 1 << 20


def test_a_ram_tier_view_is_checked_without_keeping_its_pages(tmp_path: Path) -> None:
    tier = RamTier(tmp_path / "ram", budget=32 << 20)
    data = os.urandom(VALUE)
    tier.put("v", data)
    view = tier.view("v")
    assert view is not None
    assert resident(str(tmp_path / "ram")) < 1 << 20  # the checksum read every page
    assert bytes(view) == data
    assert resident(str(tmp_path / "ram")) >= VALUE // 2
    drop_mapping(view.obj)
    assert resident(str(tmp_path / "ram")) < 1 << 20
    assert bytes(view) == data  # still the same bytes, paged back in from tmpfs
