"""Reads in place from the SSD and RAM tiers leave no pages mapped in the reader's RSS,
and what was read stays readable (and unchanged) after its pages are dropped; ranges
copied out of a RAM-tier mapping with ``pread`` map nothing."""

from __future__ import annotations

import gc
import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from cachetier._frame import _STEP, frame_header, open_frame
from cachetier.lmdbtier import LmdbTier, SharedEnv
from cachetier.pages import FileMapping, drop_mapping, drop_view, mapped_range
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
    data = os.urandom(VALUE)
    RamTier(tmp_path / "ram", budget=32 << 20).put("v", data)
    tier = RamTier(tmp_path / "ram", budget=32 << 20)  # another reader: it checks the value
    view = tier.view("v")
    assert view is not None
    assert resident(str(tmp_path / "ram")) < 1 << 20  # the checksum read every page
    assert bytes(view) == data
    assert resident(str(tmp_path / "ram")) >= VALUE // 2
    drop_mapping(view.obj)
    assert resident(str(tmp_path / "ram")) < 1 << 20
    assert bytes(view) == data  # still the same bytes, paged back in from tmpfs


def test_checking_a_mapped_frame_holds_one_step_of_its_pages_at_a_time(shm_dir: Path) -> None:
    payload = os.urandom(4 * _STEP + 12345)
    shm_dir.mkdir()
    path = shm_dir / "frame"  # tmpfs, as the RAM tier
    path.write_bytes(frame_header(payload) + payload)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    held: list[int] = []

    def release(step: memoryview) -> None:
        held.append(resident(str(path)))
        drop_view(step)

    view = open_frame(mapping, release=release)
    # the steps end on the frame's pages, so none is shared by two steps and kept by both:
    # what stays mapped is the header's page and the last, partial one
    assert resident(str(path)) <= 2 * mmap.PAGESIZE
    assert view is not None and bytes(view) == payload
    assert len(held) == 5
    # one step at a time (the kernel may map a whole large folio around a fault), not the value
    assert max(held) <= _STEP + (2 << 20) + 4 * mmap.PAGESIZE, held
    damaged = bytearray(frame_header(payload) + payload)
    damaged[-1] ^= 1
    assert open_frame(damaged, release=lambda step: None) is None


def _opened(fd: int, path: Path) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == str(path)
    except OSError:
        return False


def test_a_file_mapping_copies_ranges_out_without_mapping_them(shm_dir: Path) -> None:
    shm_dir.mkdir()
    path = shm_dir / "value"  # tmpfs, as the RAM tier
    data = os.urandom(VALUE)
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapping = FileMapping.open(f.fileno(), VALUE)
    assert _opened(mapping.fd, path)  # a file of its own: the caller's is closed
    out = bytearray(VALUE - 4097)
    mapping.read_into(4097, memoryview(out))
    assert out == data[4097:]
    assert resident(str(path)) == 0  # nothing was mapped to copy it
    assert mapping[5:9] == data[5:9]  # and it is a mapping all the same
    with pytest.raises(OSError, match="file ends"):
        mapping.read_into(VALUE - 10, memoryview(bytearray(20)))
    fd = mapping.fd
    mapping.close()
    assert not _opened(fd, path)
    with open(path, "rb") as f:
        dropped = FileMapping.open(f.fileno(), VALUE)
    fd = dropped.fd
    del dropped
    gc.collect()
    assert not _opened(fd, path)  # collected without close(): the file is closed too


def test_the_ram_tier_hands_out_file_mappings(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    tier = RamTier(tmp_path / "ram", budget=32 << 20)
    tier.put("v", data)
    view = tier.view("v")
    assert view is not None and isinstance(view.obj, FileMapping)
    out = bytearray(100)
    view.obj.read_into(len(view.obj) - len(data) + 1000, memoryview(out))  # the payload ends the file
    assert out == data[1000:1100]


def test_a_write_transaction_leaves_none_of_the_data_files_pages_mapped(tmp_path: Path) -> None:
    env = SharedEnv(tmp_path / "env", map_size=64 << 20, budget=32 << 20)
    with env.write() as txn:
        for i in range(20_000):  # a B-tree of a few hundred pages
            txn.put(f"key{i:06d}".encode(), os.urandom(64), db=env.db("stats"))
    data_file = str(tmp_path / "env" / "data.mdb")
    with env.read() as txn:
        assert sum(1 for _ in txn.cursor(db=env.db("stats"))) == 20_000
    assert resident(data_file) >= 64 << 10  # reading walked the tree through the map...
    with env.write() as txn:
        txn.put(b"key000001", b"changed", db=env.db("stats"))
    assert resident(data_file) == 0  # ...and a write lets go of every page it mapped
    with env.read() as txn:
        assert txn.get(b"key000001", db=env.db("stats")) == b"changed"


def test_mapped_range_finds_the_one_mapping_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * (3 * mmap.PAGESIZE))
    assert mapped_range(path) is None
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    start, end = mapped_range(path)
    with memoryview(mapping) as view:
        assert np.frombuffer(view, dtype=np.uint8).ctypes.data == start
    assert end - start == 3 * mmap.PAGESIZE
    mapping.close()
    assert mapped_range(path) is None
