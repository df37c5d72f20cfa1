"""The LMDB (SSD) tier: budget in real pages, zero-copy reads, damage detection, fork rules."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachetier.errors import NotFoundError, StoreUnavailableError
from cachetier.lmdbtier import LmdbTier, SharedEnv

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_tier(path: Path, budget: int, headroom: float = 0.1) -> LmdbTier:
    env = SharedEnv(path, map_size=int(budget * (1 + headroom)), budget=budget)
    return LmdbTier(env, budget=budget)


def run_script(script: str, env_path: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter with the environment's path as its argument."""
    return subprocess.run(
        [sys.executable, "-c", script, str(env_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pages_in_use(tier: LmdbTier) -> int:
    with tier.env.read() as txn:
        return tier.env.used_bytes(txn)


def test_round_trip_and_store_interface(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "env", 4 << 20)
    tier.put("a", b"alpha")
    tier.put("b", os.urandom(100_000))
    assert tier.get("a") == b"alpha"
    assert tier.get("b", byte_range=(10, 20)) == tier.get("b")[10:20]
    assert tier.exists("a") and not tier.exists("zzz")
    assert sorted(i.key for i in tier.list()) == ["a", "b"]
    assert [i.size for i in tier.list("a")] == [5]
    tier.put("a", b"replaced")
    assert tier.get("a") == b"replaced"
    tier.delete("a")
    with pytest.raises(NotFoundError, match=r"lmdb://.*/a"):
        tier.get("a")
    tier.close()


def test_read_is_zero_copy_inside_the_transaction(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "env", 4 << 20)
    value = os.urandom(1 << 20)
    tier.put("big", value)
    seen = tier.read("big", lambda view: (type(view), view.readonly, bytes(view[:16])))
    assert seen == (memoryview, True, value[:16])
    assert tier.read("missing", bytes) is None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 300_000), min_size=1, max_size=60), seed=st.integers(0, 1000))
def test_budget_of_pages_in_use_is_never_exceeded(
    tmp_path_factory: pytest.TempPathFactory, sizes, seed
) -> None:
    budget = 1 << 20
    tier = make_tier(tmp_path_factory.mktemp("env"), budget)
    rng = random.Random(seed)
    for i, size in enumerate(sizes):
        stored = tier.admit(f"k{i}", rng.randbytes(size))
        if size + 32 + 2 * 4096 <= budget:  # it fits: key-order eviction must make room
            assert stored
        assert pages_in_use(tier) <= budget
        if rng.random() < 0.2 and i:
            tier.delete(f"k{rng.randrange(i)}")
    assert os.path.getsize(tier.env.path / "data.mdb") <= tier.env.map_size
    tier.close()


