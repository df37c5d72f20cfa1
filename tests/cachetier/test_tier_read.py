"""TieredStore's read path: tiers in order, placement, decoded values, warm/evict, damage."""

from __future__ import annotations

import json
import mmap
import os
import zlib

import pytest

from cachetier.config import CacheConfig
from cachetier.errors import NotFoundError
from cachetier.objects import ObjectStore
from cachetier.tiered import StreamingDecoder, TieredStore, decoded_key


def test_reads_return_the_stored_bytes_from_every_tier(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([50_000] * 12)
    with TieredStore(objects, make_config(ram_bytes=200_000, ssd_bytes=300_000)) as ts:
        for _epoch in range(3):
            for oid in ids:
                assert objects.hash(ts.read(oid)) == oid
                assert ts.get(oid) == objects.get(oid)
        placed = {oid: ts.contains(oid) for oid in ids}
        s = ts.stats()
    assert s["tiers"]["ram"]["hits"] > 0 and s["tiers"]["ssd"]["hits"] > 0
    assert any(p == ["ram"] for p in placed.values()) and any(p == ["ssd"] for p in placed.values())
    assert s["tiers"]["ram"]["bytes_used"] <= 200_000 and s["tiers"]["ssd"]["bytes_used"] <= 300_000


def test_one_job_keeps_a_fixed_resident_set(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([40_000] * 30)
    with TieredStore(objects, make_config(ram_bytes=0, ssd_bytes=400_000)) as ts:
        import random

        rng = random.Random(3)
        fetched = []
        for _epoch in range(4):
            before = ts.counters.store.fetches
            for oid in rng.sample(ids, len(ids)):
                ts.read(oid)
            fetched.append(ts.counters.store.fetches - before)
        resident = len(ts.ssd.residents())
    assert fetched[0] == 30
    assert fetched[1:] == [30 - resident] * 3  # every resident hit every epoch: the C/N ceiling
    assert resident >= 8


def test_ram_hit_is_zero_copy(objects: ObjectStore, put_blobs, make_config) -> None:
    (oid,) = put_blobs([1 << 20])
    with TieredStore(objects, make_config(ram_bytes=4 << 20)) as ts:
        ts.read(oid)
        view = ts.read(oid)
        assert ts.contains(oid)[0] == "ram"
        assert isinstance(view.obj, mmap.mmap) and view.readonly
        assert objects.hash(view) == oid


def test_decoded_values_skip_decoding_when_hot(objects: ObjectStore, make_config) -> None:
    raw = zlib.compress(b"record " * 50_000)
    oid = objects.put(raw)
    calls = []

    def decode(view: memoryview) -> bytes:
        calls.append(1)
        return zlib.decompress(view)

    with TieredStore(objects, make_config(ram_bytes=2 << 20)) as ts:
        first = ts.get_decoded(oid, decode)
        second = ts.get_decoded(oid, decode)
        assert bytes(first) == bytes(second) == b"record " * 50_000
        assert len(calls) == 1
        assert isinstance(second.obj, mmap.mmap)
        assert ts.ram.exists(decoded_key(oid))
        ts.evict([oid], tier="ram")  # drops the decoded form with the raw one
        assert not ts.ram.exists(decoded_key(oid))
        assert bytes(ts.get_decoded(oid, decode)) == b"record " * 50_000  # decoded again, from SSD
        assert len(calls) == 2


@pytest.mark.parametrize("verify", ["checksum", "hash"])
def test_corrupt_cached_values_are_dropped_and_refetched(
    objects: ObjectStore, put_blobs, make_config, verify: str
) -> None:
    a, b = put_blobs([30_000, 30_000])
    with TieredStore(objects, make_config(verify=verify, ram_bytes=100_000)) as ts:
        ts.read(a)  # lands in RAM
        ts.warm([b])  # lands in SSD
        assert ts.contains(a) == ["ram"] and ts.contains(b) == ["ssd"]
        ram_file = ts.ram.values / a
        damaged = bytearray(ram_file.read_bytes())
        damaged[-5] ^= 0x40
        ram_file.write_bytes(damaged)
        with ts.ssd.env.write() as txn:
            frame = bytearray(txn.get(b.encode(), db=ts.ssd.env.db("data")))
            frame[-5] ^= 0x40
            if verify == "hash":  # a consistent frame with the wrong bytes: only the id catches it
                from cachetier._frame import frame_header

                frame = bytearray(frame_header(frame[32:])) + frame[32:]
            txn.put(b.encode(), bytes(frame), db=ts.ssd.env.db("data"))
        fetches = ts.counters.store.fetches
        assert objects.hash(ts.read(a)) == a and objects.hash(ts.read(b)) == b
        assert ts.counters.store.fetches == fetches + 2  # both re-fetched from the object store
        assert ts.counters.ram.corrupt == 1 and ts.counters.ssd.corrupt == 1


def test_missing_object_is_not_found(objects: ObjectStore, make_config) -> None:
    with TieredStore(objects, make_config()) as ts, pytest.raises(NotFoundError):
        ts.read("0" * 64)


def test_warm_fills_free_space_only_and_evict_empties(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([100_000] * 8)
    with TieredStore(objects, make_config(ram_bytes=0, ssd_bytes=450_000)) as ts:
        for oid in ids[:2]:
            ts.read(oid)
            ts.read(oid)
        report = ts.warm(ids)
        assert report["requested"] == 8 and report["cached"] == 2
        assert report["admitted"] == 2 and report["refused"] == 4
        assert all(ts.contains(oid) == ["ssd"] for oid in ids[:2])  # warming never pushed out hot data
        assert ts.evict(ids[:1]) == {"ram": 0, "ssd": 1}
        assert ts.evict() == {"ram": 0, "ssd": 3}
        assert ts.stats()["tiers"]["ssd"]["entries"] == 0


def test_stats_are_json_and_node_wide(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([10_000] * 5)
    config: CacheConfig = make_config()
    with TieredStore(objects, config) as a:
        for oid in ids:
            a.read(oid)
    with TieredStore(None, config) as observer:  # another process's view (e.g. `dataset cache stats`)
        s = json.loads(json.dumps(observer.stats()))
    assert s["scope"] == "node" and s["reads"] == 5
    for tier in ("ram", "ssd"):
        assert {"bytes_used", "budget", "hits", "misses", "evictions", "bytes_read"} <= set(s["tiers"][tier])
    assert s["tiers"]["store"]["fetches"] == 5
    assert s["tiers"]["store"]["bytes_fetched"] == 50_000
    assert s["tiers"]["store"]["fetch_latency"]["count"] == 5


def test_prefetch_follows_the_announced_plan(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([20_000] * 10)
    with TieredStore(objects, make_config(prefetch_depth=3, ram_bytes=1 << 20)) as ts:
        ts.announce(ids)
        ts.prefetcher.wait()
        assert all(ts.contains(oid)[:1] == ["ram"] for oid in ids[:3])
        assert not ts.contains(ids[5])
        for oid in ids:
            ts.read(oid)
            ts.prefetcher.wait()
        s = ts.stats()
    assert s["tiers"]["ram"]["hits"] == 10  # every read found its shard staged in RAM
    assert s["tiers"]["store"]["fetches"] == 10


def test_plans_are_shared_between_stores_of_the_node(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([1000] * 4)
    config = make_config()
    with TieredStore(objects, config) as reader, TieredStore(objects, config) as other:
        reader.announce(list(reversed(ids)), reader="job-a")
        other.hints.refresh(force=True)
        uses = other.hints.next_use(ids)
    assert uses == {ids[3]: 0, ids[2]: 1, ids[1]: 2, ids[0]: 3}


class _Zlib(StreamingDecoder):
    """A streaming decoder: writes the decompressed value in pieces."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, raw: memoryview) -> bytes:
        self.calls.append("memory")
        return zlib.decompress(raw)

    def write_to(self, raw: memoryview, sink) -> None:
        self.calls.append("stream")
        value = zlib.decompress(raw)
        for start in range(0, len(value), 100_000):
            sink.write(value[start : start + 100_000])


def test_a_streaming_decoder_writes_straight_into_the_ram_tier(objects: ObjectStore, make_config) -> None:
    value = os.urandom(1 << 20) + b"record " * 50_000
    oid = objects.put(zlib.compress(value))
    decode = _Zlib()
    with TieredStore(objects, make_config(ram_bytes=4 << 20)) as ts:
        first = ts.get_decoded(oid, decode)
        assert isinstance(first.obj, mmap.mmap) and first.readonly and first == value
        assert decode.calls == ["stream"] and ts.ram.exists(decoded_key(oid))
        assert bytes(ts.get_decoded(oid, decode)) == value and decode.calls == ["stream"]  # a hit
        assert not [p for p in (ts.ram.values).iterdir() if p.name.startswith(".tmp.")]
    with TieredStore(objects, make_config(ram_bytes=0)) as ts:  # no RAM tier: decoded in memory
        assert bytes(ts.get_decoded(oid, decode)) == value and decode.calls[-1] == "memory"


def test_a_decoded_value_bigger_than_ram_is_still_served_and_leaves_no_file(
    objects: ObjectStore, make_config
) -> None:
    value = os.urandom(1 << 14) * 192  # 3 MiB that compresses below the 1 MiB budget
    oid = objects.put(zlib.compress(value))
    assert len(objects.get(oid)) < 1 << 20
    decode = _Zlib()
    with TieredStore(objects, make_config(ram_bytes=1 << 20)) as ts:  # the tier refuses it
        view = ts.get_decoded(oid, decode)
        assert view == value and decode.calls == ["stream"]
        assert not ts.ram.exists(decoded_key(oid))
        assert not [p for p in ts.ram.values.iterdir() if p.name.startswith(".tmp.")]
        assert bytes(ts.get_decoded(oid, decode)) == value  # decoded again: nothing cached
        assert ts.ram.usage()["bytes_used"] <= 1 << 20


def test_a_stored_value_bigger_than_ram_is_decoded_in_memory_not_in_tmpfs(
    objects: ObjectStore, make_config
) -> None:
    # Its decoded form is bigger still: writing it to tmpfs first would exceed the budget.
    value = os.urandom(2 << 20)
    oid = objects.put(zlib.compress(value))
    decode = _Zlib()
    with TieredStore(objects, make_config(ram_bytes=1 << 20)) as ts:
        assert ts.get_decoded(oid, decode) == value and decode.calls == ["memory"]
        assert ts.stats()["tiers"]["ram"]["rejections"] == 1
        assert not list(ts.ram.values.iterdir())
