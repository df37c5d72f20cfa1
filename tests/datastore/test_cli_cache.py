"""`dataset cache stats | warm | evict | serve`: per-tier figures as JSON and as Prometheus text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from datastore.sample import write_sample_jsonl

TIER_KEYS = {"bytes_used", "budget", "hits", "misses", "evictions"}


def test_cache_commands(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    write_sample_jsonl(src, 4000, seed=3)
    cache = ["--cache-dir", tmp_path / "cache", "--ram-bytes", "8MiB", "--ssd-bytes", "64MiB"]
    assert cli("init", local_url).code == 0
    cli("ingest", src, "--shard-size", "128KB")
    cli("version", "-m", "v")
    warm = cli("cache", "warm", *cache, "--json").json
    assert warm["requested"] >= 4 and warm["admitted"] == warm["requested"] and warm["failed"] == 0
    again = cli("cache", "warm", *cache, "--json").json
    assert again["cached"] == warm["requested"]
    stats = cli("cache", "stats", *cache, "--json").json
    for tier in ("ram", "ssd"):
        assert set(stats["tiers"][tier]) >= TIER_KEYS
    ssd = stats["tiers"]["ssd"]
    assert 0 < ssd["bytes_used"] <= ssd["budget"] == 64 << 20
    assert stats["tiers"]["store"]["bytes_fetched"] >= warm["bytes_fetched"] > 0
    evicted = cli("cache", "evict", *cache, "--json").json
    assert evicted["ssd"] == warm["requested"]
    assert cli("cache", "stats", *cache, "--json").json["tiers"]["ssd"]["entries"] == 0


def test_cache_serve_exposes_prometheus_metrics(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "datastore.cli", "cache", "serve", "--cache-dir", str(tmp_path / "cache"),
         "--ssd-bytes", "64MB", "--metrics-port", "0", "--interval", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        port = json.loads(line)["metrics_port"]
        deadline = time.monotonic() + 20
        while True:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert 'tierdata_cache_bytes_used{tier="ssd"}' in body
        assert "tierdata_store_fetch_latency_seconds" in body
        assert proc.poll() is None  # still serving
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_warmed_version_streams_without_the_objects(cli, local_url: str, tmp_path: Path) -> None:
    from cachetier.config import CacheConfig
    from loaders import StreamingDataLoader, StreamingDataset

    src = tmp_path / "c.jsonl"
    write_sample_jsonl(src, 3000, seed=4)
    assert cli("init", local_url).code == 0
    cli("ingest", src, "--shard-size", "64KiB")
    cli("version", "-m", "v")
    cache_dir = tmp_path / "cache"
    warm = cli("cache", "warm", "--cache-dir", cache_dir, "--ssd-bytes", "64MiB", "--json").json
    assert warm["failed"] == 0 and warm["admitted"] == warm["requested"]
    for folder in ("objects", "packs"):  # the data is gone from the store; refs and versions stay
        if (Path(local_url) / folder).exists():
            (Path(local_url) / folder).rename(tmp_path / f"moved-{folder}")
    config = CacheConfig(dir=cache_dir, ssd_bytes="64MiB", ram_bytes="8MiB")
    dataset = StreamingDataset(local_url, "main", cache=config, columns=["id"], batch_size=100)
    ids = [i for batch in StreamingDataLoader(dataset, batch_size=None) for i in batch["id"].tolist()]
    assert sorted(ids) == sorted(json.loads(line)["id"] for line in src.read_text().splitlines())
