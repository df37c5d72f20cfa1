"""Small generated corpora for the dedup tests (fixed seeds, no files)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def vocabulary(rng: np.random.Generator, size: int = 5000) -> np.ndarray:
    """``size`` distinct lowercase words."""
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choice(LETTERS, int(rng.integers(2, 10))))] = None
    return np.array(list(words))


def random_doc(rng: np.random.Generator, vocab: np.ndarray, words: int = 120) -> list[str]:
    """Zipfian random words."""
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    return list(vocab[rng.choice(len(vocab), words, p=weights / weights.sum())])


def edit(rng: np.random.Generator, vocab: np.ndarray, words: list[str], substitutions: int) -> list[str]:
    """A copy with ``substitutions`` words replaced at random positions."""
    out = list(words)
    for pos in rng.choice(len(out), substitutions, replace=False):
        out[int(pos)] = str(vocab[int(rng.integers(0, len(vocab)))])
    return out


def jaccard(a: list[str], b: list[str], n: int = 5) -> float:
    """Exact Jaccard of the word n-gram sets."""
    sa = {tuple(a[i : i + n]) for i in range(len(a) - n + 1)}
    sb = {tuple(b[i : i + n]) for i in range(len(b) - n + 1)}
    return len(sa & sb) / len(sa | sb)


@pytest.fixture(scope="session")
def planted() -> dict:
    """400 unrelated documents plus near copies at known Jaccard, shuffled in.

    Returns the table, the list of word lists and the planted (source, copy, jaccard)
    triples (indices into the table, source < copy).
    """
    rng = np.random.default_rng(7)
    vocab = vocabulary(rng)
    docs = [random_doc(rng, vocab) for _ in range(400)]
    triples = []
    for src in range(0, 400, 8):
        for subs in (0, 1, 2, 12):
            copy = edit(rng, vocab, docs[src], subs)
            docs.append(copy)
            triples.append((src, len(docs) - 1, jaccard(docs[src], copy)))
    texts = []
    for k, words in enumerate(docs):
        text = " ".join(words)
        # Vary case and punctuation: normalization must see through it.
        texts.append(text.capitalize() + ("." if k % 2 else "!!"))
    return {"table": pa.table({"text": texts}), "docs": docs, "triples": triples}
