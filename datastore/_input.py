"""Opening source files: transparent .gz/.zst decompression, a hashing tap, line blocks.

The tap sits on the raw file (before decompression), so the provenance hash is the hash
of the file as it is on disk and progress counts bytes of the file (what a progress bar's
total, the file size, counts too).
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from cachetier.errors import BadInputError, NotFoundError
from cachetier.hashing import hasher

__all__ = [
    "CorruptStreamError",
    "HashingTap",
    "ZstdFrames",
    "compression_of",
    "iter_line_blocks",
    "open_input",
    "sniff_binary",
]

_COMPRESSIONS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def compression_of(path: str) -> str | None:
    """``gzip``, ``zstd`` or None, from the file name's last suffix."""
    return _COMPRESSIONS.get(os.path.splitext(path)[1].lower())


class HashingTap(io.RawIOBase):
    """A read-only stream that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO, progress: Callable[[int], None] | None = None):
        self._raw = raw
        self._hash = hasher()
        self._progress = progress
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._raw.readinto(b)
        if n:
            with memoryview(b) as view:
                self._hash.update(view[:n])
            self.bytes_read += n
            if self._progress is not None:
                self._progress(n)
        return n or 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if data:
            self._hash.update(data)
            self.bytes_read += len(data)
            if self._progress is not None:
                self._progress(len(data))
        return data

    def hexdigest(self) -> str:
        """The content hash of every byte read so far."""
        return self._hash.hexdigest()


class CorruptStreamError(OSError):
    """Compressed input that cannot be decompressed."""


class ZstdFrames(io.RawIOBase):
    """Concatenated zstd frames, decompressed as they are read.

    Input that ends inside a frame raises EOFError (zstandard's stream reader returns
    what it decoded as if the file were whole), and undecodable input CorruptStreamError.
    """

    def __init__(self, raw: BinaryIO, chunk: int = 256 << 10):
        import zstandard

        self._dctx = zstandard.ZstdDecompressor()
        self._error = zstandard.ZstdError
        self._raw = raw
        self._chunk = chunk
        self._frame = None  # the decompressor of the frame in progress; None between frames
        self._out = b""
        self._at = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(1 << 24), b""))
        while self._at >= len(self._out):
            if not self._decode_more():
                return b""
        data = self._out[self._at : self._at + size]
        self._at += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _decode_more(self) -> bool:
        data = self._raw.read(self._chunk)
        if not data:
            if self._frame is not None:
                raise EOFError("compressed data ended before the end of a zstd frame (a truncated file?)")
            return False
        out = []
        try:
            while data:
                if self._frame is None:
                    self._frame = self._dctx.decompressobj()
                out.append(self._frame.decompress(data))
                data = b""
                if self._frame.eof:
                    data, self._frame = self._frame.unused_data, None
        except self._error as e:
            raise CorruptStreamError(f"not zstd data ({e})") from None
        self._out, self._at = out[0] if len(out) == 1 else b"".join(out), 0
        return True


@contextmanager
def open_input(
    path: str, display: str, progress: Callable[[int], None] | None = None
) -> Iterator[tuple[BinaryIO, HashingTap]]:
    """Open ``path`` for reading, decompressing by suffix; yield ``(stream, tap)``."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError as e:
        raise NotFoundError("no such file", subject=display) from e
    except IsADirectoryError as e:
        raise BadInputError("is a directory", subject=display, hint="use --format files") from e
    except PermissionError as e:
        raise BadInputError("permission denied", subject=display) from e
    tap = HashingTap(raw, progress)
    kind = compression_of(path)
    try:
        if kind == "gzip":
            stream: BinaryIO = gzip.GzipFile(fileobj=io.BufferedReader(tap, 1 << 20), mode="rb")
        elif kind == "zstd":
            stream = ZstdFrames(tap)
        else:
            stream = tap
        yield stream, tap
    except (gzip.BadGzipFile, EOFError, CorruptStreamError) as e:
        raise BadInputError(f"corrupt {kind} data: {e}", subject=display) from e
    finally:
        raw.close()


def read_exactly(stream: BinaryIO, size: int) -> bytes:
    """Read up to ``size`` bytes, looping over short reads (decompressors return them)."""
    parts, need = [], size
    while need > 0:
        data = stream.read(need)
        if not data:
            break
        parts.append(data)
        need -= len(data)
    return b"".join(parts)


def iter_line_blocks(stream: BinaryIO, block_bytes: int, display: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(first_line_number, block)``: blocks of whole lines of about ``block_bytes``.

    Line numbers are 1-based and count every line, blank ones included.
    """
    carry = b""
    line = 1
    while True:
        try:
            data = read_exactly(stream, block_bytes)
        except (OSError, EOFError) as e:
            raise BadInputError(f"cannot read: {e}", subject=f"{display}:{line}") from e
        if not data:
            if carry:
                yield line, carry
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        block, carry = buf[: cut + 1], buf[cut + 1 :]
        yield line, block
        line += block.count(b"\n")


def sniff_binary(head: bytes, display: str, first_line: int = 1) -> None:
    """Raise BadInputError when ``head`` holds a NUL byte: the file is binary, not text."""
    at = head.find(b"\x00")
    if at >= 0:
        line = first_line + head.count(b"\n", 0, at)
        raise BadInputError(
            "binary data (a NUL byte), not text",
            subject=f"{display}:{line}",
            hint="is this the right file and --format?",
        )
