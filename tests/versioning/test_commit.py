from __future__ import annotations

import multiprocessing
import threading

import pytest

from cachetier.errors import BadInputError, ConflictError
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from tests.versioning.helpers import OTHER_SCHEMA, SCHEMA, put_shard
from versioning import RefStore, ShardTable, commit, load_shard_table, load_version, log, make_operation


def do_commit(store, objects, shards, mode="append", expected=None, branch="main", schema=SCHEMA, **kw):
    return commit(
        store,
        objects,
        branch,
        shards=shards,
        schema=schema,
        mode=mode,
        expected_parent=expected,
        message=kw.pop("message", f"{mode} {len(shards)} shards"),
        author="tester",
        operation=make_operation(mode),
        **kw,
    )


def test_first_commit_then_append_then_replace(store, objects):
    a = put_shard(objects, ["1", "2"])
    b = put_shard(objects, ["3"])
    c = put_shard(objects, ["x", "y", "z"])
    v1, r1 = do_commit(store, objects, [a], created="2024-01-01T00:00:00.000000Z")
    assert r1.parents == ()
    assert (r1.records, r1.shards, r1.bytes) == (2, 1, a.bytes)
    assert r1.created == "2024-01-01T00:00:00.000000Z"
    assert RefStore(store).get_branch("main") == v1

    v2, r2 = do_commit(store, objects, [b], expected=v1)
    assert r2.parents == (v1,)
    table = load_shard_table(objects, r2.data_hash)
    assert table.hashes() == [a.hash, b.hash]
    assert [e.first_record for e in table] == [0, 2]
    assert (r2.records, r2.shards) == (3, 2)

    v3, r3 = do_commit(store, objects, [c], mode="replace", expected=v2, schema=OTHER_SCHEMA)
    assert load_shard_table(objects, r3.data_hash).hashes() == [c.hash]
    assert (r3.records, r3.parents) == (3, (v2,))
    assert load_version(store, v3) == r3
    assert [vid for vid, _ in log(store, RefStore(store).get_branch("main"))] == [v3, v2, v1]


def test_append_with_a_different_schema_names_both(store, objects):
    v1, _ = do_commit(store, objects, [put_shard(objects, ["1"])])
    with pytest.raises(BadInputError) as info:
        do_commit(store, objects, [put_shard(objects, ["2"])], expected=v1, schema=OTHER_SCHEMA)
    text = str(info.value)
    assert "text:string" in text and "text:large_string" in text and "'main'" in text
    assert RefStore(store).get_branch("main") == v1


def test_append_is_rebased_when_the_branch_moved(store, objects):
    v1, _ = do_commit(store, objects, [put_shard(objects, ["1"])])
    v2, _ = do_commit(store, objects, [put_shard(objects, ["2"])], expected=v1)
    # A writer that still believes the head is v1 appends: it lands on top of v2.
    _, r3 = do_commit(store, objects, [put_shard(objects, ["3"])], expected=v1)
    assert r3.parents == (v2,)
    assert r3.records == 3


def test_replace_on_a_moved_branch_is_a_conflict(store, objects):
    v1, _ = do_commit(store, objects, [put_shard(objects, ["1"])])
    v2, _ = do_commit(store, objects, [put_shard(objects, ["2"])], expected=v1)
    with pytest.raises(ConflictError) as info:
        do_commit(store, objects, [put_shard(objects, ["9"])], mode="replace", expected=v1)
    text = str(info.value)
    assert "conflict" in text and "'main'" in text and "run the replace again" in text
    assert RefStore(store).get_branch("main") == v2


def test_append_on_a_rewritten_branch_is_a_conflict(store, objects):
    v1, _ = do_commit(store, objects, [put_shard(objects, ["1"])])
    refs = RefStore(store)
    refs.delete_branch("main")
    with pytest.raises(ConflictError, match=r"conflict.*rewritten"):
        do_commit(store, objects, [put_shard(objects, ["2"])], expected=v1)
    other, _ = do_commit(store, objects, [put_shard(objects, ["x"])], branch="other")
    refs.set_branch("main", other, None)  # main now holds an unrelated history
    with pytest.raises(ConflictError, match=r"conflict.*no longer in its history"):
        do_commit(store, objects, [put_shard(objects, ["2"])], expected=v1)


def test_bad_mode_is_refused(store, objects):
    with pytest.raises(BadInputError, match="'merge'"):
        do_commit(store, objects, [], mode="merge")
    with pytest.raises(BadInputError, match="'bad name'"):
        do_commit(store, objects, [], branch="bad name")


