"""Record locks across processes with threads: the kernel's deadlock check sees processes,
not threads, and refuses with EDEADLK where no thread is in a cycle. ``lock_record``
waits that out (the RAM tier's lock and the flight stripes take it)."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cachetier.flight import lock_record


def test_lock_record_waits_out_a_false_deadlock(tmp_path: Path) -> None:
    x = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT)
    y = os.open(tmp_path / "y", os.O_RDWR | os.O_CREAT)
    fcntl.lockf(y, fcntl.LOCK_EX)  # this process holds y
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import fcntl, os, threading, time
                x = os.open({str(tmp_path / "x")!r}, os.O_RDWR)
                y = os.open({str(tmp_path / "y")!r}, os.O_RDWR)
                fcntl.lockf(x, fcntl.LOCK_EX)  # one thread holds x ...
                def wait_for_y():
                    fcntl.lockf(y, fcntl.LOCK_EX)  # ... while another waits for y
                    fcntl.lockf(y, fcntl.LOCK_UN)
                waiter = threading.Thread(target=wait_for_y)
                waiter.start()
                time.sleep(0.3)
                print("ready", flush=True)
                time.sleep(0.5)
                fcntl.lockf(x, fcntl.LOCK_UN)  # the holder of x lets go: no real deadlock
                waiter.join()
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == "ready"
        with pytest.raises(OSError) as refused:  # what a plain lockf says here
            fcntl.lockf(x, fcntl.LOCK_EX)
        assert refused.value.errno == errno.EDEADLK
        started = time.monotonic()
        lock_record(x)
        assert time.monotonic() - started < 10
    finally:
        fcntl.lockf(y, fcntl.LOCK_UN)
        fcntl.lockf(x, fcntl.LOCK_UN)
        assert other.wait(timeout=30) == 0
        os.close(x)
        os.close(y)
