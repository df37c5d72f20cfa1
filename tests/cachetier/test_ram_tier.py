"""The RAM tier: zero-copy hits, budget in real tmpfs blocks, crash safety, damage detection."""

from __future__ import annotations

import mmap
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachetier.errors import NotFoundError, StoreUnavailableError
from cachetier.ramtier import RamTier

REPO_ROOT = Path(__file__).resolve().parents[2]


def allocated(root: Path) -> int:
    """What tmpfs really holds for the tier: allocated blocks of every file in it."""
    return sum(p.stat().st_blocks * 512 for p in (root / "v").iterdir())


def test_round_trip_and_store_interface(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=1 << 20)
    tier.put("a", b"alpha")
    tier.put("oid:decoded", b"decoded form")
    tier.put(".hidden/slash", b"odd key")
    assert tier.get("a") == b"alpha"
    assert tier.get("oid:decoded", byte_range=(0, 7)) == b"decoded"
    assert tier.get(".hidden/slash") == b"odd key"
    assert sorted(i.key for i in tier.list()) == [".hidden/slash", "a", "oid:decoded"]
    assert [i.size for i in tier.list("oid")] == [12]
    tier.put("a", b"replaced")
    assert tier.get("a") == b"replaced"
    tier.delete("a")
    assert not tier.exists("a")
    with pytest.raises(NotFoundError):
        tier.get("a")


def test_a_hit_is_a_view_of_the_mapped_file(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=8 << 20)
    value = os.urandom(4 << 20)
    tier.put("shard", value)
    view = tier.view("shard")
    assert isinstance(view.obj, mmap.mmap)  # the bytes are the file's pages: nothing copied
    assert view.readonly and view.nbytes == len(value) and view == value
    tier.delete("shard")
    assert view[:64] == value[:64]  # an evicted value stays readable through a held view


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "delete"]), st.integers(0, 15), st.integers(0, 200_000)),
        min_size=1,
        max_size=40,
    ),
)
def test_allocated_bytes_never_exceed_the_budget(shm_dir: Path, ops) -> None:
    budget = 512 << 10
    tier = RamTier(shm_dir / f"t{random.getrandbits(32)}", budget=budget)
    for op, key, size in ops:
        if op == "put":
            stored = tier.admit(f"k{key}", os.urandom(size))
            assert stored or size + 32 > budget
        else:
            tier.delete(f"k{key}")
        assert allocated(tier.root) <= budget
        assert tier.usage()["bytes_used"] == allocated(tier.root)


def test_damaged_file_is_detected_and_dropped(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=1 << 20)
    tier.put("x", b"payload" * 100)
    path = next((shm_dir / "v").iterdir())
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(raw)
    assert tier.view("x") is None
    assert tier.counters.corrupt == 1 and not tier.exists("x")
    tier.put("y", b"abc")
    (shm_dir / "v" / "y").write_bytes(b"")  # truncated to nothing
    assert tier.view("y") is None


