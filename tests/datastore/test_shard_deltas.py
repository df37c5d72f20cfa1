"""Record-level deltas: a shard rewritten by a scattered edit is stored as a delta over the
shard it replaces (acceptance 3 with default options), read back byte-exact by every
reader, checked by verify, and kept (with its base) or removed by gc."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cachetier.config import CacheConfig
from cachetier.deltas import decode_delta, delta_key, encode_delta
from cachetier.errors import IntegrityError
from cachetier.localstore import LocalStore
from datastore.repo import Repo
from datastore.sample import sample_records, write_sample_jsonl
from datastore.shardpatch import CODEC, ShardRebuilder, delta_payload, make_shard_delta, shard_objects
from datastore.shards import ShardOptions, ShardWriter, encode_shard
from loaders import StreamingDataset


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit(rows: list[dict], share: float, seed: int) -> list[int]:
    picked = random.Random(seed).sample(range(len(rows)), int(len(rows) * share))
    for i in picked:
        rows[i] = {**rows[i], "text": rows[i]["text"] + f" edited {seed}"}
    return picked


def _stored(url: str, prefix: str) -> int:
    repo = Repo.open(url)
    return sum(info.size for info in repo.store.list(prefix))


def _records(path: Path) -> list[dict]:
    return [
        json.loads(line) for part in sorted(path.glob("*.jsonl")) for line in part.read_text().splitlines()
    ]


def _edited_version(cli, url: str, tmp_path: Path, n: int, seed: int) -> tuple[list[dict], dict, dict]:
    """Commit ``n`` records, edit 1% of them and commit again (``--replace``): the rows
    of the edit and the two versions' JSON."""
    rows = list(sample_records(n, seed=seed))
    src = tmp_path / "d.jsonl"
    _write(src, rows)
    assert cli("init", url).code == 0
    cli("ingest", src)
    base = cli("version", "-m", "base", "--json").json
    _edit(rows, 0.01, seed=seed)
    _write(src, rows)
    cli("ingest", src)
    return rows, base, cli("version", "-m", "edit", "--replace", "--json").json


def test_scattered_edit_with_default_options_stores_about_the_edit(
    cli, repo_url: str, tmp_path: Path
) -> None:
    rows = list(sample_records(20000, seed=3))
    src = tmp_path / "d.jsonl"
    _write(src, rows)
    assert cli("init", repo_url).code == 0
    first = cli("ingest", src, "--json").json  # default options: one shard of ~5 MB
    cli("version", "-m", "base")
    _edit(rows, 0.01, seed=1)  # 200 records at random
    _write(src, rows)
    before = sum(_stored(repo_url, p) for p in ("objects/", "packs/", "deltas/"))
    second = cli("ingest", src, "--json").json
    assert second["records"] == 20000 and second["bytes"] > 0.9 * first["bytes"]
    assert 0 < second["new_bytes"] <= 0.10 * first["bytes"], (second, first)
    assert _stored(repo_url, "deltas/") == second["new_bytes"]
    v2 = cli("version", "-m", "edit", "--replace", "--json").json
    after = sum(_stored(repo_url, p) for p in ("objects/", "packs/", "deltas/"))
    assert after - before <= 0.10 * first["bytes"]  # what the store really grew by
    diff = cli("diff", "main~1", "main", "--json").json
    assert diff["added_records"] == 200 and diff["removed_records"] == 200, diff
    assert cli("verify", "--all", "--json").json["ok"]
    out = tmp_path / "out"
    assert cli("checkout", v2["version"], "--to", out, "--format", "jsonl").code == 0
    assert _records(out) == rows
    # the same data ingested afresh gives the same data hash: storage is not identity
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert cli("init", str(tmp_path / "repo2"), cwd=fresh).code == 0
    cli("ingest", src, cwd=fresh)
    assert cli("version", "-m", "fresh", "--json", cwd=fresh).json["data_hash"] == v2["data_hash"]