def test_file_stays_within_1_1x_budget_after_20_evict_refill_cycles(tmp_path: Path) -> None:
    budget = 8 << 20
    tier = make_tier(tmp_path / "env", budget)
    value_size = 400_000
    rng = random.Random(1)
    n, filled = 0, []
    for _cycle in range(20):
        for _ in range(budget // value_size):  # refill: each admission evicts what it must
            tier.admit(f"v{n}", rng.randbytes(value_size))
            n += 1
            assert pages_in_use(tier) <= budget
        with tier.env.read(buffers=True) as txn:  # a reader in the middle, released at once
            txn.get(b"v0", db=tier.env.db("data"))
        keys = [r.key for r in tier.residents()]
        filled.append(len(keys))
        tier.evict(rng.sample(keys, len(keys) // 2))  # evict half
    assert tier.env.file_bytes() <= 1.1 * budget
    assert min(filled) >= 0.9 * (budget // value_size - 1), filled  # the budget is really used
    tier.close()


def test_damaged_value_is_detected_and_dropped(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "env", 4 << 20)
    tier.put("x", b"good bytes" * 1000)
    with tier.env.write() as txn:  # flip one payload byte behind the tier's back
        frame = bytearray(txn.get(b"x", db=tier.env.db("data")))
        frame[100] ^= 0xFF
        txn.put(b"x", bytes(frame), db=tier.env.db("data"))
    assert tier.read("x", bytes) is None
    assert tier.counters.corrupt == 1
    assert not tier.exists("x")


def test_map_size_is_fixed_by_the_first_process(tmp_path: Path) -> None:
    first = make_tier(tmp_path / "env", 2 << 20)
    first.put("a", b"1")
    map_size = first.env.map_size
    first.close()  # as if the first process exited
    later = make_tier(tmp_path / "env", 64 << 20)  # a later process asks for more
    assert later.env.open().info()["map_size"] == map_size
    assert later.budget == 2 << 20
    smaller = LmdbTier(later.env, budget=1 << 20)
    assert smaller.budget == 1 << 20


def test_value_larger_than_budget_is_refused(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "env", 1 << 20)
    assert tier.admit("huge", os.urandom(2 << 20)) is False
    assert not tier.exists("huge")


def test_policy_chooser_can_refuse(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "env", 1 << 20)
    for i in range(4):
        assert tier.admit(f"k{i}", os.urandom(200_000))
    assert tier.admit("new", os.urandom(240_000), lambda missing, residents, txn: None) is False
    assert tier.counters.rejections == 1
    victims = []
    assert tier.admit(
        "new", os.urandom(240_000), lambda m, rs, txn: victims.extend([rs[0].key]) or [rs[0].key]
    )
    assert not tier.exists(victims[0]) and tier.exists("new")


def test_unusable_directory_raises_store_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    tier = make_tier(blocker / "env", 1 << 20)
    with pytest.raises(StoreUnavailableError, match="a-file"):
        tier.exists("x")


FORK_CHILD = textwrap.dedent(
    """
    import os, sys
    from cachetier.lmdbtier import LmdbTier, SharedEnv
    env = SharedEnv(sys.argv[1], map_size=4 << 20, budget=3 << 20)
    tier = LmdbTier(env, budget=3 << 20)
    tier.put("parent", b"p")                      # the parent opens the environment
    pid = os.fork()
    if pid == 0:
        ok = tier.get("parent") == b"p"           # inherited handle: must reopen, not reuse
        tier.put("child", b"c")
        os._exit(0 if ok and env._handle.pid == os.getpid() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert tier.get("child") == b"c"
    print("ok")
    """
)


def test_forked_child_reopens_the_environment(tmp_path: Path) -> None:
    result = run_script(FORK_CHILD, tmp_path / "env")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_one_handle_per_path_per_process(tmp_path: Path) -> None:
    """LMDB refuses a second open of a path open in the process; SharedEnvs share one handle."""
    a = SharedEnv(tmp_path / "env", map_size=2 << 20, budget=1 << 20)
    b = SharedEnv(tmp_path / "env", map_size=2 << 20, budget=1 << 20)
    assert a.open() is b.open()
    with pytest.raises(lmdb.Error, match="already open"):
        lmdb.open(str(a.path), map_size=2 << 20, max_dbs=5)
    a.close()
    LmdbTier(b, budget=1 << 20).put("still", b"open")  # b keeps the handle alive
    b.close()
    lmdb.open(str(a.path), map_size=2 << 20, max_dbs=5).close()  # the last user closed it


FORK_WHILE_BUSY = textwrap.dedent(
    """
    import os, sys, threading
    from cachetier.lmdbtier import SharedEnv
    env = SharedEnv(sys.argv[1], map_size=16 << 20, budget=8 << 20)
    stop = threading.Event()
    def busy():
        while not stop.is_set():
            with env.read() as txn:
                env.used_bytes(txn)
            with env.write() as txn:
                txn.put(b"parent", b"x", db=env.db("meta"))
    threads = [threading.Thread(target=busy) for _ in range(3)]
    for t in threads:
        t.start()
    failed = 0
    for i in range(15):
        pid = os.fork()
        if pid == 0:
            child = SharedEnv(sys.argv[1], map_size=16 << 20, budget=8 << 20)
            with child.write() as txn:
                txn.put(b"child", b"y", db=child.db("meta"))
            os._exit(0)
        failed += os.waitpid(pid, 0)[1] != 0
    stop.set()
    for t in threads:
        t.join()
    print(failed)
    """
)


def test_fork_waits_for_transactions_of_other_threads(tmp_path: Path) -> None:
    """Without the fork gate a child forked mid-transaction hung reopening the environment."""
    result = run_script(FORK_WHILE_BUSY, tmp_path / "env", timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_a_reader_killed_inside_a_read_transaction_does_not_fill_the_map(tmp_path: Path) -> None:
    # kill -9 inside a read transaction leaves the process's reader slot, which pins the
    # pages of that snapshot: until it is cleared, freed pages cannot be reused and a
    # survivor that keeps evicting and admitting runs out of map.
    budget = 4 << 20
    tier = make_tier(tmp_path / "env", budget)
    rng = random.Random(3)
    for n in range(budget // 300_000):
        tier.admit(f"v{n}", rng.randbytes(300_000))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from cachetier.lmdbtier import SharedEnv
                env = SharedEnv({str(tmp_path / "env")!r}, map_size={int(budget * 1.1)}, budget={budget})
                with env.read() as txn:
                    print("reading", flush=True)
                    time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "reading"
    finally:
        holder.kill()
        holder.wait()
    admitted = 0
    for n in range(100, 160):  # churn: every admission evicts what it must
        admitted += tier.admit(f"v{n}", rng.randbytes(300_000))
    assert admitted == 60, tier.counters
    assert tier.env.file_bytes() <= 1.1 * budget
    tier.close()


TRUNCATED_READER = textwrap.dedent(
    """
    import sys
    from cachetier.lmdbtier import LmdbTier, SharedEnv
    env = SharedEnv(sys.argv[1], map_size=8 << 20, budget=6 << 20)
    tier = LmdbTier(env, budget=6 << 20)
    found = sum(tier.exists(f"k{i}") for i in range(40))  # reads the tree: past the end if cut
    tier.put("after", b"a")
    print(found, tier.get("after") == b"a")
    """
)


def test_a_truncated_data_file_is_started_again_instead_of_crashing_every_reader(tmp_path: Path) -> None:
    """LMDB maps pages past the end of a cut file: touching one kills the process (SIGBUS).
    The reader (a subprocess, so such a crash cannot take pytest down) finds an empty tier."""
    tier = make_tier(tmp_path / "env", 6 << 20)
    for i in range(40):
        tier.put(f"k{i}", os.urandom(40_000))
    tier.close()
    data = tmp_path / "env" / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    warned = []
    for _ in range(2):  # the second reader keeps the file the first one started again
        result = run_script(TRUNCATED_READER, tmp_path / "env")
        assert result.returncode == 0, (result.returncode, result.stderr)
        assert result.stdout.split() == ["0", "True"]
        warned.append("truncated" in result.stderr)
    assert warned == [True, False]


def test_a_map_size_the_node_cannot_reserve_is_not_fixed_for_the_next_runs(tmp_path: Path) -> None:
    huge = SharedEnv(tmp_path / "env", map_size=1 << 60, budget=1 << 59)  # 1 EiB: no machine maps it
    with pytest.raises(StoreUnavailableError):
        LmdbTier(huge, budget=1 << 59).exists("x")
    assert not (tmp_path / "env" / "tier.json").exists()
    tier = make_tier(tmp_path / "env", 1 << 20)
    tier.put("k", b"v")
    assert tier.get("k") == b"v" and tier.env.budget_cap == 1 << 20
    tier.close()
