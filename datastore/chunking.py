"""Big values: content-defined chunks stored as their own objects.

A ``files`` record whose data is at least ``ChunkOptions.threshold`` bytes does not hold
the bytes inline: they are cut by FastCDC (the ``fastcdc`` library's Cython backend;
1 MiB average, 256 KiB min, 4 MiB max) and each chunk is stored as one object (one
under 1 MiB as a member of a pack, see :mod:`cachetier.packs`), the record listing the
chunk ids. An edit inside a big file changes the chunks it touches
(and at most a neighbour while the cut points resynchronise), so a 1 MiB edit in a 1 GB
file stores a few MiB.

Stored form of a chunk: its raw bytes, unless zstd shrinks it, then one zstd frame.
Whether zstd helps is probed on the first 64 KiB at level 1 (random, media or already
compressed data costs one fast probe). A stored object that starts with the zstd frame
magic *is* a frame: a raw chunk that happens to start with those four bytes (say, part
of a ``.zst`` file) is framed too, so reading back needs no side information. The object
id is the content hash of the stored bytes, as for every object. Files are read in
windows (never whole), so memory stays bounded by a few windows for any file size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

from cachetier.errors import BadInputError, IntegrityError
from cachetier.objects import ObjectStore

__all__ = [
    "ChunkOptions",
    "iter_chunks",
    "pack_chunk",
    "read_chunks_to",
    "store_chunks",
    "unpack_chunk",
]

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PROBE_BYTES = 64 << 10
_PROBE_RATIO = 0.9
_WINDOW = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkOptions:
    """When and how big values are chunked; part of every shard key."""

    threshold: int = 4 << 20
    min_size: int = 256 << 10
    avg_size: int = 1 << 20
    max_size: int = 4 << 20
    compression_level: int = 3

    def __post_init__(self) -> None:
        if not (64 <= self.min_size <= self.avg_size <= self.max_size and self.max_size >= 1024):
            raise BadInputError(
                "chunk sizes must satisfy 64 <= min <= avg <= max: "
                f"{self.min_size}/{self.avg_size}/{self.max_size}",
                subject="chunk options",
            )

    def fingerprint(self) -> str:
        """A short string that changes whenever chunk ids would change."""
        return (
            f"chunks/1;fastcdc;threshold={self.threshold};min={self.min_size};avg={self.avg_size};"
            f"max={self.max_size};zstd={self.compression_level};zstd-lib={zstandard.ZSTD_VERSION}"
        )


def iter_chunks(stream: BinaryIO, options: ChunkOptions | None = None) -> Iterator[memoryview]:
    """Yield the content-defined chunks of a binary stream, reading it in bounded windows.

    Cut points depend only on the bytes from a chunk's start to at most ``max_size``
    after it, so chunks come out identical to chunking the whole stream at once. Chunks
    are read-only views into a fresh buffer per window (no copies); a window is freed
    once no chunk of it is referenced any more.
    """
    options = options or ChunkOptions()
    window = max(_WINDOW, 4 * options.max_size)
    carry = b""
    eof = False
    while not eof or carry:
        buf = bytearray(len(carry) + window)
        buf[: len(carry)] = carry
        filled = len(carry)
        while filled < len(buf):
            n = _read_into(stream, memoryview(buf)[filled:])
            if not n:
                eof = True
                break
            filled += n
        if filled == 0:
            return
        view = memoryview(buf).toreadonly()[:filled]
        # Imported here: fastcdc's package imports click, ~20 ms that a checkout never needs.
        from fastcdc.fastcdc_cy import fastcdc_cy

        cuts = [
            (c.offset, c.length)
            for c in fastcdc_cy(view, options.min_size, options.avg_size, options.max_size)
        ]
        consumed = 0
        for offset, length in cuts:
            if not eof and offset + options.max_size > filled:
                break  # too close to the window's end to know this cut: read more first
            yield view[offset : offset + length]
            consumed = offset + length
        carry = bytes(view[consumed:])


def _read_into(stream: BinaryIO, target: memoryview) -> int:
    readinto = getattr(stream, "readinto", None)
    if readinto is not None:
        return readinto(target) or 0
    data = stream.read(len(target))
    target[: len(data)] = data
    return len(data)


def pack_chunk(raw: bytes | memoryview, level: int = 3) -> bytes | memoryview:
    """Return the stored form of a chunk: raw, or a zstd frame when that is smaller."""
    probe = raw[:_PROBE_BYTES]
    helps = len(probe) > 0 and len(zstandard.ZstdCompressor(level=1).compress(probe)) < _PROBE_RATIO * len(
        probe
    )
    if helps or bytes(raw[:4]) == _ZSTD_MAGIC:
        return zstandard.ZstdCompressor(level=level).compress(raw)
    return raw


def unpack_chunk(stored: bytes, *, max_size: int = 1 << 30) -> bytes:
    """Return the raw bytes of a stored chunk (inverse of :func:`pack_chunk`)."""
    if stored.startswith(_ZSTD_MAGIC):
        return zstandard.ZstdDecompressor().decompress(stored, max_output_size=max_size)
    return stored


def store_chunks(stream: BinaryIO, objects: ObjectStore, options: ChunkOptions | None = None) -> list[str]:
    """Chunk a stream, store each chunk (skipping existing ones) and return the chunk ids."""
    options = options or ChunkOptions()
    return [objects.put(pack_chunk(raw, options.compression_level)) for raw in iter_chunks(stream, options)]


def read_chunks_to(
    objects: ObjectStore,
    chunk_ids: Iterable[str],
    out: BinaryIO,
    *,
    expected_size: int | None = None,
    subject: str = "file",
    prefetch: int = 4,
) -> int:
    """Write the reassembled value to ``out``; every chunk is verified by its hash.

    Up to ``prefetch`` chunks are fetched ahead in threads. Raises IntegrityError when a
    chunk is corrupt or the total length differs from ``expected_size``; returns the
    number of bytes written.
    """
    written = 0
    ids = iter(chunk_ids)
    with ThreadPoolExecutor(max(1, prefetch)) as pool:
        ahead: deque[Future[bytes]] = deque()

        def top_up() -> None:
            while len(ahead) < prefetch:
                oid = next(ids, None)
                if oid is None:
                    return
                ahead.append(pool.submit(lambda o=oid: unpack_chunk(objects.get(o))))

        top_up()
        while ahead:
            data = ahead.popleft().result()
            top_up()
            out.write(data)
            written += len(data)
    if expected_size is not None and written != expected_size:
        raise IntegrityError(
            f"reassembled {written} bytes, the record says {expected_size}",
            subject=subject,
            hint="run `dataset verify`",
        )
    return written
