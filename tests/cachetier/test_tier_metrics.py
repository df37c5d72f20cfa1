"""Counters, the stats report, and Prometheus exposition from `serve`."""

from __future__ import annotations

import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from cachetier.daemon import serve
from cachetier.metrics import CacheCounters, FetchCounters, TierCounters, render_prometheus
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore


def test_counters_add_subtract_and_round_trip() -> None:
    a = CacheCounters(reads=3, ram=TierCounters(hits=2), store=FetchCounters())
    a.store.observe(0.004, 100)
    a.store.observe(20.0, 50)
    b = a + a
    assert b.reads == 6 and b.ram.hits == 4 and b.store.bytes_fetched == 300
    assert (b - a).to_dict() == a.to_dict()
    assert CacheCounters.from_dict(b.to_dict()) == b
    latency = a.store.latency_dict()
    assert latency["count"] == 2 and latency["buckets"]["0.0025"] == 0 and latency["buckets"]["0.005"] == 1
    assert latency["buckets"]["+Inf"] == 2


def test_prometheus_text_carries_every_tier_figure(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([5000] * 3)
    with TieredStore(objects, make_config()) as ts:
        for oid in ids * 2:
            ts.read(oid)
        stats = ts.stats()
    text = render_prometheus(stats).decode()
    samples = {
        (s.name, s.labels.get("tier", s.labels.get("le"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for tier in ("ram", "ssd"):
        for key in ("hits", "misses", "evictions", "bytes_read"):
            assert samples[(f"tierdata_cache_{key}_total", tier)] == stats["tiers"][tier][key]
        for key in ("bytes_used", "budget", "entries"):
            assert samples[(f"tierdata_cache_{key}", tier)] == stats["tiers"][tier][key]
    assert samples[("tierdata_store_bytes_fetched_total", None)] == 15000
    assert samples[("tierdata_store_fetch_latency_seconds_bucket", "+Inf")] == 3
    assert render_prometheus({})  # an empty report still renders


def test_serve_exposes_metrics_on_loopback_until_stopped(
    objects: ObjectStore, put_blobs, make_config
) -> None:
    ids = put_blobs([5000] * 2)
    config = make_config()
    with TieredStore(objects, config) as ts:
        for oid in ids:
            ts.read(oid)
    stop, ready, port = threading.Event(), threading.Event(), []
    thread = threading.Thread(
        target=serve,
        kwargs={
            "config": config,
            "metrics_port": 0,
            "interval": 0.05,
            "stop": stop,
            "on_ready": lambda p: (port.append(p), ready.set()),
        },
    )
    thread.start()
    try:
        assert ready.wait(10)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port[0]}/metrics", timeout=10).read().decode()
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert 'tierdata_cache_misses_total{tier="ram"} 2.0' in body
    assert "tierdata_store_fetches_total 2.0" in body
