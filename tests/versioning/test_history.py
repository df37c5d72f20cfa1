from __future__ import annotations

import pytest

from cachetier.errors import BadInputError, NotFoundError
from tests.versioning.helpers import make_version, put_shard, record_hashes
from versioning import diff, load_version, log


def test_log_follows_first_parents_newest_first(store, objects):
    ids = []
    for i in range(5):
        ids.append(make_version(store, objects, [], tuple(ids[-1:]), f"v{i}"))
    side = make_version(store, objects, [], (), "side branch")
    merge = make_version(store, objects, [], (ids[-1], side), "merge")
    got = list(log(store, merge))
    assert [vid for vid, _ in got] == [merge, *reversed(ids)]
    assert [r.message for _, r in got] == ["merge", "v4", "v3", "v2", "v1", "v0"]
    assert [vid for vid, _ in log(store, merge, limit=2)] == [merge, ids[-1]]
    assert list(log(store, merge, limit=0)) == []
    with pytest.raises(BadInputError):
        list(log(store, merge, limit=-1))


def test_log_of_missing_version_names_it(store):
    with pytest.raises(NotFoundError, match="d" * 64):
        list(log(store, "d" * 64))


def test_diff_counts_shards_and_records(store, objects):
    s1 = put_shard(objects, ["a", "b", "c"])
    s2 = put_shard(objects, ["d", "e"])
    s3 = put_shard(objects, ["f", "g", "h", "i"])
    s2_edited = put_shard(objects, ["d", "E", "x"])  # one record changed, one added
    v1 = make_version(store, objects, [s1, s2, s3])
    v2 = make_version(store, objects, [s1, s2_edited, s3], (v1,))

    shard_level = diff(objects, v1, v2)
    assert (shard_level.added_shards, shard_level.removed_shards) == (1, 1)
    assert (shard_level.added_records, shard_level.removed_records) == (3, 2)
    assert not shard_level.record_level

    opened = []
    hashes = record_hashes(objects)

    def tracked(shard_id):
        opened.append(shard_id)
        return hashes(shard_id)

    exact = diff(objects, v1, v2, record_hashes=tracked)
    assert exact.record_level
    assert (exact.added_shards, exact.removed_shards) == (1, 1)
    assert (exact.added_records, exact.removed_records) == (2, 1)
    assert sorted(opened) == sorted([s2.hash, s2_edited.hash])  # only the differing shards
    d = exact.to_dict()
    assert {"added_records", "removed_records", "added_shards", "removed_shards"} <= set(d)
    assert all(
        type(d[k]) is int for k in ("added_records", "removed_records", "added_shards", "removed_shards")
    )
    assert (d["records_before"], d["records_after"]) == (9, 10)

    backwards = diff(objects, v2, v1, record_hashes=hashes)
    assert (backwards.added_records, backwards.removed_records) == (1, 2)


def test_diff_treats_shards_and_records_as_multisets(store, objects):
    s1 = put_shard(objects, ["a", "a", "b"])
    s2 = put_shard(objects, ["c"])
    v1 = make_version(store, objects, [s1])
    v2 = make_version(store, objects, [s1, s1, s2], (v1,))  # the same data appended again
    d = diff(objects, v1, v2, record_hashes=record_hashes(objects))
    assert (d.added_shards, d.removed_shards) == (2, 0)
    assert (d.added_records, d.removed_records) == (4, 0)
    moved = put_shard(objects, ["b", "a", "a"])  # same records, reshuffled into a new shard
    v3 = make_version(store, objects, [moved], (v1,))
    d = diff(objects, v1, v3, record_hashes=record_hashes(objects))
    assert (d.added_shards, d.removed_shards) == (1, 1)
    assert (d.added_records, d.removed_records) == (0, 0)


def test_diff_of_equal_versions_is_empty(store, objects):
    v1 = make_version(store, objects, [put_shard(objects, ["a"])], (), "one")
    v2 = make_version(store, objects, [put_shard(objects, ["a"])], (v1,), "same data")
    assert load_version(store, v1).data_hash == load_version(store, v2).data_hash
    d = diff(objects, v1, v2, record_hashes=record_hashes(objects))
    assert (d.added_shards, d.removed_shards, d.added_records, d.removed_records) == (0, 0, 0, 0)