@pytest.mark.parametrize("where", ["another workspace", "no workspace"])
def test_an_edit_ingested_where_its_base_was_not_written_is_stored_as_deltas(
    cli, repo_url: str, tmp_path: Path, where: str
) -> None:
    rows = list(sample_records(20000, seed=5))
    first_dir, other = tmp_path / "first", tmp_path / "other"
    first_dir.mkdir()
    other.mkdir()
    _write(first_dir / "d.jsonl", rows)
    assert cli("init", repo_url, cwd=first_dir).code == 0
    first = cli("ingest", first_dir / "d.jsonl", "--json", cwd=first_dir).json
    cli("version", "-m", "base", cwd=first_dir)
    _edit(rows, 0.01, seed=2)
    edited = other / "d.jsonl"  # the same file, edited on another machine (a clone, a CI job)
    _write(edited, rows)
    if where == "another workspace":
        assert cli("init", repo_url, cwd=other).code == 0
        second = cli("ingest", edited, "--json", cwd=other).json
        v2 = cli("version", "-m", "edit", "--replace", "--json", cwd=other).json["version"]
    else:
        repo = Repo.open(repo_url)
        second = repo.ingest(edited)
        v2 = repo.commit("edit", replace=True).version
    assert second["records"] == 20000
    assert 0 < second["new_bytes"] <= 0.10 * first["bytes"], (second, first)
    out = tmp_path / "out"
    assert cli("checkout", v2, "--to", out, "--format", "jsonl", cwd=first_dir).code == 0
    assert _records(out) == rows
    # the version's shards are deltas now: a third workspace learns their chain roots' anchors
    _edit(rows, 0.01, seed=3)
    third = tmp_path / "third"
    third.mkdir()
    _write(third / "d.jsonl", rows)
    assert cli("init", repo_url, cwd=third).code == 0
    again = cli("ingest", third / "d.jsonl", "--json", cwd=third).json
    assert 0 < again["new_bytes"] <= 0.10 * first["bytes"], (again, first)
    # new data under another name is not compared with the version's shards: nothing is read
    fresh = list(sample_records(20000, seed=9))
    _write(other / "new.jsonl", fresh)
    repo = Repo.open(repo_url)
    assert repo._delta_bases({"base": repo.head_version, "ingests": []}, [other / "new.jsonl"]) is None
    assert repo.ingest(other / "new.jsonl")["new_bytes"] > 0.9 * first["bytes"]


def test_edit_after_edit_keeps_chains_short_and_every_version_readable(
    cli, local_url: str, tmp_path: Path
) -> None:
    rows = list(sample_records(6000, seed=5))
    src = tmp_path / "d.jsonl"
    assert cli("init", local_url).code == 0
    expected = []
    for round_ in range(6):
        if round_:
            _edit(rows, 0.02, seed=round_)
        _write(src, rows)
        result = cli("ingest", src, "--shard-size", "2MiB", "--json").json
        if round_:  # deltas of ~2-6% of the large shards, and the small last shard (~9%) whole
            assert result["new_bytes"] <= 0.20 * result["bytes"], result
        version = cli("version", "-m", f"r{round_}", "--replace", "--json").json["version"]
        expected.append((version, list(rows)))
    repo = Repo.open(local_url)
    stored = [oid for oid, _ in repo.objects.list_deltas()]
    depths = [repo.objects.delta_of(oid) for oid in stored]
    assert depths and max(d[1] for d in depths if d) == 3  # chains grow to the cap, then start over
    for oid in stored:  # every delta rebuilds its shard's very bytes
        assert repo.objects.hash(repo.objects.get(oid)) == oid
    for vid, want in expected:
        out = tmp_path / f"out-{vid[:8]}"
        assert cli("checkout", vid, "--to", out, "--format", "jsonl").code == 0
        assert _records(out) == want
    assert cli("verify", "--all", "--json").json["ok"]


