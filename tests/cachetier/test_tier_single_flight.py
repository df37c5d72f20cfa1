"""Processes that miss on one object at once fetch and decode it once; a crash frees the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cachetier.config import CacheConfig
from cachetier.flight import FlightLocks
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore

REPO_ROOT = Path(__file__).resolve().parents[2]

#: Waits for the ``go`` file, reads ``oid`` decoded (a slow decode that logs its pid),
#: prints its own fetch count.
READER = textwrap.dedent(
    """
    import json, os, sys, time
    from cachetier.config import CacheConfig
    from cachetier.localstore import LocalStore
    from cachetier.objects import ObjectStore
    from cachetier.tiered import TieredStore
    args = json.loads(sys.argv[1])

    def slow_reverse(view):
        with open(args["log"], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(args["decode_s"])
        return bytes(view)[::-1]

    objects = ObjectStore(LocalStore(args["repo"]))
    with TieredStore(objects, CacheConfig(**args["config"])) as store:
        while not os.path.exists(args["go"]):
            time.sleep(0.001)
        view = store.get_decoded(args["oid"], slow_reverse, kind="reversed")
        assert bytes(view) == objects.get(args["oid"])[::-1]
        print(json.dumps({"fetches": store.counters.store.fetches}))
    """
)


def _start(args: dict) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", READER, json.dumps(args)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_lines(path: Path, n: int, timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.01)
    raise AssertionError(f"{path} never got {n} lines")


def _reader_args(tmp_path: Path, oid: str, make_config: Callable[..., CacheConfig]) -> dict:
    """READER's arguments: its decode log is ``decodes.log``, its start signal ``go``."""
    config = make_config(ram_bytes=4 << 20, ssd_bytes=4 << 20)
    return {
        "repo": str(tmp_path / "repo"),
        "oid": oid,
        "config": config.to_dict(),
        "log": str(tmp_path / "decodes.log"),
        "go": str(tmp_path / "go"),
    }


def test_processes_missing_at_once_fetch_and_decode_once(
    tmp_path: Path, objects: ObjectStore, put_blobs: Callable[..., list[str]], make_config
) -> None:
    (oid,) = put_blobs([300_000])
    args = _reader_args(tmp_path, oid, make_config) | {"decode_s": 0.5}
    log, go = Path(args["log"]), Path(args["go"])
    procs = [_start(args) for _ in range(3)]
    time.sleep(1.0)  # let every process import and open the cache before the start signal
    go.touch()
    fetches = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        fetches.append(json.loads(out)["fetches"])
    assert sorted(fetches) == [0, 0, 1]
    assert len(log.read_text().split()) == 1  # one decode for the three readers


def test_a_filler_killed_mid_fill_does_not_block_the_others(
    tmp_path: Path, objects: ObjectStore, put_blobs: Callable[..., list[str]], make_config
) -> None:
    (oid,) = put_blobs([100_000])
    args = _reader_args(tmp_path, oid, make_config)
    log = Path(args["log"])
    Path(args["go"]).touch()
    stuck = _start(args | {"decode_s": 600})
    (stuck_pid,) = _wait_for_lines(log, 1)  # it holds the fill lock, decoding
    waiter = _start(args | {"decode_s": 0})
    time.sleep(2.0)
    assert waiter.poll() is None and len(log.read_text().split()) == 1  # waits, does not fill
    os.kill(stuck.pid, signal.SIGKILL)
    stuck.wait(timeout=30)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err[-2000:]
    assert json.loads(out)["fetches"] <= 1  # the dead filler may have left the raw bytes on SSD
    assert _wait_for_lines(log, 2) == [stuck_pid, str(waiter.pid)]


def test_threads_of_one_process_take_turns_on_a_key(tmp_path: Path) -> None:
    locks = FlightLocks(tmp_path / "flight.lock")
    inside, peak, mutex = [0], [0], threading.Lock()

    def fill() -> None:
        with locks.hold("some-object"):
            with mutex:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.05)
            with mutex:
                inside[0] -= 1

    threads = [threading.Thread(target=fill) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1
    locks.close()


def test_a_reader_of_a_filled_object_does_not_wait_for_the_lock(
    tmp_path: Path, objects: ObjectStore, put_blobs: Callable[..., list[str]], make_config
) -> None:
    (oid,) = put_blobs([50_000])
    with TieredStore(objects, make_config()) as store:
        store.read(oid)
        assert store.flights is not None
        with store.flights.hold(oid):  # a hit must not take the fill lock
            done = threading.Event()
            threading.Thread(target=lambda: (store.read(oid), done.set())).start()
            assert done.wait(10)
