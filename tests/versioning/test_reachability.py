from __future__ import annotations

import os
import time

import pytest

from cachetier.errors import BadInputError, IntegrityError, NotFoundError
from cachetier.objects import object_key
from cachetier.packs import index_key, list_packs, pack_key
from tests.versioning.helpers import make_version, put_shard
from versioning import (
    RefStore,
    ShardEntry,
    load_version,
    reachable,
    reachable_objects,
    unreachable,
    version_key,
)


def age(store, key: str, seconds: float) -> None:
    """Make ``key`` look ``seconds`` old."""
    then = time.time() - seconds
    os.utime(store.root / key, (then, then))


@pytest.fixture
def repo(store, objects):
    """main: v1 <- v2 (v2 has a chunked shard and an audit object); tag t1 -> t; deleted branch -> d."""
    refs = RefStore(store)
    shared = put_shard(objects, ["shared"])
    chunk = objects.put(b"a chunk of a big file")
    chunked = put_shard(objects, ["big file"], chunks=(chunk,))
    audit = objects.put(b"removed ids")
    v1 = make_version(store, objects, [shared], (), "v1")
    v2 = make_version(store, objects, [shared, chunked], (v1,), "v2", audit=audit)
    refs.set_branch("main", v2, None)
    tagged_shard = put_shard(objects, ["only tagged"])
    t = make_version(store, objects, [tagged_shard], (), "tagged")
    refs.create_tag("t1", t)
    gone_shard = put_shard(objects, ["only on a deleted branch"])
    d = make_version(store, objects, [gone_shard], (v1,), "deleted")
    refs.create_branch("tmp", d)
    refs.delete_branch("tmp")
    stray = objects.put(b"written by a crashed ingest")
    table = lambda vid: load_version(store, vid).data_hash  # noqa: E731
    return {
        "live_objects": {
            shared.hash,
            chunked.hash,
            chunk,
            audit,
            tagged_shard.hash,
            table(v1),
            table(v2),
            table(t),
        },
        "dead_objects": {gone_shard.hash, table(d), stray},
        "live_versions": {v1, v2, t},
        "dead_versions": {d},
    }


def test_reachable_from_branches_tags_parents_chunks_and_audits(store, objects, repo):
    live = reachable(store, objects)
    assert set(live.objects) == repo["live_objects"]
    assert set(live.versions) == repo["live_versions"]
    assert reachable_objects(store, objects) == repo["live_objects"]
    all_objects = {oid for oid, _ in objects.list()}
    assert all_objects == repo["live_objects"] | repo["dead_objects"]


def test_unreachable_respects_the_grace_period(store, objects, repo):
    assert unreachable(store, objects, grace_seconds=3600) == []  # everything is brand new
    items = unreachable(store, objects, grace_seconds=3600, now=time.time() + 7200)
    assert {i.oid for i in items if i.kind == "object"} == repo["dead_objects"]
    assert {i.oid for i in items if i.kind == "version"} == repo["dead_versions"]
    assert [i.key for i in items] == sorted(i.key for i in items)
    for item in items:
        path = store.root / item.key
        assert item.size == path.stat().st_size
        assert item.mtime == path.stat().st_mtime


def test_only_old_unreachable_items_are_listed(store, objects, repo):
    old_dead = sorted(repo["dead_objects"])[0]
    age(store, object_key(old_dead), 7200)
    for live in repo["live_objects"]:
        age(store, object_key(live), 7200)  # old but referenced: never listed
    (dead_version,) = repo["dead_versions"]
    age(store, version_key(dead_version), 7200)
    items = unreachable(store, objects, grace_seconds=3600)
    assert [(i.kind, i.oid) for i in items] == sorted(
        [("object", old_dead), ("version", dead_version)], key=lambda kv: kv[0] != "object"
    )
    assert unreachable(store, objects, grace_seconds=3600, keep=[old_dead]) == [
        i for i in items if i.oid != old_dead
    ]


def test_reachability_fails_closed_on_a_missing_table(store, objects, repo):
    main = RefStore(store).get_branch("main")
    objects.delete(load_version(store, main).data_hash)
    with pytest.raises(NotFoundError):
        unreachable(store, objects, grace_seconds=0, now=time.time() + 10)


def test_negative_grace_is_refused(store, objects):
    with pytest.raises(BadInputError, match="-1"):
        unreachable(store, objects, grace_seconds=-1)


def test_empty_repository_has_nothing_reachable(store, objects):
    assert reachable_objects(store, objects) == set()
    stray = objects.put(b"x")
    assert [i.oid for i in unreachable(store, objects, grace_seconds=0, now=time.time() + 1)] == [stray]


def packed_shard(writer, objects, records: list[str]) -> ShardEntry:
    """Queue a real shard object in ``writer``'s open pack and return its entry."""
    data = "\n".join(records).encode()
    oid = objects.hash(data)
    assert writer.add(oid, data)
    return ShardEntry(oid, len(records), len(data), len(data), 0, ())


def test_packs_are_removed_whole_only_when_no_member_is_reachable(store, objects):
    writer = objects.pack_writer()
    live = packed_shard(writer, objects, ["live"])
    dead_neighbour = packed_shard(writer, objects, ["dead, in the live pack"])
    writer.flush()
    dead = [packed_shard(writer, objects, [f"dead {i}"]) for i in range(3)]
    writer.flush()
    crashed = b"a pack whose index was never written"
    crashed_id = objects.hash(crashed)
    store.put(pack_key(crashed_id), crashed)
    RefStore(store).set_branch("main", make_version(store, objects, [live], (), "v"), None)
    live_pack = objects.packs.locate(live.hash).packid
    dead_pack = objects.packs.locate(dead[0].hash).packid
    assert objects.packs.locate(dead_neighbour.hash).packid == live_pack != dead_pack

    assert [i for i in unreachable(store, objects, grace_seconds=3600) if i.kind == "pack"] == []
    later = time.time() + 7200
    items = {i.oid: i for i in unreachable(store, objects, grace_seconds=3600, now=later) if i.kind == "pack"}
    assert set(items) == {dead_pack, crashed_id}  # the pack with one live member is kept
    assert set(items[dead_pack].members) == {d.hash for d in dead}
    assert items[dead_pack].keys == (index_key(dead_pack), pack_key(dead_pack))
    assert items[dead_pack].size == sum((store.root / k).stat().st_size for k in items[dead_pack].keys)
    assert items[crashed_id].keys == (pack_key(crashed_id),) and items[crashed_id].members == ()
    kept = unreachable(store, objects, grace_seconds=3600, now=later, keep=[dead[1].hash])
    assert {i.oid for i in kept if i.kind == "pack"} == {crashed_id}

    # a touched pack (a member reused by a pending ingest) is young again
    for key in (pack_key(dead_pack), index_key(dead_pack)):
        age(store, key, 7200)
    assert dead_pack in {i.oid for i in unreachable(store, objects, grace_seconds=3600)}
    assert objects.touch_if_exists(dead[2].hash)
    assert dead_pack not in {i.oid for i in unreachable(store, objects, grace_seconds=3600)}


def test_a_pack_with_an_unreadable_index_fails_closed(store, objects):
    writer = objects.pack_writer()
    packed_shard(writer, objects, ["x"])
    writer.flush()
    (pack,) = list_packs(store)
    (store.root / index_key(pack.packid)).write_bytes(b"not an index")
    with pytest.raises(IntegrityError):
        unreachable(store, objects, grace_seconds=0, now=time.time() + 10)
