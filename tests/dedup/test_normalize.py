import unicodedata

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup.normalize import SEPARATOR_PATTERN, normalize_array, normalize_text
from dedup.status import Status


def arrow_reference(text: str) -> str:
    """The rule with Arrow kernels only (the path non-ASCII records take)."""
    a = pc.utf8_lower(pc.utf8_normalize(pa.array([text]), "NFKC"))
    a = pc.replace_substring_regex(a, pattern=SEPARATOR_PATTERN, replacement=" ")
    return pc.utf8_trim(a, characters=" ")[0].as_py()


def python_ascii_reference(text: str) -> str:
    mapped = "".join(
        " " if unicodedata.category(ch)[0] in "PZ" or unicodedata.category(ch) == "Cc" else ch.lower()
        for ch in text
    )
    return " ".join(word for word in mapped.split(" ") if word)


def test_rule_examples():
    assert normalize_text("  Hello,   WORLD!! ") == "hello world"
    assert normalize_text("Ｆｕｌｌ\u00a0width — dash.") == "full width dash"
    assert normalize_text("tab\tnew\nline") == "tab new line"
    assert normalize_text("price: $5 + 3 = 8") == "price $5 + 3 = 8"
    assert normalize_text("...") == ""


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=60))
def test_ascii_fast_path_matches_python_rule(text):
    assert normalize_text(text) == python_ascii_reference(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), min_size=1, max_size=8))
def test_batch_equals_arrow_kernels(texts):
    batch = normalize_array(pa.array(texts, pa.large_string()))
    for i, text in enumerate(texts):
        assert batch.record(i).decode("utf-8") == arrow_reference(text)


def test_status_of_bad_values():
    batch = normalize_array(pa.array([b"ok go", b"\xff\xfe", None, b"", b"?!"], pa.binary()))
    assert list(batch.status) == [Status.WORDS, Status.INVALID_UTF8, Status.NULL, Status.EMPTY, Status.EMPTY]
    assert batch.record(0) == b"ok go"


def test_sliced_array_and_bytes_content():
    arr = pa.array(["A b", "X, y", "Q r"])[1:]
    batch = normalize_array(arr)
    assert [batch.record(i) for i in range(2)] == [b"x y", b"q r"]
    raw = normalize_array(pa.array([b"A, b", None]), content="bytes")
    assert raw.record(0) == b"A, b" and raw.status[1] == Status.NULL
