import pyarrow as pa
import pytest

from dedup import DedupConfig, find_duplicates

BASE = "the quick brown fox jumps over the lazy dog near the river bank today"


def test_bad_records_are_kept_with_a_reason():
    texts = [None, "", "   ?! ", "x", "word", "word", BASE, BASE + " extra", None]
    r = find_duplicates(pa.table({"text": texts}))
    assert r.keep.tolist() == [True, True, True, True, True, False, True, False, True]
    assert r.skipped.to_pylist() == [
        {"record": 0, "reason": "null"},
        {"record": 1, "reason": "empty"},
        {"record": 2, "reason": "empty"},
        {"record": 3, "reason": "too_short"},
        {"record": 4, "reason": "too_short"},  # 4 characters: fewer than one 5-gram
        {"record": 8, "reason": "null"},
    ]
    reasons = dict(zip(r.removed.column("record").to_pylist(), r.removed.column("reason").to_pylist()))
    assert reasons == {5: "exact", 7: "near"}


def test_non_utf8_bytes_in_a_text_column():
    values = pa.array(
        [b"caf\xe9 au lait", BASE.encode(), b"\xff\xfe\x00", BASE.upper().encode()], pa.binary()
    )
    r = find_duplicates(pa.table({"text": values}))
    assert r.skipped.to_pylist() == [
        {"record": 0, "reason": "invalid_utf8"},
        {"record": 2, "reason": "invalid_utf8"},
    ]
    assert r.removed_indices().tolist() == [3]


def test_one_word_documents():
    texts = ["supercalifragilistic", "supercalifragilistic", "supercalifragilistik", "a", "b"]
    r = find_duplicates(pa.table({"text": texts}))
    assert r.removed.column("reason").to_pylist()[0] == "exact"
    assert r.keep[0] and not r.keep[1]
    assert {"record": 3, "reason": "too_short"} in r.skipped.to_pylist()


@pytest.mark.slow
def test_ten_megabyte_document():
    big = " ".join(f"w{i % 99991}" for i in range(1_600_000))[: 10 << 20]
    table = pa.table({"text": [BASE, big, BASE + " again", big]})
    r = find_duplicates(table)  # default max_doc_bytes: too large for near-dup comparison
    assert {"record": 1, "reason": "too_large"} in r.skipped.to_pylist()
    assert r.removed_indices().tolist() == [2, 3]  # the copy of the big one is still an exact duplicate
    whole = find_duplicates(table, config=DedupConfig(max_doc_bytes=None))  # compared in full
    assert whole.skipped.num_rows == 0 and whole.removed_indices().tolist() == [2, 3]
