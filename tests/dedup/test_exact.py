import json

import numpy as np
import pyarrow as pa
import pytest

from cachetier.errors import BadInputError
from dedup import DedupConfig, find_duplicates
from dedup.exact import content_keys, exact_eligible, exact_representatives
from dedup.normalize import normalize_array

EXACT = DedupConfig(method="exact")


def test_exact_ignores_case_and_punctuation_and_keeps_first():
    texts = ["Hello, World!", "unrelated text here", "hello world", "HELLO   WORLD.", "unrelated text here"]
    r = find_duplicates(pa.table({"text": texts}), config=EXACT)
    assert r.keep.tolist() == [True, True, False, False, False]
    assert r.removed.to_pylist() == [
        {"record": 2, "cluster": 0, "representative": 0, "reason": "exact", "exact_of": 0},
        {"record": 3, "cluster": 0, "representative": 0, "reason": "exact", "exact_of": 0},
        {"record": 4, "cluster": 1, "representative": 1, "reason": "exact", "exact_of": 1},
    ]
    assert r.clusters == 2
    summary = r.summary()
    assert summary["removed_records"] == 3 and summary["exact_removed"] == 3
    json.dumps(r.to_dict())  # the audit is JSON-able


def test_exact_bytes_content_is_byte_exact():
    data = [b"\x00\x01binary", b"\x00\x01BINARY", b"\x00\x01binary", None, b""]
    r = find_duplicates(
        pa.table({"data": pa.array(data, pa.large_binary())}),
        column="data",
        config=DedupConfig(method="exact", content="bytes"),
    )
    assert r.removed_indices().tolist() == [2]
    assert r.skipped.to_pylist() == [{"record": 3, "reason": "null"}, {"record": 4, "reason": "empty"}]


def test_exact_across_batches_and_parts():
    texts = [f"doc number {i % 50}" for i in range(200)]
    table = pa.table({"text": texts})
    whole = find_duplicates(table, config=EXACT)
    parts = find_duplicates([b for b in table.to_batches(max_chunksize=33)], config=EXACT)
    assert whole.removed.equals(parts.removed)
    assert whole.removed_records == 150 and int(whole.keep[:50].sum()) == 50


def test_representatives_are_first_in_order():
    norm = normalize_array(pa.array(["b", "a", "b", None, "a", "c"]))
    rep = exact_representatives(content_keys(norm, exact_eligible(norm.status)), exact_eligible(norm.status))
    assert rep.tolist() == [0, 1, 0, -1, 1, 5]


def test_minhash_needs_text_and_column_errors():
    with pytest.raises(BadInputError, match="content"):
        DedupConfig(method="minhash", content="bytes")
    with pytest.raises(BadInputError, match="threshold"):
        DedupConfig(threshold=1.5)
    with pytest.raises(BadInputError, match="'body' not found"):
        find_duplicates(pa.table({"text": ["a"]}), column="body")
    with pytest.raises(BadInputError, match="string or binary"):
        find_duplicates(pa.table({"text": np.arange(3)}))


def test_keys_are_xxh3_128_of_the_normalized_text():
    import xxhash

    norm = normalize_array(pa.array(["Hello,  World!", None]))
    keys = content_keys(norm, exact_eligible(norm.status))
    digest = xxhash.xxh3_128_digest(b"hello world")
    assert keys[0].tobytes() == digest
    assert keys[1].tolist() == [0, 0]


def test_empty_inputs():
    empty = pa.table({"text": pa.array([], pa.string())})
    for config in (EXACT, DedupConfig()):
        r = find_duplicates(empty, config=config)
        assert r.records == 0 and r.removed_records == 0 and r.clusters == 0
    assert find_duplicates([], config=EXACT).records == 0