def test_gc_keeps_the_base_of_a_kept_delta_and_removes_unreached_deltas(
    cli, local_url: str, tmp_path: Path
) -> None:
    # The first shard is referenced by nothing after the reset, but the delta is over it.
    rows, src, _oid, _base = _delta_over_a_reset_shard(cli, local_url, tmp_path, seed=7)
    v = cli("version", "-m", "edited", "--json").json
    assert _stored(local_url, "deltas/") > 0
    _edit(rows, 0.01, seed=3)
    _write(src, rows)
    cli("ingest", src)
    assert cli("reset").code == 0  # a delta nothing reaches
    gc = cli("gc", "--grace", "0", "--json").json
    kinds = sorted(item["kind"] for item in gc["items"])
    assert kinds == ["delta"], gc
    assert cli("verify", "--all", "--json").json["ok"]
    out = tmp_path / "out"
    assert cli("checkout", v["version"], "--to", out, "--format", "jsonl").code == 0
    assert len(_records(out)) == 8000
    assert cli("gc", "--grace", "0", "--json").json["removed"] == 0


def test_a_damaged_or_orphaned_delta_is_named_and_never_read_wrong(
    cli, local_url: str, tmp_path: Path
) -> None:
    _rows, base_version, _edited = _edited_version(cli, local_url, tmp_path, 8000, seed=8)
    repo = Repo.open(local_url)
    [(oid, _info)] = list(repo.objects.list_deltas())
    path = Path(local_url) / delta_key(oid)
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    path.write_bytes(bytes(damaged))
    result = cli("verify", "--json")
    assert result.code == 1 and result.json["problems"][0]["object"] == oid
    assert "corrupt" in result.json["problems"][0]["message"]
    out = tmp_path / "out"
    failed = cli("checkout", "main", "--to", out, "--format", "jsonl")
    assert failed.code == 1 and oid in failed.err and not _records(out)

    path.write_bytes(good)  # the delta is whole again, its base goes missing
    base = decode_delta(good, oid).base
    assert base in Repo.open(local_url).shard_table(base_version["version"]).hashes()
    base_path = Path(local_url) / "objects" / base[:2] / base
    base_path.rename(tmp_path / "base")
    result = cli("verify", "--json")
    assert result.code == 1 and {p["object"] for p in result.json["problems"]} == {oid}
    assert (
        "missing" in result.json["problems"][0]["message"] and base in result.json["problems"][0]["message"]
    )


def test_a_delta_under_another_objects_id_is_refused(tmp_path: Path) -> None:
    objects = shard_objects(LocalStore(tmp_path / "repo"))
    shards = _shards(list(sample_records(3000, seed=9)))
    edited = _shards(
        [
            {**r, "text": r["text"] + "!"} if i % 97 == 0 else r
            for i, r in enumerate(sample_records(3000, seed=9))
        ]
    )
    base, (shard, pending) = shards[0][0], edited[0]
    objects.put(base.data)
    delta = make_shard_delta(shard, pending, ShardOptions(), base.hash, base.data, 0)
    assert delta is not None and len(delta) < 0.2 * len(shard.data)
    objects.put_delta(shard.hash, delta)
    assert objects.get(shard.hash) == shard.data
    other = "f" * 64
    objects.store.put(delta_key(other), delta)
    with pytest.raises(IntegrityError, match="another object"):
        objects.get(other)


def _rewrapped(delta_bytes: bytes, oid: str, base: str, depth: int = 1, **changes) -> bytes:
    """The delta with header fields changed (a valid checksum: what a bug or another
    encoder would produce, not what damage would)."""
    delta = decode_delta(delta_bytes, oid)
    length = int.from_bytes(delta.payload[:4], "little")
    header = {**json.loads(delta.payload[4 : 4 + length]), **changes}
    head = json.dumps(header).encode()
    payload = len(head).to_bytes(4, "little") + head + delta.payload[4 + length :]
    return encode_delta(oid, base, depth, CODEC, payload)


