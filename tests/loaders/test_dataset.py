"""StreamingDataset iterated in the training process: coverage, content, state, errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loaders.dataset as dataset_module
from cachetier.config import CacheConfig
from cachetier.errors import BadInputError, UsageError
from datastore import Repo
from loaders import ArrowFileSource, StreamingDataset
from loaders.decoded import DecodedShard
from tests.loaders._shards import IpcShardSource, write_shards

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def ids_of(items) -> list[int]:
    out = []
    for item in items:
        ids = item["id"]
        out.extend(ids.tolist() if isinstance(ids, torch.Tensor) else [ids])
    return out


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [None, 1, 16, 300])
@pytest.mark.parametrize("drop_last", [False, True])
def test_one_rank_gets_every_record_once(source, total_records, shuffle, batch_size, drop_last):
    ds = StreamingDataset(source, shuffle=shuffle, seed=7, batch_size=batch_size, drop_last=drop_last)
    got = ids_of(ds)
    assert len(got) == len(set(got))
    dropped = total_records % batch_size if (batch_size and drop_last) else 0
    assert len(got) == total_records - dropped
    if not shuffle:
        assert got == list(range(len(got)))
    if batch_size:
        assert len(ds) == len(list(StreamingDataset(source, batch_size=batch_size, drop_last=drop_last)))


def test_batches_are_built_column_wise_with_the_documented_types(source):
    ds = StreamingDataset(source, batch_size=8, shuffle=True)
    batch = next(iter(ds))
    ids = batch["id"]
    assert ids.dtype == torch.int64 and ids.shape == (8,)
    assert batch["tokens"].dtype == torch.int32 and batch["tokens"].shape == (8, 4)
    assert torch.equal(batch["tokens"], (ids[:, None] * 10 + torch.arange(4)).int())
    assert batch["text"] == [f"record-{i}" for i in ids.tolist()]
    lengths = batch["var_lengths"]
    assert lengths.tolist() == [i % 5 for i in ids.tolist()]
    assert batch["var"].shape == (8, int(lengths.max()))
    for row, n in zip(batch["var"], lengths.tolist()):
        assert row[:n].tolist() == list(range(n)) and not row[n:].any()
    assert "__record_hash" not in batch


def test_per_sample_mode_yields_plain_values_and_applies_transform(source):
    ds = StreamingDataset(
        source, columns=["id", "tokens", "var", "text"], transform=lambda s: {**s, "twice": 2 * s["id"]}
    )
    sample = next(iter(ds))
    assert sample["id"] == 0 and sample["twice"] == 0 and sample["text"] == "record-0"
    assert isinstance(sample["tokens"], torch.Tensor) and sample["tokens"].tolist() == [0, 1, 2, 3]
    assert sample["var"].tolist() == []


def test_batch_transform_sees_the_whole_batch(source):
    ds = StreamingDataset(source, batch_size=10, transform=lambda b: b["id"].sum().item())
    assert next(iter(ds)) == sum(range(10))


def test_columns_are_selected_and_a_missing_one_is_named(source):
    ds = StreamingDataset(source, columns=["text"], batch_size=4)
    assert set(next(iter(ds))) == {"text"}
    with pytest.raises(BadInputError, match="nope"):
        next(iter(StreamingDataset(ArrowFileSource(source.paths), columns=["nope"], batch_size=4)))
    with pytest.raises(BadInputError, match="columns"):
        StreamingDataset(source, columns=[])


def test_hidden_columns_are_dropped_even_if_the_source_keeps_them(shard_folder):
    class Leaky(IpcShardSource):
        def read_shard(self, shard_id, columns=None):
            import pyarrow as pa

            with open(self._by_id[shard_id], "rb") as f:
                return pa.ipc.open_file(pa.BufferReader(f.read())).read_all()

    ds = StreamingDataset(Leaky.from_folder(shard_folder), batch_size=4)
    assert "__record_hash" not in next(iter(ds))


def test_ranks_from_the_environment_are_disjoint_and_equal(source, total_records, monkeypatch):
    world = 3
    per_rank = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        per_rank.append(ids_of(StreamingDataset(source, shuffle=True, batch_size=8)))
    assert len({len(r) for r in per_rank}) == 1
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat)) == total_records - total_records % world


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_rank_reads_only_the_shards_of_its_own_stretch_of_the_epoch(tmp_path, monkeypatch, shuffle):
    # At scale a node must read its partition, not every shard (DESIGN.md, section 8).
    write_shards(tmp_path, [20] * 24)
    world, window, reads = 4, 2, []

    class Counting(IpcShardSource):
        def read_shard(self, shard_id, columns=None):
            reads[-1].add(shard_id)
            return super().read_shard(shard_id, columns)

    per_rank = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        reads.append(set())
        ds = StreamingDataset(
            Counting.from_folder(tmp_path), shuffle=shuffle, batch_size=8, shuffle_window=window
        )
        per_rank.append(ids_of(ds))
    assert sorted(i for r in per_rank for i in r) == list(range(480))
    assert max(len(r) for r in reads) <= 24 // world + window, [len(r) for r in reads]
    assert len(set().union(*reads)) == 24


@pytest.mark.parametrize("window", [2, 3])
def test_a_rank_keeps_only_its_part_of_a_shard_in_its_last_window(source, total_records, window, monkeypatch):
    """With several readers, each copies out the few records it still needs of a window's
    oldest shard and lets the decoded shard go; nothing is lost or repeated."""
    kept = []
    subset = DecodedShard.subset

    def recording(self, rows):
        kept.append((len(rows), self.rows))
        return subset(self, rows)

    monkeypatch.setattr(DecodedShard, "subset", recording)
    world = 3
    per_rank = []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        per_rank.append(ids_of(StreamingDataset(source, shuffle=True, batch_size=4, shuffle_window=window)))
    assert kept and all(n <= 0.4 * rows for n, rows in kept)
    flat = [i for r in per_rank for i in r]
    assert len(flat) == len(set(flat)) == total_records - total_records % world


def test_order_is_reproducible_and_changes_with_epoch_and_seed(source):
    def order(seed, epoch):
        ds = StreamingDataset(source, shuffle=True, seed=seed, batch_size=32)
        ds.set_epoch(epoch)
        return ids_of(ds)

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    assert sorted(order(1, 1)) == sorted(order(2, 3))


def test_a_new_iteration_continues_and_then_advances_the_epoch(source, total_records):
    ds = StreamingDataset(source, shuffle=True, batch_size=10)
    it = iter(ds)
    first = ids_of([next(it) for _ in range(3)])
    del it
    rest = ids_of(ds)
    assert sorted(first + rest) == list(range(total_records))
    assert ds.epoch == 0
    epoch1 = ids_of(ds)
    assert ds.epoch == 1 and sorted(epoch1) == list(range(total_records)) and epoch1 != first + rest


@given(
    legs=st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 6), st.sampled_from([3, 8])), min_size=1, max_size=4
    )
)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_elastic_legs_through_json_states_deliver_each_record_at_most_once(
    source, total_records, legs, monkeypatch
):
    """Legs of random world sizes and batch sizes, each stopped after some batches per
    rank; the state of rank 0 goes through JSON into every rank of the next leg."""
    seen, state = [], None
    for leg, (world, batches, batch_size) in enumerate(legs):
        last = leg == len(legs) - 1
        states = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            ds = StreamingDataset(source, shuffle=True, seed=9, batch_size=batch_size)
            if state is not None:
                ds.load_state_dict(json.loads(state))
            ds.set_epoch(0)
            it = iter(ds)
            got = list(it) if last else [b for _, b in zip(range(batches), it)]
            del it
            seen += ids_of(got)
            states.append(json.dumps(ds.state_dict()))
        assert len(set(states)) == 1, "ranks disagree on the state"
        state = states[0]
    assert len(seen) == len(set(seen)), "a record was delivered twice"
    assert json.loads(state)["consumed"] == len(seen)
    assert total_records - len(seen) < legs[-1][0], "more than the last world's remainder was left out"


@given(cut=st.integers(0, 40), batch_size=st.sampled_from([None, 1, 7, 32]), shuffle=st.booleans())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_resume_from_any_cut_repeats_and_skips_nothing(source, total_records, cut, batch_size, shuffle):
    ds = StreamingDataset(source, shuffle=shuffle, seed=5, batch_size=batch_size)
    ds.set_epoch(2)
    it = iter(ds)
    before = []
    for _ in range(cut):
        item = next(it, None)
        if item is None:
            break
        before.append(item)
    state = json.loads(json.dumps(ds.state_dict()))
    assert len(json.dumps(state)) < 1024
    fresh = StreamingDataset(
        source.reopen(),
        shuffle=shuffle,
        seed=5,
        batch_size=batch_size,
    )
    fresh.load_state_dict(state)
    fresh.set_epoch(2)  # as a training loop does; keeps the loaded position of epoch 2
    after = ids_of(fresh)
    got = ids_of(before) + after
    assert sorted(got) == list(range(total_records))
    full = StreamingDataset(source, shuffle=shuffle, seed=5, batch_size=batch_size)
    full.set_epoch(2)
    assert got == ids_of(full), "the resumed order differs from an uninterrupted epoch"


def test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_next(source, total_records):
    ds = StreamingDataset(source, shuffle=True, batch_size=64)
    assert sorted(ids_of(ds)) == list(range(total_records))
    state = ds.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, total_records)
    fresh = StreamingDataset(source, shuffle=True, batch_size=64)
    fresh.load_state_dict(state)
    expected = StreamingDataset(source, shuffle=True, batch_size=64)
    expected.set_epoch(1)
    assert ids_of(fresh) == ids_of(expected)


def test_state_from_another_version_seed_or_plan_is_refused(source):
    state = StreamingDataset(source, shuffle=True, seed=1).state_dict()
    other_version = source.reopen(version_id="v-other")
    with pytest.raises(UsageError, match="version"):
        StreamingDataset(other_version, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(UsageError, match="seed=1"):
        StreamingDataset(source, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(UsageError, match="shuffle"):
        StreamingDataset(source, shuffle=False, seed=1).load_state_dict(state)
    with pytest.raises(UsageError, match="shuffle_window"):
        StreamingDataset(source, shuffle=True, seed=1, shuffle_window=3).load_state_dict(state)
    with pytest.raises(UsageError, match="shuffle_block=1048576"):
        StreamingDataset(source, shuffle=True, seed=1, shuffle_block="1MiB").load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "block"}  # a state saved before blocks
    with pytest.raises(UsageError, match="shuffle_block=0"):
        StreamingDataset(source, shuffle=True, seed=1).load_state_dict(older)
    StreamingDataset(source, shuffle=True, seed=1, shuffle_block=0).load_state_dict(older)
    with pytest.raises(BadInputError, match="consumed"):
        StreamingDataset(source, shuffle=True, seed=1).load_state_dict({**state, "consumed": -1})
    with pytest.raises(BadInputError, match="format"):
        StreamingDataset(source, shuffle=True, seed=1).load_state_dict({"version": "x"})


def test_announces_its_future_shard_order(source, monkeypatch):
    # One reader thread, so the reads are recorded in the order they are made (with
    # several, a later shard's read may reach the source first: Python 3.13 showed it).
    monkeypatch.setattr(dataset_module, "_READ_THREADS", 1)
    ds = StreamingDataset(source, shuffle=True, batch_size=16, shuffle_window=2)
    list(ds)
    plan = ds.plan(0)
    assert source.announced == [list(plan.shard_ids)]
    assert source.reads == list(plan.shard_ids), "shards are read once each, in plan order"


def test_shards_read_on_several_threads_are_each_read_once(source):
    ds = StreamingDataset(source, shuffle=True, batch_size=16, shuffle_window=2)
    list(ds)
    assert sorted(source.reads) == sorted(ds.plan(0).shard_ids)


def test_arrow_file_source_reads_files_and_fingerprints_them(source, total_records, tmp_path):
    files = ArrowFileSource(source.paths)
    assert [n for _, n in files.shards] == [n for _, n in source.shards]
    assert files.version_id == ArrowFileSource(source.paths).version_id
    assert ids_of(StreamingDataset(files, batch_size=50)) == list(range(total_records))
    reordered = ArrowFileSource(list(reversed(source.paths)))
    assert reordered.version_id != files.version_id
    table = files.read_shard(source.paths[0], ["text", "id"])
    assert table.column_names == ["text", "id"]
    assert np.array_equal(table["id"].to_numpy(), np.arange(len(table)))


@pytest.mark.parametrize("batch_size", [None, 10])
def test_len_of_the_dataset_is_the_whole_epoch_also_after_a_stop(source, total_records, batch_size):
    full = -(-total_records // 10) if batch_size else total_records
    ds = StreamingDataset(source, shuffle=True, batch_size=batch_size)
    assert len(ds) == full
    it = iter(ds)
    first = [next(it) for _ in range(7)]
    assert len(ds) == full
    del it  # stopped after 7 items
    assert len(ds) == full, "the epoch's length, not what remains of it"
    rest = list(ds)
    assert len(rest) == full - 7 and sorted(ids_of(first + rest)) == list(range(total_records))
    assert len(ds) == full
    end = ds.state_dict()
    assert (end["epoch"], end["consumed"]) == (0, total_records)
    fresh = StreamingDataset(source, shuffle=True, batch_size=batch_size)
    fresh.load_state_dict(end)
    assert len(fresh) == full
    assert len(list(fresh)) == full and fresh.epoch == 1


def _repo(tmp_path, table: pa.Table) -> tuple[str, CacheConfig]:
    pq.write_table(table, tmp_path / "data.parquet")
    repo = Repo.init(tmp_path / "repo", workspace=None)
    repo.ingest(tmp_path / "data.parquet")
    repo.commit("data")
    return str(tmp_path / "repo"), CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=8 << 20
    )


def test_a_single_column_name_is_one_column(tmp_path):
    repo, cache = _repo(tmp_path, pa.table({"id": list(range(5)), "text": list("abcde")}))
    (batch,) = list(StreamingDataset(repo, cache=cache, columns="id", batch_size=5))
    assert set(batch) == {"id"} and batch["id"].tolist() == list(range(5))
    assert [s["text"] for s in StreamingDataset(repo, cache=cache, columns="text")] == list("abcde")


def test_bad_columns_are_refused_when_the_dataset_is_made(tmp_path):
    repo, cache = _repo(tmp_path, pa.table({"id": list(range(5)), "text": list("abcde")}))
    with pytest.raises(BadInputError, match="'id' is selected more than once"):
        StreamingDataset(repo, cache=cache, columns=["id", "text", "id"])
    with pytest.raises(BadInputError, match=r"'nope' is not in this version.*available columns: id, text"):
        StreamingDataset(repo, cache=cache, columns=["id", "nope"])
    with pytest.raises(TypeError, match="columns"):
        StreamingDataset(repo, cache=cache, columns=5)
    with pytest.raises(BadInputError, match="columns"):
        StreamingDataset(repo, cache=cache, columns=["id", 3])
    hidden = StreamingDataset(repo, cache=cache, columns=["id", "__record_hash"], batch_size=5)
    assert len(next(iter(hidden))["__record_hash"]) == 5, "hidden columns stay selectable by name"


def test_an_unknown_column_of_an_empty_version_is_refused_too(tmp_path):
    empty = pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())})
    repo, cache = _repo(tmp_path, empty)
    assert list(StreamingDataset(repo, cache=cache, columns=["id"])) == []
    with pytest.raises(BadInputError, match="'nope'"):
        StreamingDataset(repo, cache=cache, columns=["nope"])


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("batch_size", 2.5, TypeError),
        ("batch_size", "8", TypeError),
        ("batch_size", True, TypeError),
        ("batch_size", 0, BadInputError),
        ("shuffle_window", 1.5, TypeError),
        ("shuffle_window", 0, BadInputError),
        ("seed", "1", TypeError),
        ("prefetch", None, TypeError),
        ("transform", "upper", TypeError),
    ],
)
def test_option_types_are_checked_when_the_dataset_is_made(source, option, value, error):
    with pytest.raises(error, match=option if error is TypeError else f"{option}={value}"):
        StreamingDataset(source, **{option: value})


def test_numpy_integers_are_accepted_as_batch_size(source):
    ds = StreamingDataset(source, batch_size=np.int64(8))
    assert ds.batch_size == 8 and type(ds.batch_size) is int
    assert next(iter(ds))["id"].shape == (8,)
