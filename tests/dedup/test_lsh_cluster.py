import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dedup.cluster import connected_components
from dedup.lsh import band_keys, band_pairs, choose_bands, decode_pairs, encode_pairs, miss_probability


def test_banding_is_chosen_for_recall_at_the_threshold():
    assert choose_bands(0.8, 128) == (21, 6)
    assert miss_probability(0.8, 21, 6) < 0.002
    assert miss_probability(0.8, 9, 13) > 0.5  # datasketch's choice misses most pairs at 0.8
    for t in (0.5, 0.7, 0.9):
        b, r = choose_bands(t, 128)
        assert b * r <= 128 and miss_probability(t, b, r) <= 0.01
        assert miss_probability(t, 128 // (r + 1), r + 1) > 0.01  # and it is the most selective


def test_band_keys_depend_on_band_and_values():
    sigs = np.array([[1, 1, 2], [5, 5, 5], [7, 7, 7], [9, 9, 8]], dtype=np.uint32)  # 4 perms x 3 records
    keys = band_keys(sigs, bands=2, rows=2)
    assert keys.shape == (2, 3)
    assert keys[0, 0] == keys[0, 1] != keys[0, 2]
    assert keys[1, 0] == keys[1, 1] != keys[1, 2]
    assert keys[0, 0] != keys[1, 0]


def test_bucket_pairs_all_pairs_then_capped_chain():
    keys = np.array([5, 9, 5, 5, 1, 9], dtype=np.uint64)
    records = np.array([10, 11, 12, 13, 14, 15])
    pairs = set(zip(*[x.tolist() for x in decode_pairs(np.unique(band_pairs(keys, records, 8)))]))
    assert pairs == {(10, 12), (10, 13), (12, 13), (11, 15)}
    big = np.zeros(100, dtype=np.uint64)
    capped = band_pairs(big, np.arange(100), 3)
    i, j = decode_pairs(capped)
    assert len(capped) == 99 + 98 + 97 and (j - i <= 3).all()
    assert (connected_components(100, i, j) == 0).all()


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.lists(st.tuples(st.integers(0, 59), st.integers(0, 59)), max_size=80))
def test_components_match_a_plain_union_find(n, edges):
    edges = [(a % n, b % n) for a, b in edges]
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in edges:
        ra, rb = find(a), find(b)
        parent[max(ra, rb)] = min(ra, rb)
    expected = [find(x) for x in range(n)]
    i = np.array([a for a, _ in edges], dtype=np.int64)
    j = np.array([b for _, b in edges], dtype=np.int64)
    assert connected_components(n, i, j).tolist() == expected


def test_pair_codes_round_trip():
    i, j = np.array([3, 9, 2**31]), np.array([1, 10, 5])
    a, b = decode_pairs(encode_pairs(i, j))
    assert a.tolist() == [1, 9, 5] and b.tolist() == [3, 10, 2**31]
