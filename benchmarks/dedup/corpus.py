"""A generated text corpus with planted near-duplicates (fixed seed), for the dedup benchmark.

Documents are Zipfian word sequences over a 50,000-word vocabulary of lowercase words
(about 250 words, ~1.5 KB each), rendered with capitalized sentence starts, commas,
periods and newlines that vary between copies (so normalization matters). A fraction
of the documents are *copies*: a copy takes an earlier original and applies random word
substitutions, deletions and insertions, as many as give a target Jaccard similarity of
5-word shingles drawn from a mix of levels (exact copies, 0.9-1.0, 0.8-0.9, and near
misses at 0.6-0.8). The realised similarity is not assumed: :mod:`truth` computes the
exact truth from the word ids.

``Corpus.words`` keeps each document's word ids (the ground truth's input) and
``Corpus.family`` the original each document descends from (its own index for an
original), used to detect clusters that merge unrelated documents.

Run ``python -m benchmarks.dedup.corpus --docs 100000 --out FILE.arrow`` to write one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["Corpus", "generate", "write_ipc"]

VOCAB = 50_000
ZIPF_S = 1.0
MEAN_WORDS = 250
LEVELS = (  # (weight, low, high) of the target Jaccard of a copy
    (0.10, 1.0, 1.0),
    (0.25, 0.90, 1.0),
    (0.35, 0.80, 0.90),
    (0.30, 0.60, 0.80),
)


@dataclass
class Corpus:
    """Texts, their word ids (concatenated, with offsets) and family ids."""

    texts: list[str]
    words: np.ndarray  # uint32, all documents' word ids
    offsets: np.ndarray  # int64, len(texts) + 1
    family: np.ndarray  # int64
    target: np.ndarray  # float64, target Jaccard of a copy to its source (NaN for originals)

    def doc_words(self, i: int) -> np.ndarray:
        """The word ids of document ``i``."""
        return self.words[self.offsets[i] : self.offsets[i + 1]]

    def table(self) -> pa.Table:
        """The corpus as an Arrow table with ``id`` and ``text`` columns."""
        return pa.table(
            {
                "id": np.arange(len(self.texts), dtype=np.int64),
                "text": pa.array(self.texts, pa.large_string()),
            }
        )


def _vocabulary(rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: set[str] = set()
    out: list[str] = []
    while len(out) < VOCAB:
        length = int(min(14, 1 + rng.geometric(0.27)))
        w = "".join(rng.choice(letters, length))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def _edit(words: np.ndarray, target: float, rng: np.random.Generator, cdf: np.ndarray) -> np.ndarray:
    """Random substitutions/deletions/insertions, about as many as give ``target``."""
    m = max(len(words) - 4, 1)
    if target >= 1.0:
        return words.copy()
    # One edit changes up to 5 shingles on each side: J ~ (m - 5k) / (m + 5k).
    k = max(1, round(m * (1 - target) / (5 * (1 + target))))
    out = list(words)
    for _ in range(k):
        pos = int(rng.integers(0, len(out)))
        kind = rng.random()
        new = int(np.searchsorted(cdf, rng.random()))
        if kind < 0.6:
            out[pos] = new
        elif kind < 0.8 and len(out) > 60:
            del out[pos]
        else:
            out.insert(pos, new)
    return np.array(out, dtype=np.uint32)


def _render(words: list[str], rng: np.random.Generator) -> str:
    """Words with sentence capitals and punctuation; varies from call to call."""
    parts = []
    sentence_left = int(rng.integers(6, 20))
    start = True
    for w in words:
        parts.append(w.capitalize() if start else w)
        start = False
        sentence_left -= 1
        if sentence_left == 0:
            r = rng.random()
            parts[-1] += "." if r < 0.7 else ("!" if r < 0.8 else ",")
            parts.append("\n" if rng.random() < 0.15 else " ")
            start = r < 0.8
            sentence_left = int(rng.integers(6, 20))
        else:
            parts.append(" ")
    return "".join(parts[:-1]) + "."


def generate(n_docs: int, *, dup_fraction: float = 0.1, seed: int = 20240601) -> Corpus:
    """``n_docs`` documents, of which about ``dup_fraction`` are planted copies."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    weights = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF_S
    cdf = np.cumsum(weights / weights.sum())
    lengths = np.clip(rng.lognormal(np.log(MEAN_WORDS), 0.35, n_docs), 60, 1200).astype(np.int64)
    is_copy = rng.random(n_docs) < dup_fraction
    is_copy[:10] = False
    level_w = np.array([w for w, _, _ in LEVELS])
    docs: list[np.ndarray] = []
    family = np.arange(n_docs, dtype=np.int64)
    target = np.full(n_docs, np.nan)
    originals: list[int] = []
    for i in range(n_docs):
        if is_copy[i]:
            src = originals[int(rng.integers(0, len(originals)))]
            lvl = LEVELS[int(rng.choice(len(LEVELS), p=level_w / level_w.sum()))]
            t = lvl[1] if lvl[1] == lvl[2] else float(rng.uniform(lvl[1], lvl[2]))
            docs.append(_edit(docs[src], t, rng, cdf))
            family[i] = family[src]
            target[i] = t
        else:
            docs.append(np.searchsorted(cdf, rng.random(lengths[i])).astype(np.uint32))
            originals.append(i)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    words = np.concatenate(docs).astype(np.uint32)
    vocab_arr = np.array(vocab, dtype=object)
    texts = [_render(vocab_arr[d].tolist(), rng) for d in docs]
    return Corpus(texts, words, offsets, family, target)


def write_ipc(corpus: Corpus, path: str, batch_rows: int = 10_000) -> None:
    """Write the corpus table as an Arrow IPC file in batches of ``batch_rows``."""
    table = corpus.table()
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)


def main() -> None:
    """CLI: write a corpus file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=20240601)
    args = parser.parse_args()
    write_ipc(generate(args.docs, seed=args.seed), args.out)


if __name__ == "__main__":
    main()
