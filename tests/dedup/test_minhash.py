"""Our signatures equal datasketch's MinHash for the same seed, scheme and shingles."""

import datasketch
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup import DedupConfig, char_shingle_hash32, minhash_signatures, shingles, word_shingle_hash32
from dedup.minhash import Permutations, signatures
from dedup.shingle import sha1_hash32

WORDS = st.text(alphabet="abcdefgh ,.ÄéЖ日本", min_size=0, max_size=120)


def datasketch_row(text, config, hashfunc=None):
    mode, sh = shingles(text, config)
    if hashfunc is None:
        hashfunc = word_shingle_hash32 if mode == "words" else char_shingle_hash32
    m = datasketch.MinHash(config.num_perm, seed=config.seed, scheme=config.scheme, hashfunc=hashfunc)
    m.update_batch(sh)
    return m.hashvalues


@settings(max_examples=60, deadline=None)
@given(
    st.lists(WORDS, min_size=1, max_size=6),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["affine32", "legacy"]),
    st.sampled_from([16, 128]),
)
def test_equal_to_datasketch_with_our_shingle_hash(texts, seed, scheme, num_perm):
    config = DedupConfig(seed=seed, scheme=scheme, num_perm=num_perm)
    sigs, _ = minhash_signatures(pa.array(texts), config)
    for text, row in zip(texts, sigs):
        expected = datasketch_row(text, config)
        assert row.dtype == expected.dtype
        np.testing.assert_array_equal(row, expected)


@settings(max_examples=20, deadline=None)
@given(st.lists(WORDS, min_size=1, max_size=4), st.integers(0, 1000))
def test_sha1_mode_equals_datasketch_default(texts, seed):
    """shingle_hash="sha1": datasketch with no hashfunc at all (its SHA-1 default)."""
    config = DedupConfig(seed=seed, shingle_hash="sha1")
    sigs, _ = minhash_signatures(pa.array(texts), config)
    for text, row in zip(texts, sigs):
        _, sh = shingles(text, config)
        m = datasketch.MinHash(128, seed=seed)
        m.update_batch(sh)
        np.testing.assert_array_equal(row, m.hashvalues)
    assert sha1_hash32(b"abc") == datasketch.hashfunc.sha1_hash32(b"abc")


def test_injected_hash_function():
    def crc(data: bytes) -> int:
        import zlib

        return zlib.crc32(data)

    config = DedupConfig(shingle_hash=crc, seed=5)
    text = "one two three four five six seven eight"
    sigs, _ = minhash_signatures(pa.array([text]), config)
    np.testing.assert_array_equal(sigs[0], datasketch_row(text, config, hashfunc=crc))


def test_long_record_spanning_windows_and_empty_records():
    rng = np.random.default_rng(3)
    perms = Permutations.create(64, 9)
    counts = [0, 3, 40000, 0, 17, 20000]
    hashes = rng.integers(0, 2**32, sum(counts), dtype=np.uint32)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    sigs = signatures(hashes, offsets, perms).T
    for i in range(len(counts)):
        h = hashes[offsets[i] : offsets[i + 1]]
        m = datasketch.MinHash(64, seed=9, hashfunc=int)
        m.update_batch(h.tolist())
        np.testing.assert_array_equal(sigs[i], m.hashvalues)


def test_permutations_match_datasketch():
    for scheme in ("affine32", "legacy"):
        ours = Permutations.create(128, 42, scheme)
        theirs = datasketch.MinHash(128, seed=42, scheme=scheme).permutations
        np.testing.assert_array_equal(ours.a, np.asarray(theirs[0]))
        np.testing.assert_array_equal(ours.b, np.asarray(theirs[1]))
