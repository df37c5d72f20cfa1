"""A files ingest in two processes gives what one process gives: the same shards in the
same order, the same source digest, counts and ingest index; so does a files checkout
(the same files, a path held twice gets its later record). Errors on either side surface
as the one-line error of one process, and the child never outlives the operation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import datastore._lanes as lanes
from cachetier.errors import BadInputError, IntegrityError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from datastore import _ingestfiles, checkout
from datastore.chunking import ChunkOptions
from datastore.ingest import ingest
from datastore.ingestindex import IngestIndex
from tests.datastore.test_forklane import reaped
from tests.datastore.test_ingest import age

SMALL_CHUNKS = ChunkOptions(threshold=64 << 10, min_size=4 << 10, avg_size=16 << 10, max_size=64 << 10)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def forks(monkeypatch) -> list[int]:
    """Lanes for small trees; the list holds the pid of each child forked."""
    monkeypatch.setattr(lanes, "_MIN_FILES", 10)
    monkeypatch.setattr(lanes, "_MIN_BYTES", 0)
    # Tests before this one in the worker may leave an idle thread (the S3 server's log
    # reader); the CLI process forks with none.
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    pids: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def _tree(root: Path, n: int, seed: int, big_every: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        path = root / f"d{i % 5}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 200_000 if big_every and i % big_every == 0 else int(rng.integers(0, 9000))
        path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    age(root)


def _ingest(tmp_path: Path, name: str, src: Path, lanes_: int, **kwargs):
    objects = ObjectStore(LocalStore(tmp_path / f"repo-{name}"))
    index = IngestIndex.load(tmp_path / f"index-{name}.json", repo=objects.store.url)
    result = ingest([src], objects, index=index, chunk_options=SMALL_CHUNKS, lanes=lanes_, **kwargs)
    index.save()
    return result, index, objects


def _summary(result) -> dict:
    return {
        "shards": [(s.hash, s.records, s.bytes, s.chunks) for s in result.shards],
        "sources": [s["hash"] for s in result.sources],
        "records": result.records,
        "new_bytes": result.new_bytes,
        "new_objects": result.new_objects,
        "reused": result.reused_shards,
        "files_read": result.files_read,
    }


def _index_entries(path: Path) -> tuple:
    raw = json.loads(path.read_text())
    return raw["files"], sorted(v[:5] for v in raw["shards"].values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_lanes_store_what_one_does(forks, tmp_path: Path, seed: int) -> None:
    src = tmp_path / "src"
    _tree(src, 400, seed, big_every=97)  # a few chunked files among small ones
    one, _, _ = _ingest(tmp_path, "one", src, 1)
    assert forks == []
    two, _, objects = _ingest(tmp_path, "two", src, 2)
    assert len(forks) == 1
    assert len(one.shards) > 20
    assert _summary(two) == _summary(one)
    assert _index_entries(tmp_path / "index-two.json") == _index_entries(tmp_path / "index-one.json")
    for shard in two.shards:  # stored by either process, readable from the store
        assert objects.get(shard.hash)


def test_two_lanes_reingest_after_edits(forks, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src, 400, 5)
    for name in ("one", "two"):
        _ingest(tmp_path, name, src, 1 if name == "one" else 2)
    files = sorted(src.rglob("*.bin"))
    for path in (files[10], files[200], files[390]):  # in either half
        path.write_bytes(path.read_bytes() + b"edited")
    age(src, only=[str(p.relative_to(src)) for p in (files[10], files[200], files[390])])
    one, _, _ = _ingest(tmp_path, "one", src, 1)
    two, _, _ = _ingest(tmp_path, "two", src, 2)
    assert len(forks) == 2
    assert _summary(two) == _summary(one)
    assert 0 < two.new_bytes < 0.2 * sum(s.bytes for s in two.shards)
    assert two.reused_shards > 0 and two.files_read < 100


@pytest.mark.parametrize("half", ["first", "second"])
def test_an_error_in_either_lane_is_the_ingest_error(forks, monkeypatch, tmp_path: Path, half: str) -> None:
    src = tmp_path / "src"
    _tree(src, 300, 7)
    victim = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.bin"))[20 if half == "first" else 280]
    real = _ingestfiles.read_files_into

    def failing(entries, display, out, offsets):
        for e in entries:
            if e.path == victim:
                raise BadInputError("permission denied", subject=f"{display}/{e.path}")
        return real(entries, display, out, offsets)

    monkeypatch.setattr(_ingestfiles, "read_files_into", failing)
    with pytest.raises(BadInputError) as info:
        _ingest(tmp_path, "x", src, 2)
    assert victim in str(info.value) and "permission denied" in str(info.value)
    assert len(forks) == 1 and reaped(forks[0])


def test_a_child_that_dies_is_an_error_not_a_hang(forks, monkeypatch, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src, 300, 8)
    parent = os.getpid()
    real = _ingestfiles.read_files_into

    def dying(entries, display, out, offsets):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(entries, display, out, offsets)

    monkeypatch.setattr(_ingestfiles, "read_files_into", dying)
    with pytest.raises(RuntimeError, match="second worker process died"):
        _ingest(tmp_path, "x", src, 2)
    assert len(forks) == 1 and reaped(forks[0])


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def test_kill_9_of_the_ingest_takes_the_child_along(tmp_path: Path) -> None:
    # The default thresholds: 1,200 files, 36 MB.
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    for i in range(1200):
        path = src / f"d{i % 10}" / f"f{i:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes())
    project = tmp_path / "project"
    project.mkdir()
    dataset = [sys.executable, "-m", "datastore.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([*dataset, "init", str(tmp_path / "repo")], cwd=project, env=env, check=True)
    proc = subprocess.Popen([*dataset, "ingest", str(src)], cwd=project, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    children: list[int] = []
    while not children and proc.poll() is None and time.monotonic() < deadline:
        children = _children(proc.pid)
        time.sleep(0.005)
    assert children, "the ingest finished or failed before forking its second lane"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
        time.sleep(0.01)
    gone = [c for c in children if not Path(f"/proc/{c}").exists() or "Z" in _state(c)]
    assert gone == children
    again = subprocess.run([*dataset, "ingest", src, "--json"], cwd=project, env=env, capture_output=True)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["records"] == 1200
    assert subprocess.run([*dataset, "version", "-m", "after"], cwd=project, env=env).returncode == 0
    verify = subprocess.run([*dataset, "verify", "--json"], cwd=project, env=env, capture_output=True)
    assert verify.returncode == 0 and json.loads(verify.stdout)["ok"]


# Two big files ingests and a checkout in one process (as from a notebook), each in two
# lanes, under a deadline: the second ingest's child once hung for ever, because the
# first ingest had started blake3's thread pool, which a forked child does not get.
_THREE_LANE_JOBS = textwrap.dedent("""
    import sys
    from pathlib import Path
    import datastore._lanes as lanes
    import datastore.checkout as checkout
    from datastore.repo import Repo
    lanes._MIN_FILES, lanes._MIN_BYTES = 10, 0
    checkout._LANE_MIN_SHARDS, checkout._LANE_MIN_BYTES = 4, 0
    src, work = Path(sys.argv[1]), Path(sys.argv[2])
    for name in ("one", "two"):
        repo = Repo.init(work / name, workspace=None)
        assert repo.ingest(src)["records"] == 800
        repo.commit(name)
    checkout.materialize(repo, repo.show("main"), work / "out")
    written = sorted(p.relative_to(work / "out") for p in (work / "out").rglob("*.bin"))
    assert written == sorted(p.relative_to(src) for p in src.rglob("*.bin"))
    print("ok")