def test_a_value_verified_once_is_verified_again_when_its_file_changes(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=1 << 20)
    tier.put("x", b"payload" * 100)
    assert tier.view("x") == b"payload" * 100  # verified, remembered by file identity
    path = shm_dir / "v" / "x"
    raw = bytearray(path.read_bytes())
    raw[40] ^= 1
    time.sleep(0.001)
    path.write_bytes(raw)  # same inode, new mtime
    assert tier.view("x") is None and tier.counters.corrupt == 1


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from cachetier.ramtier import RamTier
    tier = RamTier(sys.argv[1], budget=64 << 20)
    tier.put("done", b"complete value")
    original = os.pwrite
    def slow_pwrite(fd, data, offset):
        n = original(fd, bytes(data)[:1000], offset)   # write a little, then hang mid-value
        print("writing", flush=True)
        time.sleep(60)
        return n
    os.pwrite = slow_pwrite
    if sys.argv[2] == "put":
        tier.put("torn", os.urandom(8 << 20))
    else:  # written in place, as a decoder does
        tier.admit_pending("torn", tier.write_pending(lambda sink: sink.write(os.urandom(8 << 20))))
    """
)


@pytest.mark.parametrize("how", ["put", "pending"])
def test_kill_9_mid_write_leaves_nothing_that_breaks_the_next_run(shm_dir: Path, how: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(shm_dir), how],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        temps = [p for p in (shm_dir / "v").iterdir() if p.name.startswith(".tmp.")]
        assert temps, "the writer should be mid-write"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    tier = RamTier(shm_dir, budget=64 << 20)
    assert tier.view("torn") is None  # never visible half-written
    assert tier.get("done") == b"complete value"
    start = time.monotonic()
    tier.put("next", b"the lock was released by the kernel")
    assert time.monotonic() - start < 5
    assert not [p for p in (shm_dir / "v").iterdir() if p.name.startswith(".tmp.")]  # cleaned
    assert tier.usage()["bytes_used"] == allocated(shm_dir)


def test_refused_and_oversized_values(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=64 << 10)
    assert tier.admit("big", os.urandom(100 << 10)) is False
    assert tier.admit("a", os.urandom(40 << 10))
    assert tier.admit("b", os.urandom(40 << 10), lambda missing, residents, txn: None) is False
    assert tier.counters.rejections == 1 and tier.exists("a")
    assert tier.admit("b", os.urandom(40 << 10), lambda m, rs, txn: [r.key for r in rs])
    assert not tier.exists("a") and tier.exists("b")


def test_unusable_folder_raises_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    tier = RamTier(blocker / "ram", budget=1 << 20)
    with pytest.raises(StoreUnavailableError, match="file"):
        tier.put("k", b"v")
    assert tier.view("k") is None


FORK_WHILE_LOCKED = textwrap.dedent(
    """
    import os, sys, threading, time
    from cachetier.ramtier import RamTier
    tier = RamTier(sys.argv[1], budget=1 << 20)
    tier.open()
    held = threading.Event()
    def hold():
        with tier._locked():
            held.set()
            time.sleep(0.3)
    threading.Thread(target=hold).start()
    held.wait()
    pid = os.fork()                      # the child is born while the parent holds the lock
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    start = time.monotonic()
    tier.put("after", b"x")              # must not wait for the child to exit
    print(round(time.monotonic() - start, 1))
    os.waitpid(pid, 0)
    """
)


def test_a_forked_child_does_not_inherit_the_admission_lock(shm_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_LOCKED, str(shm_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < 2.0


def _write_chunks(chunks: list[bytes]):
    def write(sink) -> None:
        for chunk in chunks:
            sink.write(chunk)

    return write


def temp_files(root: Path) -> list[str]:
    return [p.name for p in (root / "v").iterdir() if p.name.startswith(".tmp.")]


def test_a_value_written_in_place_is_admitted_framed_and_checked(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=8 << 20)
    chunks = [os.urandom(n) for n in (10, 1 << 20, 3, 70_000)]
    pending = tier.write_pending(_write_chunks(chunks))
    assert isinstance(pending.view.obj, mmap.mmap) and pending.view == b"".join(chunks)
    assert not tier.exists("k") and len(temp_files(shm_dir)) == 1
    assert tier.admit_pending("k", pending)
    assert temp_files(shm_dir) == [] and pending.path is None
    other = RamTier(shm_dir, budget=8 << 20)  # another process: checks the frame's checksum
    assert other.get("k") == b"".join(chunks) and other.counters.corrupt == 0
    assert tier.usage()["bytes_used"] == allocated(shm_dir)


def test_a_refused_pending_value_stays_readable_and_leaves_no_file(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=64 << 10)
    assert tier.admit("a", os.urandom(40 << 10))
    value = os.urandom(40 << 10)
    pending = tier.write_pending(_write_chunks([value]))
    assert tier.admit_pending("b", pending, lambda missing, residents, txn: None) is False
    assert tier.counters.rejections == 1 and tier.exists("a") and not tier.exists("b")
    assert temp_files(shm_dir) == [] and pending.view == value
    big = tier.write_pending(_write_chunks([os.urandom(100 << 10)]))
    assert tier.admit_pending("big", big) is False and temp_files(shm_dir) == []
    again = tier.write_pending(_write_chunks([value]))
    assert tier.admit_pending("b", again, lambda m, rs, txn: [r.key for r in rs])
    assert not tier.exists("a") and tier.get("b") == value
    assert allocated(shm_dir) <= 64 << 10


def test_a_failed_or_dropped_pending_write_leaves_nothing(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=1 << 20)

    def failing(sink) -> None:
        sink.write(b"half a value")
        raise ValueError("decoder broke")

    with pytest.raises(ValueError, match="decoder broke"):
        tier.write_pending(failing)
    assert temp_files(shm_dir) == []
    pending = tier.write_pending(_write_chunks([b"never admitted"]))
    assert len(temp_files(shm_dir)) == 1
    del pending  # dropped without admit: its file goes with it
    assert temp_files(shm_dir) == []
    with pytest.raises(StoreUnavailableError):
        blocked = RamTier(shm_dir / "file-not-dir", budget=1 << 20)
        (shm_dir / "file-not-dir").write_text("x")
        blocked.write_pending(_write_chunks([b"v"]))


def test_a_forked_child_leaves_its_parents_pending_file_alone(shm_dir: Path) -> None:
    tier = RamTier(shm_dir, budget=1 << 20)
    pending = tier.write_pending(_write_chunks([b"the parent's value"]))
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the pending value and exits normally
        del pending
        import gc

        gc.collect()
        os._exit(0 if len(temp_files(shm_dir)) == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert tier.admit_pending("k", pending) and tier.get("k") == b"the parent's value"
