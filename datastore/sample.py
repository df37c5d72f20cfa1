"""A deterministic sample corpus for the demo, the tests and the benchmarks.

Documents are Zipf-ish word salads of a few hundred words with an ``id`` and a
``label``; a share of them are exact copies and near copies (a few words changed) of
earlier documents, so deduplication has something to find.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["sample_records", "write_sample_jsonl"]

_VOCABULARY = 5000


def sample_records(
    n: int, *, seed: int = 0, duplicate_rate: float = 0.1, words: int = 120
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` records ``{"id", "text", "label", "score"}``; about ``duplicate_rate`` are copies."""
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(_VOCABULARY)]
    ranks = np.arange(1, _VOCABULARY + 1, dtype=np.float64)
    probs = (1.0 / ranks) / np.sum(1.0 / ranks)
    kept: list[list[str]] = []
    for i in range(n):
        if kept and rng.random() < duplicate_rate:
            tokens = list(kept[int(rng.integers(len(kept)))])
            if rng.random() < 0.5:  # near copy: change ~3% of the words
                for j in rng.choice(len(tokens), size=max(1, len(tokens) // 33), replace=False):
                    tokens[int(j)] = vocab[int(rng.integers(_VOCABULARY))]
        else:
            length = int(rng.integers(words // 2, words * 2))
            tokens = [vocab[int(k)] for k in rng.choice(_VOCABULARY, size=length, p=probs)]
            kept.append(tokens)
        yield {
            "id": i,
            "text": " ".join(tokens),
            "label": int(rng.integers(10)),
            "score": round(float(rng.random()), 6),
        }


def write_sample_jsonl(
    path: str | os.PathLike[str], n: int, *, seed: int = 0, duplicate_rate: float = 0.1
) -> int:
    """Write ``n`` sample records as JSON lines; return the number of bytes written."""
    with open(path, "w", encoding="utf-8") as f:
        for record in sample_records(n, seed=seed, duplicate_rate=duplicate_rate):
            f.write(json.dumps(record) + "\n")
    return os.path.getsize(path)