""")


def test_lanes_run_again_in_a_process_that_hashed_big_objects(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rng = np.random.default_rng(5)
    for i in range(800):  # 24 MB: packs over blake3's threaded size in each lane
        path = src / f"d{i % 8}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes())
    result = subprocess.run(
        [sys.executable, "-c", _THREE_LANE_JOBS, str(src), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


# ---------------------------------------------------------------- checkout


@pytest.fixture
def checkout_forks(forks, monkeypatch) -> list[int]:
    monkeypatch.setattr(checkout, "_LANE_MIN_SHARDS", 4)
    monkeypatch.setattr(checkout, "_LANE_MIN_BYTES", 0)
    return forks


def _committed(cli, url: str, src: Path, n: int, seed: int, big_every: int = 0) -> None:
    _tree(src, n, seed, big_every)
    assert cli("init", url).code == 0
    assert cli("ingest", src).code == 0
    assert cli("version", "-m", "files").code == 0


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_two_lane_checkout_writes_every_file(cli, repo_url: str, checkout_forks, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _committed(cli, repo_url, src, 300, 11, big_every=60)  # chunked files too
    out = tmp_path / "out"
    before = len(checkout_forks)
    done = cli("checkout", "main", "--to", out, "--json")
    assert done.code == 0, done.err
    assert len(checkout_forks) == before + 1 and reaped(checkout_forks[-1])
    assert _files(out) == _files(src)


def test_two_lane_checkout_gives_a_path_held_twice_its_later_record(
    cli, local_url: str, checkout_forks, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    _committed(cli, local_url, src, 200, 12)
    changed = sorted(src.rglob("*.bin"))[:5]
    for path in changed:
        path.write_bytes(b"second version of " + path.name.encode())
    age(src)
    cli("ingest", src)
    cli("version", "-m", "appended")  # every path is now in the version twice
    out = tmp_path / "out"
    before = len(checkout_forks)
    assert cli("checkout", "main", "--to", out).code == 0
    assert len(checkout_forks) == before + 1
    assert _files(out) == _files(src)


def test_an_error_in_the_checkout_child_fails_the_checkout(
    cli, local_url: str, checkout_forks, monkeypatch, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    _committed(cli, local_url, src, 300, 13)
    parent = os.getpid()
    real = checkout.read_shard

    def corrupt_in_child(data, columns=None):
        if os.getpid() != parent:
            raise IntegrityError("object is corrupt: content hashes to 0000…", subject="object abc")
        return real(data, columns)

    monkeypatch.setattr(checkout, "read_shard", corrupt_in_child)
    before = len(checkout_forks)
    failed = cli("checkout", "main", "--to", tmp_path / "out")
    assert failed.code == 1 and "corrupt" in failed.err
    assert len(checkout_forks) == before + 1 and reaped(checkout_forks[-1])


def test_one_process_with_many_writers_gives_a_path_held_twice_its_later_record(
    cli, local_url: str, monkeypatch, tmp_path: Path
) -> None:
    # Jobs are written side by side (four writers on a bigger machine), and here the
    # first record of each path is written slowly, so it lands after the later one
    # unless the checkout writes paths held twice again, in order.
    monkeypatch.setattr(checkout, "_WRITERS", 4)
    monkeypatch.setattr(checkout, "_DECODERS", 4)
    monkeypatch.setattr(checkout, "_JOB_BYTES", 1)  # a job a shard
    real = checkout._write_inline

    def slow_first_records(path, data):
        if not bytes(data).startswith(b"second version"):
            time.sleep(0.002)
        return real(path, data)

    monkeypatch.setattr(checkout, "_write_inline", slow_first_records)
    src = tmp_path / "src"
    _committed(cli, local_url, src, 40, 14)
    for path in sorted(src.rglob("*.bin")):
        path.write_bytes(b"second version of " + path.name.encode())
    age(src)
    cli("ingest", src)
    cli("version", "-m", "appended")
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out).code == 0
    assert _files(out) == _files(src)
