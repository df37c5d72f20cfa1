"""The parameters of one dedup run, as one small keyword-only value.

:class:`DedupConfig` is frozen and JSON-able (:meth:`DedupConfig.to_dict`), so the exact
parameters of a run go into the version record's audit as they are. Validation happens
in ``__post_init__``: a bad value raises :class:`cachetier.errors.BadInputError` naming
the parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from cachetier.errors import BadInputError

__all__ = ["Content", "DedupConfig", "Method", "Scheme", "ShingleHash", "Verify"]

Method = Literal["exact", "minhash"]
Content = Literal["text", "bytes"]
Scheme = Literal["affine32", "legacy"]
Verify = Literal["exact", "signature", "none"]
# "fast": our vectorized shingle hash (dedup.shingle.word_shingle_hash32 / char_shingle_hash32);
# "sha1": datasketch's default sha1_hash32 (slow, bit-for-bit datasketch compatibility);
# or any callable bytes -> int (< 2**32), applied per shingle (slow).
ShingleHash = Literal["fast", "sha1"] | Callable[[bytes], int]

_METHODS = ("exact", "minhash")
_CONTENTS = ("text", "bytes")
_SCHEMES = ("affine32", "legacy")
_VERIFY = ("exact", "signature", "none")


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    """What to deduplicate and how; the defaults are DESIGN.md section 6.

    - ``method``: ``"exact"`` (content hash only) or ``"minhash"`` (exact first, then near).
    - ``content``: ``"text"`` hashes the normalized text (see :mod:`dedup.normalize`);
      ``"bytes"`` hashes raw bytes (``files`` datasets; exact method only).
    - ``threshold``: Jaccard similarity of shingle sets at or above which two records are
      duplicates. ``num_perm``, ``seed``, ``scheme``: the MinHash, equal to
      ``datasketch.MinHash(num_perm, seed, scheme=scheme)``.
    - ``ngram``: words per shingle; ``char_ngram``: characters per shingle for records
      shingled by characters (fewer than ``ngram`` words, or a mean word longer than
      ``char_mode_token_bytes`` bytes, as in text without spaces).
    - ``bands``/``rows``: LSH banding; ``None`` picks them with
      :func:`dedup.lsh.choose_bands` so that a pair at the threshold is missed with
      probability at most ``max_miss``.
    - ``verify``: ``"exact"`` checks each LSH candidate pair by exact Jaccard of its
      shingle sets, ``"signature"`` by the MinHash estimate, ``"none"`` keeps every
      candidate (datasketch's behaviour).
    - ``max_bucket_neighbors``: in an LSH bucket, each record is paired with at most this
      many following records (all pairs in buckets up to that size); bounds the work on
      huge buckets while keeping them connected.
    - ``max_doc_bytes``: records longer than this (normalized) are kept without near-dup
      comparison (reason ``too_large``); exact dedup still applies. ``None``: no limit.
    - ``chunk_bytes``: text processed per vectorized step (memory vs. call overhead).
    """

    method: Method = "minhash"
    content: Content = "text"
    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    scheme: Scheme = "affine32"
    ngram: int = 5
    char_ngram: int = 5
    char_mode_token_bytes: int = 24
    shingle_hash: ShingleHash = "fast"
    bands: int | None = None
    rows: int | None = None
    max_miss: float = 0.01
    verify: Verify = "exact"
    max_bucket_neighbors: int = 64
    max_doc_bytes: int | None = 4 << 20
    chunk_bytes: int = 256 << 10

    def __post_init__(self) -> None:
        _choice("method", self.method, _METHODS)
        _choice("content", self.content, _CONTENTS)
        _choice("scheme", self.scheme, _SCHEMES)
        _choice("verify", self.verify, _VERIFY)
        if not callable(self.shingle_hash):
            _choice("shingle_hash", self.shingle_hash, ("fast", "sha1"))
        if self.method == "minhash" and self.content != "text":
            raise BadInputError(
                "minhash dedup needs text content",
                subject="content",
                hint="use method='exact' for content='bytes'",
            )
        if not 0.0 < self.threshold <= 1.0:
            raise BadInputError(f"threshold must be in (0, 1], got {self.threshold!r}", subject="threshold")
        for name in ("num_perm", "ngram", "char_ngram", "char_mode_token_bytes", "max_bucket_neighbors"):
            _positive(name, getattr(self, name))
        _positive("chunk_bytes", self.chunk_bytes)
        if self.max_doc_bytes is not None:
            _positive("max_doc_bytes", self.max_doc_bytes)
        if not 0.0 < self.max_miss < 1.0:
            raise BadInputError(f"max_miss must be in (0, 1), got {self.max_miss!r}", subject="max_miss")
        if (self.bands is None) != (self.rows is None):
            raise BadInputError("give both bands and rows, or neither", subject="bands/rows")
        if self.bands is not None and self.rows is not None:
            _positive("bands", self.bands)
            _positive("rows", self.rows)
            if self.bands * self.rows > self.num_perm:
                raise BadInputError(
                    f"bands*rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}",
                    subject="bands/rows",
                )

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a JSON-able dict (a callable shingle hash appears by its name)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if callable(value):
                value = f"callable:{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
            out[name] = value
        return out


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise BadInputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}", subject=name)


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadInputError(f"{name} must be a positive integer, got {value!r}", subject=name)
