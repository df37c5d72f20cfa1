"""Faults: an unusable cache degrades to reading through; an object store outage is
retried, then reported clearly, while cached objects keep being served."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cachetier.errors import StoreUnavailableError
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore
from tests.s3server import S3Endpoint, start_s3_server

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unusable_cache_folders_degrade_to_reading_through(
    tmp_path: Path, objects: ObjectStore, put_blobs, make_config
) -> None:
    ids = put_blobs([20_000] * 4)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folders should go")
    config = make_config(dir=blocker / "cache", ram_dir=blocker / "ram")
    with TieredStore(objects, config) as ts:
        for _ in range(2):
            for oid in ids:
                assert objects.hash(ts.read(oid)) == oid
        ts.announce(ids)
        assert ts.warm(ids)["refused"] == 4
        s = ts.stats()
    assert s["scope"] == "process"
    assert s["tiers"]["store"]["fetches"] == 8 + 4  # every read went through (and the warm)
    assert set(s["degraded"]) == {"ram", "ssd"}
    assert "not-a-folder" in s["degraded"]["ssd"]


FULL_DISK = textwrap.dedent(
    """
    import os, resource, signal, sys
    from pathlib import Path
    from cachetier.config import CacheConfig
    from cachetier.localstore import LocalStore
    from cachetier.objects import ObjectStore
    from cachetier.tiered import TieredStore

    tmp = Path(sys.argv[1])
    objects = ObjectStore(LocalStore(tmp / "repo"))
    ids = [objects.put(os.urandom(200_000) + bytes([i])) for i in range(12)]
    config = CacheConfig(dir=tmp / "cache", ram_dir=tmp / "ram", ram_bytes=300_000, ssd_bytes=32 << 20,
                         prefetch_depth=0)
    store = TieredStore(objects, config)
    store.read(ids[0])                                   # both tiers open
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))   # "the disk is full"
    store.evict(tier="ram")                              # so that RAM must write too
    for _ in range(2):
        for oid in ids:
            assert objects.hash(store.read(oid)) == oid
    s = store.stats()
    print(sorted(s["degraded"]), s["tiers"]["ssd"]["errors"] + s["tiers"]["ram"]["errors"] > 0)
    """
)


def test_full_disk_degrades_to_reading_through(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[0] == "['ram', 'ssd'] True"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_store_is_retried_then_reported(s3_server: S3Endpoint, s3_url: str, make_config) -> None:
    config = make_config(fetch_retries=2)
    with s3_server.store(s3_url) as live:
        objects = ObjectStore(live)
        cached, uncached = objects.put(b"cached" * 1000), objects.put(b"not cached" * 1000)
        with TieredStore(objects, config) as ts:
            ts.read(cached)
    gone = S3Endpoint(f"http://127.0.0.1:{_closed_port()}", s3_server.access_key, s3_server.secret_key)
    with (
        gone.store(s3_url, max_attempts=1, connect_timeout=1.0) as dead,
        TieredStore(ObjectStore(dead), config) as ts,
    ):
        assert bytes(ts.read(cached)) == b"cached" * 1000
        with pytest.raises(StoreUnavailableError) as err:
            ts.read(uncached)
        s = ts.stats()["tiers"]["store"]
    message = str(err.value)
    assert "after 3 attempts" in message and uncached in message and "127.0.0.1" in message
    assert s["retries"] == 2 and s["failures"] == 1


@pytest.mark.slow
def test_store_that_goes_away_mid_run(tmp_path: Path, make_config) -> None:
    server = start_s3_server()
    try:
        url = server.endpoint.unique_url()
        store = server.endpoint.store(url, max_attempts=1, connect_timeout=1.0)
        objects = ObjectStore(store)
        ids = [objects.put(bytes([i]) * 50_000) for i in range(6)]
        with TieredStore(objects, make_config(fetch_retries=1, ram_bytes=0)) as ts:
            for oid in ids[:3]:
                ts.read(oid)
            server.stop()
            for oid in ids[:3]:
                assert objects.hash(ts.read(oid)) == oid  # cached data keeps serving
            for oid in ids[3:]:
                with pytest.raises(StoreUnavailableError, match="unreachable after 2 attempts"):
                    ts.read(oid)
            assert ts.stats()["tiers"]["store"]["failures"] == 3
        store.close()
    finally:
        server.stop()


def test_a_ram_tier_folder_deleted_under_a_running_process_comes_back(
    objects: ObjectStore, put_blobs, make_config
) -> None:
    import shutil

    ids = put_blobs([20_000] * 6)
    with TieredStore(objects, make_config(ssd_bytes=0)) as ts:
        ts.health._retry_after = 0.0  # the retry period, shortened for the test
        for _ in range(3):  # read more than once: admitted to RAM
            for oid in ids[:3]:
                ts.read(oid)
        ram_dir, values = ts.ram.root, ts.ram.values
        assert len(list(values.iterdir())) == 3
        shutil.rmtree(ram_dir)  # e.g. someone cleaned /dev/shm while the job ran
        for _ in range(3):
            for oid in ids:
                assert objects.hash(ts.read(oid)) == oid
        assert "ram" not in ts.stats()["degraded"]
        assert len(list(values.iterdir())) >= 3  # admitted again