def _race_worker(
    root: str, worker: int, rounds: int, barrier, lockstep: bool = False
) -> tuple[list[str], int]:
    """Append ``rounds`` shards to main; return the versions that landed and how many were rebased.

    With ``lockstep`` every round starts at the barrier, so the writers read the same head
    and race for the same swap each round.
    """
    store = LocalStore(root)
    objects = ObjectStore(store)
    refs = RefStore(store)
    landed, rebased = [], 0
    ShardTable.decode(ShardTable.empty().encode())  # warm up lazy imports so the writers really overlap
    barrier.wait()
    for i in range(rounds):
        shard = put_shard(objects, [f"worker {worker} round {i}"])
        if lockstep:
            barrier.wait()
        head = refs.get_branch("main")
        vid, record = do_commit(store, objects, [shard], expected=head, message=f"w{worker} r{i}")
        rebased += record.parents != ((head,) if head else ())
        landed.append(vid)
    return landed, rebased


def _process_entry(root, worker, rounds, barrier, queue):
    try:
        landed, rebased = _race_worker(root, worker, rounds, barrier, lockstep=True)
        queue.put((worker, landed, rebased, None))
    except Exception as e:  # report to the parent instead of dying silently
        queue.put((worker, [], 0, repr(e)))


def _check_race_result(store, objects, workers: int, rounds: int, landed: list[str]) -> None:
    head = RefStore(store).get_branch("main")
    history = [vid for vid, _ in log(store, head)]
    assert len(history) == workers * rounds
    assert set(landed) == set(history)  # every returned version is on the branch
    table = load_shard_table(objects, load_version(store, head).data_hash)
    contents = sorted(objects.get(h).decode() for h in table.hashes())
    assert contents == sorted(f"worker {w} round {i}" for w in range(workers) for i in range(rounds))


def test_racing_appends_in_threads_all_land(store, objects):
    workers, rounds = 3, 20
    barrier = threading.Barrier(workers)
    results: list[list[str]] = [[] for _ in range(workers)]

    def run(w):
        results[w] = _race_worker(str(store.root), w, rounds, barrier)[0]

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    _check_race_result(store, objects, workers, rounds, [v for r in results for v in r])


def test_racing_appends_in_processes_all_land(store, objects):
    workers, rounds = 2, 20
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_process_entry, args=(str(store.root), w, rounds, barrier, queue))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    outcomes = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert [err for *_, err in outcomes] == [None] * workers
    _check_race_result(store, objects, workers, rounds, [v for _, landed, _, _ in outcomes for v in landed])
    # The writers really raced: in lockstep rounds the loser of each swap was rebased.
    assert sum(rebased for _, _, rebased, _ in outcomes) >= 1


def test_racing_replaces_one_wins_the_other_gets_a_conflict(store, objects):
    v1, _ = do_commit(store, objects, [put_shard(objects, ["base"])])
    barrier = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def run(w):
        shard = put_shard(objects, [f"replacement {w}"])
        barrier.wait()
        try:
            outcomes[w] = do_commit(store, objects, [shard], mode="replace", expected=v1)[0]
        except ConflictError as e:
            outcomes[w] = e

    for _ in range(10):
        threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if isinstance(o, str)]
        losers = [o for o in outcomes if isinstance(o, ConflictError)]
        assert len(winners) == 1 and len(losers) == 1
        assert "conflict" in str(losers[0])
        assert RefStore(store).get_branch("main") == winners[0]
        RefStore(store).set_branch("main", v1, winners[0])  # reset for the next round


class _AlwaysBeatenStore(LocalStore):
    """A real local store where another writer appends to main just before each of our swaps."""

    def compare_and_swap(self, key, data, expected):
        if key == "refs/heads/main":
            rival = LocalStore(self.root)
            objects = ObjectStore(rival)
            head = RefStore(rival).get_branch("main")
            do_commit(rival, objects, [put_shard(objects, [f"rival after {head}"])], expected=head)
        return super().compare_and_swap(key, data, expected)


def test_append_gives_up_after_bounded_attempts_with_a_clear_conflict(tmp_path):
    store = _AlwaysBeatenStore(tmp_path)
    objects = ObjectStore(store)
    plain = LocalStore(tmp_path)
    v1, _ = do_commit(plain, ObjectStore(plain), [put_shard(objects, ["base"])])
    with pytest.raises(ConflictError) as info:
        do_commit(store, objects, [put_shard(objects, ["mine"])], expected=v1, max_attempts=3)
    text = str(info.value)
    assert "conflict" in text and "3 attempts" in text and "retry" in text
    head = RefStore(plain).get_branch("main")
    history = [record.message for _, record in log(plain, head)]
    assert len(history) == 4  # base + the rival's three appends; ours never landed half-way
    assert all(
        objects.get(h) != b"mine"
        for h in load_shard_table(objects, load_version(plain, head).data_hash).hashes()
    )
