import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup import DedupConfig, find_duplicates, shingles
from dedup.normalize import normalize_array
from dedup.shingle import char_shingle_hash64, shingle_batch, unit_hash64, word_shingle_hash64
from dedup.status import Status


def test_word_and_char_modes():
    assert shingles("The cat sat on the mat, said the dog.") == (
        "words",
        [
            b"the cat sat on the",
            b"cat sat on the mat",
            b"sat on the mat said",
            b"on the mat said the",
            b"the mat said the dog",
        ],
    )
    mode, sh = shingles("hello world")  # fewer than 5 words: character 5-grams
    assert mode == "chars" and sh[:3] == [b"hello", b"ello ", b"llo w"]
    mode, sh = shingles("日本語のテキストです")  # no spaces: code-point 5-grams
    assert mode == "chars" and sh[0].decode() == "日本語のテ" and len(sh) == 6
    assert shingles("hi") == ("too_short", [])
    assert shingles(None) == ("null", [])


def test_long_words_switch_to_char_mode():
    config = DedupConfig(char_mode_token_bytes=10)
    text = " ".join(["x" * 20] * 6)
    assert shingles(text, config)[0] == "chars"
    assert shingles(text)[0] == "words"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab cdé,日本x" + "z" * 3), max_size=200), min_size=1, max_size=6
    )
)
def test_vectorized_hashes_equal_reference(texts):
    norm = normalize_array(pa.array(texts, pa.large_string()))
    sh = shingle_batch(norm, DedupConfig())
    raw = norm.data.tobytes()
    for i in range(len(texts)):
        ref = char_shingle_hash64 if sh.status[i] == Status.CHARS else word_shingle_hash64
        for k in range(sh.offsets[i], sh.offsets[i + 1]):
            assert int(sh.hash64[k]) == ref(raw[sh.starts[k] : sh.ends[k]])


def test_units_longer_than_the_vectorized_limit():
    words = ["w" * 70, "a", "b" * 9, "c" * 200, "d", "e"]
    norm = normalize_array(pa.array([" ".join(words)]))
    sh = shingle_batch(norm, DedupConfig(char_mode_token_bytes=1000))
    assert sh.status[0] == Status.WORDS
    raw = norm.data.tobytes()
    got = [int(h) for h in sh.hash64]
    assert got == [word_shingle_hash64(raw[s:e]) for s, e in zip(sh.starts, sh.ends)]
    # Short units are a bijection of (length, bytes): no collisions among them.
    units = [bytes([a, b]) for a in range(97, 123) for b in range(97, 123)] + [b"a", b"ab\x00"]
    assert len({unit_hash64(u) for u in units}) == len(units)


def test_max_doc_bytes_marks_too_large():
    norm = normalize_array(pa.array(["word " * 50, "tiny one two three four five"]))
    sh = shingle_batch(norm, DedupConfig(max_doc_bytes=100))
    assert list(sh.status) == [Status.TOO_LARGE, Status.WORDS]
    assert np.diff(sh.offsets).tolist() == [0, 2]


def test_a_word_shingle_never_hashes_as_the_char_shingle_of_its_letters():
    # Units are words in one mode, code points in the other: without a domain per mode,
    # b"h e l l o" (5 one-letter words) and b"hello" (5 code points) hashed alike.
    assert word_shingle_hash64(b"h e l l o") != char_shingle_hash64(b"hello")
    norm = normalize_array(pa.array(["helloworld", "h e l l o w o r l d"]))
    sh = shingle_batch(norm, DedupConfig())
    assert [Status(s) for s in sh.status] == [Status.CHARS, Status.WORDS]
    first, second = (set(sh.hash64[sh.offsets[i] : sh.offsets[i + 1]].tolist()) for i in range(2))
    assert not first & second
    result = find_duplicates(pa.table({"text": ["helloworld", "h e l l o w o r l d"]}), column="text")
    assert result.removed_records == 0