def test_a_rebuild_into_other_bytes_fails_naming_the_pyarrow_versions(tmp_path: Path) -> None:
    # What another pyarrow would do: the same records encoded into other bytes (here: at
    # another zstd level). The records are right, but not under this id: refused.
    objects = shard_objects(LocalStore(tmp_path / "repo"))
    rows = list(sample_records(3000, seed=10))
    [(base, _)] = _shards(rows)
    rows[5] = {**rows[5], "text": "changed"}
    [(shard, pending)] = _shards(rows)
    objects.put(base.data)
    delta = make_shard_delta(shard, pending, ShardOptions(), base.hash, base.data, 0)
    objects.put_delta(shard.hash, _rewrapped(delta, shard.hash, base.hash, level=9, arrow="0.0-old"))
    with pytest.raises(IntegrityError, match=r"written with pyarrow 0\.0-old, rebuilt with pyarrow") as e:
        objects.get(shard.hash)
    assert shard.hash in str(e.value)
    # cut batches (fewer rows than the shard): refused too, never served
    objects.put_delta(shard.hash, _rewrapped(delta, shard.hash, base.hash, batches=[100]))
    with pytest.raises(IntegrityError, match="the delta itself is wrong"):
        objects.get(shard.hash)


def test_a_delta_chain_longer_than_its_headers_say_is_refused_not_followed(tmp_path: Path) -> None:
    # A cycle (a delta over its own descendant) or a chain deeper than its depth field
    # fails with one error naming the object, never a RecursionError or a hang.
    objects = shard_objects(LocalStore(tmp_path / "repo"))
    rows = list(sample_records(3000, seed=13))
    [(a, _)] = _shards(rows)
    rows[1] = {**rows[1], "text": "b"}
    [(b, pb)] = _shards(rows)
    rows[2] = {**rows[2], "text": "c"}
    [(c, pc)] = _shards(rows)
    delta_b = make_shard_delta(b, pb, ShardOptions(), a.hash, a.data, 0)
    delta_c = make_shard_delta(c, pc, ShardOptions(), b.hash, b.data, 0)
    objects.put_delta(b.hash, _rewrapped(delta_b, b.hash, c.hash, depth=1))  # b over c ...
    objects.put_delta(c.hash, _rewrapped(delta_c, c.hash, b.hash, depth=1))  # ... and c over b
    with pytest.raises(IntegrityError, match="deeper than its header"):
        objects.get(c.hash)
    assert not objects.exists(c.hash)


def test_record_hashes_of_a_delta_chain_without_a_rebuild(tmp_path: Path) -> None:
    from datastore.recordhash import HASH_COLUMN
    from datastore.shardpatch import stored_record_hashes
    from datastore.shards import read_shard

    objects = shard_objects(LocalStore(tmp_path / "repo"))
    rows = list(sample_records(3000, seed=14))
    [(a, _)] = _shards(rows)
    del rows[10:40]  # drops, a change and an insert: the rows move, not only their values
    rows[100] = {**rows[100], "text": "b"}
    [(b, pb)] = _shards(rows)
    rows.insert(7, {**rows[500], "text": "c"})
    [(c, pc)] = _shards(rows)
    objects.put(a.data)
    objects.put_delta(b.hash, make_shard_delta(b, pb, ShardOptions(), a.hash, a.data, 0))
    objects.put_delta(c.hash, make_shard_delta(c, pc, ShardOptions(), b.hash, b.data, 1))
    assert objects.delta_of(c.hash) == (b.hash, 2)
    fetched = []
    get = objects.store.get
    objects.store.get = lambda key, byte_range=None: fetched.append(len(data := get(key, byte_range))) or data
    for shard in (a, b, c):
        fetched.clear()
        expected = read_shard(shard.data, [HASH_COLUMN]).column(0).combine_chunks()
        assert stored_record_hashes(objects, shard.hash).equals(expected)
        assert sum(fetched) < 0.2 * len(a.data)  # the root's footer and hash column, the deltas
    objects.store.get = get
    delta_c = objects.store.get(delta_key(c.hash))
    objects.put_delta(c.hash, _rewrapped(delta_c, c.hash, b.hash, depth=2, digest="0" * 64))
    with pytest.raises(IntegrityError, match="other records"):
        stored_record_hashes(objects, c.hash)
    delta_b = objects.store.get(delta_key(b.hash))
    objects.put_delta(b.hash, _rewrapped(delta_b, b.hash, c.hash, depth=1))  # b over c over b
    with pytest.raises(IntegrityError, match="deeper than its header"):
        stored_record_hashes(objects, c.hash)


