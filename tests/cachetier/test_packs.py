"""Packs: small objects stored together, read back transparently and verified by their own ids.

Runs on a local store and on the real S3 server. The request counter below wraps a real
store and only counts calls (no behaviour is faked)."""

from __future__ import annotations

import os
import pickle
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cachetier.errors import BadInputError, IntegrityError, NotFoundError, UsageError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore, object_key
from cachetier.packs import (
    PackEntry,
    PackMap,
    PackWriter,
    decode_index,
    encode_index,
    index_key,
    index_oids,
    list_packs,
    pack_key,
)
from cachetier.store import Store
from datastore._pipeline import Uploader


class CountingStore(Store):
    """A real store that counts the calls made to it, by method and by key prefix."""

    def __init__(self, inner: Store):
        self.inner = inner
        self.url = inner.url
        self.calls: Counter[str] = Counter()

    def get(self, key, byte_range=None):
        self.calls["get-range" if byte_range else "get"] += 1
        return self.inner.get(key, byte_range)

    def put(self, key, data):
        self.calls["put"] += 1
        return self.inner.put(key, data)

    def exists(self, key):
        self.calls["exists"] += 1
        return self.inner.exists(key)

    def delete(self, key):
        return self.inner.delete(key)

    def list(self, prefix=""):
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def touch(self, key):
        self.calls["touch"] += 1
        return self.inner.touch(key)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        yield LocalStore(tmp_path / "repo")
    else:
        yield request.getfixturevalue("s3_store")


def blobs(n: int, seed: int, low: int = 100, high: int = 5000) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(low, high)) for _ in range(n)]


def write_pack(objects: ObjectStore, datas: list[bytes], **kw) -> list[str]:
    writer = PackWriter(objects.store, objects.packs, algorithm=objects.algorithm, **kw)
    oids = []
    for data in datas:
        oid = objects.hash(data)
        writer.add(oid, data)
        oids.append(oid)
    writer.flush()
    return oids


def test_pack_round_trip_is_read_by_a_fresh_object_store(store: Store) -> None:
    datas = blobs(50, seed=1)
    oids = write_pack(ObjectStore(store), datas)
    (pack,) = list_packs(store)
    assert pack.pack is not None and pack.index is not None
    assert pack.pack.size == sum(len(d) for d in datas)
    assert not list(store.list("objects/"))  # nothing standalone
    fresh = ObjectStore(store)
    for oid, data in zip(oids, datas):
        assert fresh.exists(oid)
        assert fresh.get(oid) == data
    # a member is a range of the pack, at the offset the index gives
    member = fresh.packs.locate(oids[7])
    assert store.get(pack_key(member.packid), (member.offset, member.offset + member.length)) == datas[7]
    assert index_oids(decode_index(store.get(index_key(pack.packid)))) == oids
    assert not fresh.exists("0" * 64)
    with pytest.raises(NotFoundError):
        fresh.get("0" * 64)


def test_pack_id_is_the_hash_of_the_pack_bytes(store: Store) -> None:
    objects = ObjectStore(store)
    write_pack(objects, blobs(5, seed=2))
    (pack,) = list_packs(store)
    assert objects.hash(store.get(pack_key(pack.packid))) == pack.packid


