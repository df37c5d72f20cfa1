"""One conformance suite that every object-store backend passes.

:class:`StoreConformance` holds the tests; a backend subclasses it and supplies three
fixtures: ``store`` (a fresh, empty store), ``raw_put`` (writes bytes under a key behind
the store's back, to simulate corruption) and ``child_env`` (environment variables with
which a subprocess reopens ``store.url``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError, ConflictError, IntegrityError, NotFoundError
from cachetier.hashing import content_hash
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore, object_key
from cachetier.registry import open_store
from cachetier.store import Store
from tests.cachetier.cas_worker import increment_by_cas
from tests.s3server import S3Endpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
RawPut = Callable[[str, bytes], None]

# Each backend class runs the same property with its own fresh store fixture.
fixture_settings = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
)


class StoreConformance:
    """The behaviour every :class:`~cachetier.store.Store` backend promises."""

    @pytest.fixture
    def store(self) -> Iterator[Store]:
        raise NotImplementedError

    @pytest.fixture
    def raw_put(self, store: Store) -> RawPut:
        raise NotImplementedError

    @pytest.fixture
    def child_env(self) -> dict[str, str]:
        return {}

    # ------------------------------------------------------------------ values

    @pytest.mark.parametrize(
        "value",
        [b"", b"x", bytes(range(256)) * 3, b"\x00" * 1000, os.urandom(3 << 20)],
        ids=["empty", "one-byte", "all-bytes", "zeros", "3MiB-random"],
    )
    def test_put_get_round_trip(self, store: Store, value: bytes) -> None:
        store.put("v/value", value)
        assert store.get("v/value") == value
        assert store.exists("v/value")

    def test_put_accepts_bytes_like(self, store: Store) -> None:
        store.put("ba", bytearray(b"abc"))
        store.put("mv", memoryview(b"xyzw")[1:3])
        assert store.get("ba") == b"abc"
        assert store.get("mv") == b"yz"

    def test_put_replaces_value(self, store: Store) -> None:
        store.put("k", b"first value, longer")
        store.put("k", b"second")
        assert store.get("k") == b"second"

    def test_non_ascii_and_space_keys(self, store: Store) -> None:
        key = "données/ünï code/日本 語.bin"
        store.put(key, b"ok")
        assert store.get(key) == b"ok"
        assert [i.key for i in store.list("données/")] == [key]

    @fixture_settings
    @given(
        key=st.lists(st.text("abcXYZ019-_", min_size=1, max_size=8), min_size=1, max_size=4).map("/".join),
        value=st.binary(max_size=4096),
    )
    def test_round_trip_property(self, store: Store, key: str, value: bytes) -> None:
        key = f"p/{uuid.uuid4().hex}/{key}"  # a fresh folder: no key here is another's folder
        store.put(key, value)
        assert store.get(key) == value
        assert [(i.key, i.size) for i in store.list(key)] == [(key, len(value))]

    # ------------------------------------------------------------------ ranges

    @pytest.mark.parametrize(
        "byte_range",
        [(0, 10), (3, 7), (0, 0), (5, 5), (7, 3), (95, 100), (90, 1000), (100, 200), (500, 600)],
    )
    def test_byte_range(self, store: Store, byte_range: tuple[int, int]) -> None:
        data = bytes(range(100))
        store.put("r", data)
        start, end = byte_range
        assert store.get("r", byte_range) == data[start:end]

    @fixture_settings
    @given(data=st.binary(max_size=2000), start=st.integers(0, 2100), length=st.integers(0, 2100))
    def test_byte_range_property(self, store: Store, data: bytes, start: int, length: int) -> None:
        store.put("rp", data)
        assert store.get("rp", (start, start + length)) == data[start : start + length]

    def test_byte_range_of_empty_value(self, store: Store) -> None:
        store.put("e", b"")
        assert store.get("e", (0, 10)) == b""

    def test_negative_byte_range_is_refused(self, store: Store) -> None:
        store.put("r", b"abc")
        with pytest.raises(BadInputError):
            store.get("r", (-1, 2))

    # ------------------------------------------------------------------ missing keys, bad keys

    def test_missing_key_raises_not_found(self, store: Store, tmp_path: Path) -> None:
        for read in (
            lambda: store.get("no/such"),
            lambda: store.get("no/such", (0, 5)),
            lambda: store.get("no/such", (3, 3)),
            lambda: store.read_versioned("no/such"),
            lambda: store.get_to_file("no/such", tmp_path / "out"),
        ):
            with pytest.raises(NotFoundError) as info:
                read()
            assert "no/such" in str(info.value)
            assert isinstance(info.value, FileNotFoundError)
        assert not (tmp_path / "out").exists()
        assert not store.exists("no/such")

    def test_folder_of_keys_is_not_a_key(self, store: Store) -> None:
        store.put("dir/child", b"x")
        assert not store.exists("dir")
        with pytest.raises(NotFoundError):
            store.get("dir")
        store.delete("dir")  # not a key: deleting it is a no-op
        assert store.get("dir/child") == b"x"

    def test_path_below_a_value_is_not_a_key(self, store: Store) -> None:
        store.put("file", b"x")
        assert not store.exists("file/child")
        with pytest.raises(NotFoundError):
            store.get("file/child")
        store.delete("file/child")
        assert store.get("file") == b"x"

    @pytest.mark.parametrize("key", ["", "/abs", "a//b", "../up", "a/../b", "a/./b", "trailing/"])
    def test_invalid_keys_are_refused(self, store: Store, key: str) -> None:
        with pytest.raises(BadInputError):
            store.put(key, b"x")
        with pytest.raises(BadInputError):
            store.get(key)

    # ------------------------------------------------------------------ exists, delete, list

    def test_touch_refreshes_mtime_and_keeps_the_value(self, store: Store) -> None:
        store.put("t/x", b"value")
        before = next(iter(store.list("t/x"))).mtime
        time.sleep(1.1)  # S3 last-modified has one-second resolution
        store.touch("t/x")
        after = next(iter(store.list("t/x"))).mtime
        assert after > before
        assert store.get("t/x") == b"value"
        with pytest.raises(NotFoundError):
            store.touch("t/missing")

    def test_info_gives_what_list_gives(self, store: Store) -> None:
        store.put("i/x", b"12345")
        store.put("i/xy", b"1")
        [listed] = [info for info in store.list("i/") if info.key == "i/x"]
        info = store.info("i/x")
        assert (info.key, info.size) == ("i/x", 5) and abs(info.mtime - listed.mtime) < 1.0
        with pytest.raises(NotFoundError):
            store.info("i/missing")

    def test_delete_is_idempotent(self, store: Store) -> None:
        store.put("d/x", b"1")
        store.delete("d/x")
        assert not store.exists("d/x")
        store.delete("d/x")
        store.delete("never/was")
        with pytest.raises(NotFoundError):
            store.get("d/x")

    def test_list_by_prefix_with_sizes(self, store: Store) -> None:
        values = {
            "a/1": b"1",
            "a/b/2": b"22",
            "a/b/c/3": b"333",
            "ab/4": b"4444",
            "abc": b"",
            "z": b"zz",
        }
        for key, value in values.items():
            store.put(key, value)
        before = time.time()

        def listed(prefix: str) -> dict[str, int]:
            return {info.key: info.size for info in store.list(prefix)}

        assert listed("") == {k: len(v) for k, v in values.items()}
        assert listed("a/") == {"a/1": 1, "a/b/2": 2, "a/b/c/3": 3}
        assert listed("a/b") == {"a/b/2": 2, "a/b/c/3": 3}
        assert listed("ab") == {"ab/4": 4, "abc": 0}
        assert listed("a/b/c/3") == {"a/b/c/3": 3}
        assert listed("nothing/") == {}
        assert listed("q") == {}
        for info in store.list(""):
            assert abs(info.mtime - before) < 3600  # a real timestamp, in seconds

    def test_list_after_delete(self, store: Store) -> None:
        store.put("l/1", b"1")
        store.put("l/2", b"2")
        store.delete("l/1")
        assert [i.key for i in store.list("l/")] == ["l/2"]

    # ------------------------------------------------------------------ atomic writes

    def test_put_is_atomic_for_readers(self, store: Store) -> None:
        size = 2 << 20
        old, new = b"o" * size, b"n" * size
        store.put("atomic", old)
        seen: set[bytes] = set()
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                value = store.get("atomic")
                seen.add(value[:1] + value[-1:] + str(len(value)).encode())

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for i in range(12):
                store.put("atomic", new if i % 2 == 0 else old)
        finally:
            stop.set()
            thread.join()
        assert seen <= {b"oo" + str(size).encode(), b"nn" + str(size).encode()}
        assert [i.key for i in store.list("")] == ["atomic"]  # no temp files or parts visible

    # ------------------------------------------------------------------ files

    def test_put_file_and_get_to_file_20mb(self, store: Store, tmp_path: Path) -> None:
        source = tmp_path / "big.bin"
        data = os.urandom(1 << 20) * 20 + b"tail"
        source.write_bytes(data)
        store.put_file("files/big.bin", source)
        assert {i.key: i.size for i in store.list("files/")} == {"files/big.bin": len(data)}
        out = tmp_path / "out" / "copy.bin"
        out.parent.mkdir()
        out.write_bytes(b"old content to be replaced")
        store.get_to_file("files/big.bin", out)
        assert content_hash(out.read_bytes()) == content_hash(data)
        assert store.get("files/big.bin", (len(data) - 4, len(data))) == b"tail"
        assert sorted(p.name for p in out.parent.iterdir()) == ["copy.bin"]

    def test_put_file_of_empty_file(self, store: Store, tmp_path: Path) -> None:
        (tmp_path / "empty").write_bytes(b"")
        store.put_file("empty", tmp_path / "empty")
        store.get_to_file("empty", tmp_path / "back")
        assert (tmp_path / "back").read_bytes() == b""

    # ------------------------------------------------------------------ compare-and-swap

    def test_supports_cas(self, store: Store) -> None:
        assert store.supports_cas
        assert not store.readonly

    def test_cas_create_if_absent(self, store: Store) -> None:
        token = store.compare_and_swap("refs/heads/main", b"v1", None)
        assert store.read_versioned("refs/heads/main").data == b"v1"
        assert store.read_versioned("refs/heads/main").token == token
        with pytest.raises(ConflictError) as info:
            store.compare_and_swap("refs/heads/main", b"v2", None)
        assert "refs/heads/main" in str(info.value)
        assert store.get("refs/heads/main") == b"v1"

    def test_cas_swap_and_stale_token(self, store: Store) -> None:
        store.put("ref", b"v1")
        first = store.read_versioned("ref")
        second_token = store.compare_and_swap("ref", b"v2", first.token)
        assert second_token != first.token
        assert store.read_versioned("ref") == type(first)(b"v2", second_token)
        with pytest.raises(ConflictError):
            store.compare_and_swap("ref", b"v3", first.token)  # stale: someone moved it
        assert store.get("ref") == b"v2"
        store.compare_and_swap("ref", b"v3", second_token)
        assert store.get("ref") == b"v3"

    def test_cas_with_token_on_missing_key_conflicts(self, store: Store) -> None:
        store.put("gone", b"x")
        token = store.read_versioned("gone").token
        store.delete("gone")
        with pytest.raises(ConflictError):
            store.compare_and_swap("gone", b"y", token)
        assert not store.exists("gone")

    def test_cas_race_between_threads_loses_no_update(self, store: Store) -> None:
        workers, each = 8, 6
        with ThreadPoolExecutor(workers) as pool:
            conflicts = sum(pool.map(lambda _: increment_by_cas(store, "counter", each), range(workers)))
        assert int(store.get("counter")) == workers * each
        assert conflicts > 0, "the threads never raced: the test proved nothing"

    def test_cas_race_between_processes_loses_no_update(
        self, store: Store, child_env: dict[str, str]
    ) -> None:
        workers, each = 4, 15
        env = {**os.environ, **child_env, "PYTHONPATH": str(REPO_ROOT)}
        command = [sys.executable, "-m", "tests.cachetier.cas_worker", store.url, "counter", str(each)]
        procs = [
            subprocess.Popen(
                command,
                env=env,
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(workers)
        ]
        try:
            for proc in procs:  # every worker has its store open: start them at once
                assert proc.stdout is not None and proc.stdout.readline() == b"ready\n", proc.stderr
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
            outputs = [proc.communicate(timeout=120) for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
        for proc, (_, err) in zip(procs, outputs):
            assert proc.returncode == 0, err.decode()
        assert int(store.get("counter")) == workers * each
        conflicts = sum(int(out) for out, _ in outputs)
        print(f"{workers} processes x {each} increments: {conflicts} swaps lost a race and retried")

    def test_reopen_by_url(
        self, store: Store, child_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for name, value in child_env.items():
            monkeypatch.setenv(name, value)
        store.put("shared", b"seen from another handle")
        with open_store(store.url) as other:
            assert other.get("shared") == b"seen from another handle"

    # ------------------------------------------------------------------ content-addressed objects

    def test_object_store_round_trip(self, store: Store) -> None:
        objects = ObjectStore(store)
        blobs = [b"alpha", b"beta" * 1000, b""]
        oids = objects.put_many(blobs)
        assert oids == [content_hash(b) for b in blobs]
        assert dict(objects.get_many(oids)) == dict(zip(oids, blobs))
        assert objects.put(b"alpha") == oids[0]
        assert sorted(oid for oid, _ in objects.list()) == sorted(oids)
        objects.delete(oids[0])
        assert not objects.exists(oids[0])
        with pytest.raises(NotFoundError):
            objects.get(oids[0])

    def test_object_store_detects_corruption(self, store: Store, raw_put: RawPut) -> None:
        objects = ObjectStore(store)
        oid = objects.put(b"the true bytes")
        raw_put(object_key(oid), b"the TRUE bytes")
        with pytest.raises(IntegrityError) as info:
            objects.get(oid)
        assert oid in str(info.value)
        assert objects.get(oid, verify=False) == b"the TRUE bytes"
        with pytest.raises(IntegrityError):
            dict(objects.get_many([oid]))


class TestLocalStore(StoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        with LocalStore(tmp_path / "repo") as store:
            yield store

    @pytest.fixture
    def raw_put(self, store: Store) -> RawPut:
        assert isinstance(store, LocalStore)

        def write(key: str, data: bytes) -> None:
            (store.root / key).write_bytes(data)

        return write


class TestS3Store(StoreConformance):
    @pytest.fixture
    def store(self, s3_store: Store) -> Store:
        return s3_store

    @pytest.fixture
    def raw_put(self, store: Store, s3_server: S3Endpoint) -> RawPut:
        import io

        client = s3_server.minio_client()
        bucket, _, prefix = store.url.removeprefix("s3://").partition("/")

        def write(key: str, data: bytes) -> None:
            client.put_object(bucket, f"{prefix}/{key}", io.BytesIO(data), len(data))

        return write

    @pytest.fixture
    def child_env(self, s3_env: dict[str, str]) -> dict[str, str]:
        return s3_env