def _delta_over_a_reset_shard(cli, url: str, tmp_path: Path, seed: int) -> tuple[list[dict], Path, str, str]:
    """Ingest, reset, edit 1%, ingest again: the staged shard is a delta over a shard that
    nothing references. Returns the rows, the source, the delta's object id and its base."""
    rows = list(sample_records(8000, seed=seed))
    src = tmp_path / "d.jsonl"
    _write(src, rows)
    assert cli("init", url).code == 0
    cli("ingest", src)
    cli("reset")
    _edit(rows, 0.01, seed=seed)
    _write(src, rows)
    cli("ingest", src)
    objects = Repo.open(url).objects
    [(oid, _)] = list(objects.list_deltas())
    return rows, src, oid, objects.delta_of(oid)[0]


def test_a_delta_whose_base_gc_removed_is_not_committed(cli, local_url: str, tmp_path: Path) -> None:
    _rows, _src, _oid, base = _delta_over_a_reset_shard(cli, local_url, tmp_path, seed=14)
    (Path(local_url) / "objects" / base[:2] / base).unlink()  # what a racing gc could do
    failed = cli("version", "-m", "x")
    assert failed.code == 1 and "missing" in failed.err
    assert cli("log", "--json").json == []  # nothing committed


def test_a_type_arrow_cannot_take_is_stored_whole(cli, local_url: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    n = 20000
    table = pa.table(
        {"id": range(n), "s": pa.array([f"value {i} " * 20 for i in range(n)], pa.string_view())}
    )
    src = tmp_path / "v.parquet"
    pq.write_table(table, src)
    assert cli("init", local_url).code == 0
    cli("ingest", src)
    cli("version", "-m", "v")
    edited = table.set_column(
        1,
        "s",
        pa.array([f"value {i} " * 20 + ("!" if i % 100 == 0 else "") for i in range(n)], pa.string_view()),
    )
    pq.write_table(edited, src)
    result = cli("ingest", src, "--json")
    assert result.code == 0, result.err
    cli("version", "-m", "w", "--replace")
    assert cli("verify", "--json").json["ok"]


def test_hidden_values_under_nulls_neither_change_shard_bytes_nor_block_deltas(tmp_path: Path) -> None:
    # Arrow writes the value a null slot happens to hold (here 1, 2, ... under the nulls of
    # an int column; children behind null lists), and `take` writes zeros: shards are
    # encoded with zeros, so equal records give equal bytes and a delta's rebuild matches.
    n = 30000
    mask = np.arange(n) % 7 == 0
    ints = pa.array(np.arange(n, dtype=np.int64), mask=mask)
    zeroed = pa.array(np.where(mask, 0, np.arange(n)), mask=mask)
    lists = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), pa.array(np.ones(2 * n)), mask=pa.array(mask)
    )
    texts = [f"record {i} " * 10 for i in range(n)]
    options = ShardOptions()

    def shard(ints_column: pa.Array, texts: list[str]):
        writer = ShardWriter(options)
        [pending] = writer.add(pa.record_batch({"n": ints_column, "l": lists, "t": texts})) + writer.finish()
        return encode_shard(pending, options), pending

    base, _ = shard(ints, texts)
    assert base.data == shard(zeroed, texts)[0].data
    texts[10] = "changed"
    edited, pending = shard(ints, texts)
    delta = make_shard_delta(edited, pending, options, base.hash, base.data, 0)
    assert delta is not None and len(delta) < 0.05 * len(edited.data)
    assert ShardRebuilder()(base.data, decode_delta(delta, edited.hash).payload, "t") == edited.data


