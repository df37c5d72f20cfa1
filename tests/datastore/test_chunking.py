"""Big values: content-defined chunks, their stored form, reassembly, edit locality."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from fastcdc.fastcdc_cy import fastcdc_cy
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import IntegrityError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore, object_key
from datastore import chunking
from datastore.chunking import (
    ChunkOptions,
    iter_chunks,
    pack_chunk,
    read_chunks_to,
    store_chunks,
    unpack_chunk,
)

TINY = ChunkOptions(threshold=4096, min_size=256, avg_size=1024, max_size=4096)


@settings(max_examples=30, deadline=None)
@given(size=st.integers(0, 60_000), window=st.integers(1, 20_000), seed=st.integers(0, 2**16))
def test_windowed_chunks_equal_whole_buffer_chunks(size: int, window: int, seed: int) -> None:
    data = os.urandom(size) if seed % 2 else bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    whole = [data[c.offset : c.offset + c.length] for c in fastcdc_cy(data, 256, 1024, 4096)] if data else []
    original = chunking._WINDOW
    chunking._WINDOW = window
    try:
        windowed = list(iter_chunks(io.BytesIO(data), TINY))
    finally:
        chunking._WINDOW = original
    assert windowed == whole
    assert b"".join(windowed) == data


def test_stored_form() -> None:
    text = b"the same words again and again " * 4000
    noise = os.urandom(100_000)
    assert len(pack_chunk(text)) < len(text) // 5
    assert pack_chunk(noise) == noise
    framed = b"\x28\xb5\x2f\xfd" + noise  # raw bytes that look like a zstd frame get framed
    assert pack_chunk(framed) != framed
    for raw in (text, noise, framed, b""):
        assert unpack_chunk(pack_chunk(raw)) == raw


def test_reassembly_verifies_every_chunk(tmp_path: Path) -> None:
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    data = os.urandom(3 << 20) + b"abc" * 300_000
    ids = store_chunks(
        io.BytesIO(data), objects, ChunkOptions(min_size=64 << 10, avg_size=256 << 10, max_size=1 << 20)
    )
    assert len(ids) > 5
    out = io.BytesIO()
    assert read_chunks_to(objects, ids, out, expected_size=len(data)) == len(data)
    assert out.getvalue() == data
    with pytest.raises(IntegrityError, match="reassembled"):
        read_chunks_to(objects, ids, io.BytesIO(), expected_size=len(data) + 1)
    key = object_key(ids[2])
    objects.store.put(key, b"rotten" + objects.store.get(key)[6:])
    with pytest.raises(IntegrityError, match=ids[2]):
        read_chunks_to(objects, ids, io.BytesIO())


def test_an_edit_inside_a_big_file_stores_only_nearby_chunks(tmp_path: Path) -> None:
    """A 1 MiB overwrite inside a 64 MiB file stores a few MiB, not the file."""
    objects = ObjectStore(LocalStore(tmp_path / "repo"))
    data = bytearray(os.urandom(64 << 20))
    first = store_chunks(io.BytesIO(data), objects)
    stored_before = sum(info.size for _, info in objects.list())
    data[30 << 20 : 31 << 20] = os.urandom(1 << 20)
    second = store_chunks(io.BytesIO(data), objects)
    new_bytes = sum(info.size for _, info in objects.list()) - stored_before
    assert stored_before >= 64 << 20
    assert new_bytes <= 8 << 20
    assert len(set(second) - set(first)) <= 6
    out = io.BytesIO()
    read_chunks_to(objects, second, out, expected_size=len(data))
    assert out.getvalue() == bytes(data)