def test_a_corrupt_byte_in_a_member_names_that_member(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    datas = blobs(20, seed=3)
    oids = write_pack(ObjectStore(store), datas)
    fresh = ObjectStore(store)
    victim = fresh.packs.locate(oids[5])
    path = store.root / pack_key(victim.packid)
    raw = bytearray(path.read_bytes())
    raw[victim.offset + victim.length // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError) as err:
        fresh.get(oids[5])
    assert oids[5] in str(err.value)
    assert fresh.get(oids[4]) == datas[4] and fresh.get(oids[6]) == datas[6]
    got = []
    with pytest.raises(IntegrityError, match=oids[5]):
        for oid, data in fresh.get_many(oids):
            got.append((oid, data))
    assert got == list(zip(oids[:5], datas[:5]))  # everything before it, in order


def test_get_many_keeps_order_with_packed_and_standalone_mixed(store: Store) -> None:
    objects = ObjectStore(store)
    packed = blobs(120, seed=4)
    packed_ids = write_pack(objects, packed[:60], target_bytes=40_000) + write_pack(objects, packed[60:])
    loose = blobs(10, seed=5)
    loose_ids = [objects.put(d) for d in loose]
    assert len(list_packs(store)) >= 3
    by_id = dict(zip(packed_ids + loose_ids, packed + loose))
    order = packed_ids + loose_ids
    random.Random(6).shuffle(order)
    order += order[:7]  # repeats come back too
    fresh = ObjectStore(store)
    assert [oid for oid, _ in fresh.get_many(order)] == order
    assert all(by_id[oid] == data for oid, data in fresh.get_many(order))


def test_get_many_reads_neighbouring_members_with_one_range_read(tmp_path: Path) -> None:
    store = CountingStore(LocalStore(tmp_path / "repo"))
    datas = blobs(3000, seed=7, low=1000, high=3000)
    oids = write_pack(ObjectStore(store), datas)
    assert len(list_packs(store.inner)) == 1
    fresh = ObjectStore(store)
    store.calls.clear()
    assert [d for _, d in fresh.get_many(oids)] == datas
    # ~6 MB of members: a few range reads of at most 4 MiB each, not 3,000
    assert store.calls["get-range"] <= 4, store.calls
    assert store.calls["exists"] == 0


def test_a_pack_written_by_another_store_is_found_after_a_refresh(store: Store) -> None:
    reader = ObjectStore(store)
    early = write_pack(ObjectStore(store), blobs(3, seed=8))
    assert reader.get(early[0])  # loads the map
    later_data = blobs(4, seed=9)
    later = write_pack(ObjectStore(store), later_data)  # another process, say
    assert reader.packs.locate(later[0]) is None  # not yet known ...
    assert reader.get(later[0]) == later_data[0]  # ... found by one refresh
    assert reader.exists(later[1])
    assert [d for _, d in reader.get_many(later)] == later_data


def test_a_missing_pack_makes_each_member_missing(store: Store) -> None:
    datas = blobs(6, seed=10)
    oids = write_pack(ObjectStore(store), datas)
    reader = ObjectStore(store)
    assert reader.exists(oids[0])
    (pack,) = list_packs(store)
    store.delete(pack_key(pack.packid))  # the data gone, the index still there
    for oid in oids:
        with pytest.raises(NotFoundError, match=oid):
            reader.get(oid)
    store.delete(index_key(pack.packid))
    for oid in oids:
        assert not reader.exists(oid)
        with pytest.raises(NotFoundError, match=oid):
            ObjectStore(store).get(oid)


def test_a_pack_without_index_is_invisible(store: Store) -> None:
    data = b"written, then the process died before the index"
    objects = ObjectStore(store)
    oid = objects.hash(data)
    store.put(pack_key(objects.hash(data)), data)
    assert not objects.exists(oid)
    with pytest.raises(NotFoundError):
        objects.get(oid)
    (pack,) = list_packs(store)
    assert pack.index is None and pack.pack is not None


def test_touching_a_packed_member_touches_its_index(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    oids = write_pack(ObjectStore(store), blobs(3, seed=11))
    (pack,) = list_packs(store)
    old = time.time() - 7200
    for key in (pack_key(pack.packid), index_key(pack.packid)):
        os.utime(store.root / key, (old, old))
    assert ObjectStore(store).touch_if_exists(oids[1])
    (after,) = list_packs(store)
    assert after.mtime > old + 3600 and after.index.mtime > old + 3600
    store.delete(index_key(pack.packid))
    store.delete(pack_key(pack.packid))
    fresh = ObjectStore(store)
    assert fresh.packs.locate(oids[1]) is None
    assert not fresh.touch_if_exists(oids[1])


def test_writer_dedups_and_abort_writes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    objects = ObjectStore(store)
    writer = objects.pack_writer()
    data = b"x" * 100
    oid = objects.hash(data)
    assert writer.add(oid, data) is True
    assert writer.add(oid, data) is False  # queued already
    writer.abort()
    writer.flush()
    assert list_packs(store) == []
    with pytest.raises(UsageError):
        writer.add(oid, data)
    second = objects.pack_writer()
    assert second.add(oid, data)
    second.flush()
    assert objects.pack_writer().add(oid, data) is False  # packed already


def test_concurrent_adds_give_complete_packs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    objects = ObjectStore(store)
    writer = PackWriter(store, objects.packs, algorithm=objects.algorithm, target_bytes=50_000)
    datas = blobs(800, seed=12)

    def work(part: list[bytes]) -> None:
        for d in part:
            writer.add(objects.hash(d), d)

    threads = [threading.Thread(target=work, args=(datas[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.flush()
    packs = list_packs(store)
    assert len(packs) == writer.packs_written > 10
    members = [oid for p in packs for oid in index_oids(decode_index(store.get(index_key(p.packid))))]
    assert sorted(members) == sorted({objects.hash(d) for d in datas})
    fresh = ObjectStore(store)
    assert all(fresh.get(objects.hash(d)) == d for d in datas)


def test_uploader_packs_small_objects_and_drops_them_when_cancelled(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    objects = ObjectStore(store)
    small, big = b"s" * 1000, b"b" * (2 << 20)
    with Uploader(objects, workers=2, budget=1 << 20) as up:
        assert up.put(objects.hash(small), small)
        assert up.put(objects.hash(big), big)
        assert not up.put(objects.hash(small), small)
    assert up.new_objects == 2 and up.new_bytes == len(small) + len(big)
    assert store.exists(object_key(objects.hash(big)))  # big objects stay standalone
    assert not store.exists(object_key(objects.hash(small)))
    assert ObjectStore(store).get(objects.hash(small)) == small
    assert len(list_packs(store)) == 1

    other = b"t" * 1000
    up = Uploader(objects, workers=2, budget=1 << 20)
    up.put(objects.hash(other), other)
    up.close(cancel=True)
    assert len(list_packs(store)) == 1 and not ObjectStore(store).exists(objects.hash(other))

    with pytest.raises(RuntimeError), Uploader(objects, workers=2, budget=1 << 20) as up:
        up.put(objects.hash(other), other)
        raise RuntimeError("the ingest failed")
    assert len(list_packs(store)) == 1


def test_index_format_checks_itself_and_loads_fast(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 50_000
    raws = rng.bytes(32 * n)
    entries = [PackEntry(raws[32 * i : 32 * i + 32], 100 * i, 100) for i in range(n)]
    data = encode_index(entries, 100 * n)
    assert len(data) == 56 + 48 * n
    table = decode_index(data)
    assert int(table["offset"][-1]) == 100 * (n - 1)
    bad = bytearray(data)
    bad[1000] ^= 1
    with pytest.raises(IntegrityError, match="checksum"):
        decode_index(bytes(bad))
    with pytest.raises(IntegrityError):
        decode_index(data[:-5])
    with pytest.raises(IntegrityError, match="past the end"):
        decode_index(encode_index(entries[:3], 150))

    store = LocalStore(tmp_path / "repo")
    store.put(pack_key("ab" * 32), b"")  # the map needs only the index
    store.put(index_key("ab" * 32), data)
    packs = PackMap(store)
    started = time.perf_counter()
    member = packs.locate(raws[32 * 123 : 32 * 124].hex())
    elapsed = time.perf_counter() - started
    assert member is not None and member.offset == 12_300 and len(packs) == n
    assert elapsed < 2.0, elapsed  # ~50 ms on the development machine; generous for a loaded one


def test_an_object_store_pickles_without_its_pack_map(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    objects = ObjectStore(store)
    datas = blobs(3, seed=13)
    oids = write_pack(objects, datas)
    assert objects.packs.locate(oids[0]) is not None
    clone = pickle.loads(pickle.dumps(objects))
    assert len(clone.packs) == 0  # loaded afresh on first use
    assert clone.get(oids[0]) == datas[0]


def test_a_forked_child_does_not_inherit_a_held_lock(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    datas = blobs(3, seed=14)
    oids = write_pack(ObjectStore(store), datas)
    objects = ObjectStore(store)
    with objects.packs._refresh_lock:  # as if another thread were refreshing at fork time
        pid = os.fork()
        if pid == 0:  # the child
            os._exit(0 if objects.get(oids[1]) == datas[1] else 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the child hung on a lock held in the parent")


def test_a_failed_pack_write_fails_the_writer(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "packs").write_bytes(b"a file where the packs folder should be")
    objects = ObjectStore(store)
    writer = PackWriter(store, objects.packs, algorithm=objects.algorithm, target_bytes=1000)
    datas = blobs(5, seed=15, low=2000, high=3000)
    writer.add(objects.hash(datas[0]), datas[0])  # handed to a writer thread, which fails
    with pytest.raises(BadInputError):
        writer.flush()
    with pytest.raises(BadInputError):
        writer.add(objects.hash(datas[1]), datas[1])
    with pytest.raises(BadInputError), Uploader(objects, workers=2, budget=1 << 20) as up:
        up.put(objects.hash(datas[2]), datas[2])  # written (and failing) when the uploader closes