def test_a_loader_streams_a_version_stored_as_deltas(cli, local_url: str, tmp_path: Path) -> None:
    rows, _base, v = _edited_version(cli, local_url, tmp_path, 5000, seed=11)
    assert _stored(local_url, "deltas/") > 0
    cache = CacheConfig(
        dir=tmp_path / "cache", ram_dir=tmp_path / "ram", ram_bytes=8 << 20, ssd_bytes=8 << 20
    )
    dataset = StreamingDataset(local_url, v["version"], cache=cache)
    got = sorted((s["id"], s["text"]) for s in dataset)
    assert got == sorted((r["id"], r["text"]) for r in rows)


def _shards(rows: list[dict], options: ShardOptions | None = None):
    """Encode ``rows`` into shards: [(EncodedShard, PendingShard)]."""
    options = options or ShardOptions()
    writer = ShardWriter(options)
    table = pa.Table.from_pylist(rows)
    pendings = [p for batch in table.to_batches() for p in writer.add(batch)] + writer.finish()
    return [(encode_shard(p, options), p) for p in pendings]


_ROW = st.fixed_dictionaries(
    {"id": st.integers(0, 50), "text": st.text(max_size=30), "tags": st.lists(st.integers(0, 5), max_size=3)}
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base_rows=st.lists(_ROW, min_size=1, max_size=60),
    edits=st.lists(
        st.tuples(st.sampled_from(["drop", "add", "change", "move"]), st.integers(0, 1000), _ROW), max_size=8
    ),
)
def test_a_delta_rebuilds_the_exact_shard_whatever_the_edit(base_rows, edits) -> None:
    # Drops, inserts, changes and moves of records, duplicates included: a delta is either
    # refused or rebuilds the very bytes of the edited shard.
    options = ShardOptions(shard_size=1 << 30 >> 1)  # everything in one shard
    rows = list(base_rows)
    for kind, at, row in edits:
        i = at % (len(rows) + 1)
        if kind == "add":
            rows.insert(i, row)
        elif rows and kind == "drop":
            rows.pop(i % len(rows))
        elif rows and kind == "change":
            rows[i % len(rows)] = row
        elif rows and kind == "move":
            rows.insert(at % len(rows), rows.pop(i % len(rows)))
    if not rows:
        return
    if pa.Table.from_pylist(rows).schema != pa.Table.from_pylist(base_rows).schema:
        return  # another schema: never a delta
    [(target, pending)] = _shards(rows, options)
    [(base, _)] = _shards(base_rows, options)
    payload = delta_payload(target, pending, options, base.data)
    if payload is not None:
        assert ShardRebuilder()(base.data, payload, "t") == target.data


def test_dedup_stores_the_thinned_shards_as_deltas(cli, local_url: str, tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    write_sample_jsonl(src, 20000, seed=12, duplicate_rate=0.01)
    assert cli("init", local_url).code == 0
    first = cli("ingest", src, "--json").json
    raw = cli("version", "-m", "raw", "--json").json
    before = sum(_stored(local_url, p) for p in ("objects/", "packs/", "deltas/"))
    result = cli("dedup", "--json").json
    assert result["removed_records"] > 0
    grown = sum(_stored(local_url, p) for p in ("objects/", "packs/", "deltas/")) - before
    assert _stored(local_url, "deltas/") > 0
    assert grown <= 0.05 * first["bytes"], (grown, first)  # an audit and deltas, not new shards
    out = tmp_path / "out"
    assert cli("checkout", result["version"], "--to", out, "--format", "jsonl").code == 0
    assert len(_records(out)) == raw["records"] - result["removed_records"]
    assert cli("verify", "--all", "--json").json["ok"]


def test_a_delta_whose_base_is_gone_counts_as_not_stored(cli, local_url: str, tmp_path: Path) -> None:
    # A gc killed part-way (or an older one that deleted a base before its delta) can
    # leave a delta whose base is gone: the next ingest of that data stores it whole.
    rows, src, oid, base = _delta_over_a_reset_shard(cli, local_url, tmp_path, seed=15)
    cli("reset")
    repo = Repo.open(local_url)
    (Path(local_url) / "objects" / base[:2] / base).unlink()
    assert not repo.objects.touch_if_exists(oid) and not repo.objects.exists(oid)
    again = cli("ingest", src, "--json").json
    assert again["new_bytes"] >= 0.5 * again["bytes"]  # stored whole
    assert cli("version", "-m", "healed").code == 0
    assert cli("verify", "--json").json["ok"]
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "jsonl").code == 0
    assert _records(out) == rows


