"""The benchmark dataset of the loader issue: {id, 512 int32 tokens, ~1 KB text} in zstd Arrow shards.

100k samples make 308 MB raw in 10 shards of 10k samples (a few record batches each,
plus the hidden ``__record_hash`` column every repository shard carries). The text is
words drawn from a fixed vocabulary, so it compresses like prose, not like noise.
Generation is deterministic and cached: a folder is reused when its ``meta.json``
matches the requested size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

__all__ = ["TOKENS", "ensure_dataset", "shard_paths"]

TOKENS = 512
_BATCH_ROWS = 2_000
_VOCAB = 5_000


def _vocabulary(rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    lengths = rng.integers(2, 10, _VOCAB)
    return ["".join(rng.choice(letters, n)) for n in lengths]


def _texts(rng: np.random.Generator, vocab: list[str], n: int, size: int = 1_000) -> list[str]:
    words = rng.integers(0, _VOCAB, (n, size // 4))
    out = []
    for row in words:
        text = " ".join(vocab[w] for w in row)
        out.append(text[:size])
    return out


def shard_paths(folder: Path) -> list[Path]:
    """The shard files of a generated dataset, in version order."""
    return sorted(folder.glob("shard-*.arrow"))


def ensure_dataset(folder: Path, samples: int, shards: int) -> list[Path]:
    """Generate (or reuse) ``samples`` records in ``shards`` files under ``folder``."""
    import pyarrow as pa  # here, not at the top: the peers' processes import this module

    meta = {"samples": samples, "shards": shards, "tokens": TOKENS, "format": 1}
    meta_path = folder / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()) == meta:
        return shard_paths(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in shard_paths(folder):
        old.unlink()
    rng = np.random.default_rng(20240501)
    vocab = _vocabulary(rng)
    per = -(-samples // shards)
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("tokens", pa.list_(pa.int32(), TOKENS)),
            ("text", pa.string()),
            ("__record_hash", pa.binary(16)),
        ]
    )
    for s in range(shards):
        lo, hi = s * per, min(samples, (s + 1) * per)
        if lo >= hi:
            break
        n = hi - lo
        tokens = rng.integers(0, 50_257, n * TOKENS, dtype=np.int32)
        table = pa.table(
            {
                "id": np.arange(lo, hi, dtype=np.int64),
                "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), TOKENS),
                "text": _texts(rng, vocab, n),
                "__record_hash": pa.array(
                    list(rng.bytes(16 * n)[i * 16 : (i + 1) * 16] for i in range(n)), pa.binary(16)
                ),
            },
            schema=schema,
        )
        path = folder / f"shard-{s:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema, options=options) as writer:
            writer.write_table(table, max_chunksize=_BATCH_ROWS)
    meta_path.write_text(json.dumps(meta))
    return shard_paths(folder)
