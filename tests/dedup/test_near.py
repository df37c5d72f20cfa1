import numpy as np
import pyarrow as pa
import pytest

from cachetier.errors import BadInputError
from dedup import DedupConfig, find_duplicates
from tests.dedup.conftest import random_doc, vocabulary


def pair_set(result):
    return set(zip(result.pairs.column("left").to_pylist(), result.pairs.column("right").to_pylist()))


def test_planted_near_duplicates_are_found(planted):
    r = find_duplicates(planted["table"])
    removed = set(r.removed_indices().tolist())
    rep = dict(zip(r.removed.column("record").to_pylist(), r.removed.column("representative").to_pylist()))
    for src, copy, jac in planted["triples"]:
        if jac >= 0.85:
            assert copy in removed, (src, copy, jac)
            assert rep[copy] == src  # the first record of the cluster is the one kept
        if jac < 0.5:
            assert (src, copy) not in pair_set(r)
    # Verified pairs are all at or above the threshold.
    assert (r.pairs.column("similarity").to_numpy() >= 0.8).all()
    assert r.keep[:400].all()  # originals are unrelated: none is removed


def test_unrelated_documents_are_never_merged():
    rng = np.random.default_rng(11)
    vocab = vocabulary(rng, 2000)
    texts = [" ".join(random_doc(rng, vocab, 60)) for _ in range(600)]
    for verify in ("exact", "none"):
        r = find_duplicates(pa.table({"text": texts}), config=DedupConfig(verify=verify))
        assert r.removed_records == 0 and r.clusters == 0


def test_determinism_and_partitioning(planted):
    table = planted["table"]
    a = find_duplicates(table)
    b = find_duplicates(table)
    c = find_duplicates(table.to_batches(max_chunksize=37))
    d = find_duplicates(
        lambda: iter(table.to_batches(max_chunksize=101)), config=DedupConfig(chunk_bytes=4096)
    )
    for other in (b, c, d):
        assert np.array_equal(a.keep, other.keep)
        assert a.removed.equals(other.removed)
        assert a.pairs.equals(other.pairs)


def test_verification_modes(planted):
    table = planted["table"]
    exact = find_duplicates(table)
    unverified = find_duplicates(table, config=DedupConfig(verify="none"))
    signature = find_duplicates(table, config=DedupConfig(verify="signature"))
    assert pair_set(exact) <= pair_set(unverified)
    assert unverified.stats["candidate_pairs"] == exact.stats["candidate_pairs"]
    sim = signature.pairs.column("similarity").to_numpy()
    assert len(sim) and (sim >= 0.8).all()
    # Datasketch-like banding (9 x 13) misses pairs that ours finds.
    narrow = find_duplicates(table, config=DedupConfig(bands=9, rows=13))
    assert len(pair_set(narrow)) < len(pair_set(exact))
    assert exact.params["bands"] == 21 and exact.params["rows"] == 6


def test_one_shot_iterator_needs_a_rereadable_source(planted):
    batches = iter(planted["table"].to_batches())
    with pytest.raises(BadInputError, match="read twice"):
        find_duplicates(batches)
    r = find_duplicates(iter(planted["table"].to_batches()), config=DedupConfig(verify="signature"))
    assert r.removed_records > 0