def test_anchors_are_remembered_and_forgotten_from_many_threads(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from datastore.ingestindex import IngestIndex

    index = IngestIndex(tmp_path / "index.json")
    for i in range(20000):
        index.remember_anchors(f"{i:064x}", [f"{i:08x}a", f"{i:08x}b"])
    index.record_changes()

    def churn(k: int) -> None:
        for i in range(k, 20000, 4):
            if k % 2:
                index.forget_anchors_of(f"{i:064x}")
            else:
                index.remember_anchors(f"{i + 100000:064x}", [f"{i:08x}c", f"{i:08x}d"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(churn, range(4)))
    assert index.similar_shard(["00000001a", "00000001b"]) is None  # forgotten (k=1)
    assert index.similar_shard(["00000000a", "00000000b"]) == f"{0:064x}"  # kept (k=0 remembers)
    copy = IngestIndex(tmp_path / "copy.json")
    for i in range(20000):
        copy.remember_anchors(f"{i:064x}", [f"{i:08x}a", f"{i:08x}b"])
    copy.apply_changes(index.changes())
    assert copy.similar_shard(["00000001a", "00000001b"]) is None
    assert copy.similar_shard(["00000002c", "00000002d"]) == f"{100002:064x}"


def test_anchors_learned_on_demand_once_without_replacing_remembered_ones() -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor

    from datastore.ingestindex import IngestIndex

    index = IngestIndex(None)
    index.remember_anchors("b" * 64, ["x1", "x2"])
    calls = []

    def shards(known):
        calls.append(set(known))
        time.sleep(0.2)  # the other threads ask meanwhile: they wait, then find
        yield "a" * 64, ["a1", "a2", "x1"]
        yield "c" * 64, ["x1", "x2"]

    assert index.similar_shard(["x1", "x2"]) == "b" * 64  # found: nothing is read
    index.learn_anchors_from(shards)
    assert calls == []
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda _: index.similar_shard(["a1", "a2"]), range(8)))
    assert found == ["a" * 64] * 8 and calls == [{"b" * 64}]  # told which shards it knows
    assert index.similar_shard(["x1", "x2"]) == "b" * 64  # remembered here: kept
    assert index.similar_shard(["n1", "n2"]) is None and len(calls) == 1  # learned once

    def broken(known):
        yield "d" * 64, ["d1", "d2"]
        raise OSError("the store went away")

    failing = IngestIndex(None)
    failing.learn_anchors_from(broken)
    assert failing.similar_shard(["d1", "d2"]) == "d" * 64  # what came before the failure


def test_a_delta_with_a_damaged_header_is_stored_whole_by_the_next_ingest(
    cli, local_url: str, tmp_path: Path
) -> None:
    rows, src, oid, _base = _delta_over_a_reset_shard(cli, local_url, tmp_path, seed=16)
    cli("reset")
    path = Path(local_url) / delta_key(oid)
    path.write_bytes(b"garbage" + path.read_bytes()[7:])
    again = cli("ingest", src, "--json")
    assert again.code == 0 and again.json["new_bytes"] >= 0.5 * again.json["bytes"]
    assert cli("version", "-m", "healed").code == 0 and cli("verify", "--json").json["ok"]
    out = tmp_path / "out"
    assert cli("checkout", "main", "--to", out, "--format", "jsonl").code == 0
    assert _records(out) == rows
