from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachetier.errors import BadInputError, IntegrityError, NotFoundError
from cachetier.hashing import content_hash
from tests.versioning.helpers import CREATED, SCHEMA
from versioning import (
    FORMAT_VERSION,
    VersionRecord,
    canonical_json,
    load_version,
    make_operation,
    parse_json,
    parse_timestamp,
    save_version,
    utc_now,
    version_key,
)

ID_A = "a" * 64
ID_B = "b" * 64

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
operations = st.builds(
    lambda op, extra: {**extra, "op": op},
    st.text(min_size=1, max_size=12),
    st.dictionaries(st.text(max_size=8).filter(lambda k: k not in ("op", "audit")), json_values, max_size=4),
)


def record(**changes) -> VersionRecord:
    fields = dict(
        parents=(ID_A,),
        data_hash=ID_B,
        schema=SCHEMA,
        records=10,
        shards=2,
        bytes=300,
        message="first ingest",
        author="ann",
        created=CREATED,
        operation=make_operation("ingest", params={"format": "jsonl"}, sources=[{"path": "a.jsonl"}]),
    )
    fields.update(changes)
    return VersionRecord(**fields)


def test_canonical_json_is_sorted_compact_utf8():
    assert canonical_json({"b": 1, "a": ["é", 1.5, None, True]}) == '{"a":["é",1.5,null,true],"b":1}'.encode()


@pytest.mark.parametrize("bad", [math.nan, math.inf, {1: "x"}, {"k": b"bytes"}, {"k": {1, 2}}, "\ud800"])
def test_canonical_json_rejects_non_json(bad):
    with pytest.raises(BadInputError):
        canonical_json({"value": bad}, "operation")


def test_canonical_json_error_names_the_path():
    with pytest.raises(BadInputError, match=r"operation\.params\.limit.*nan"):
        canonical_json({"params": {"limit": math.nan}}, "operation")


def test_parse_json_errors_name_subject_and_position():
    with pytest.raises(BadInputError, match=r"versions/x.*line 1 column 2"):
        parse_json(b"{x", "versions/x")
    with pytest.raises(BadInputError, match="NaN"):
        parse_json(b'{"a": NaN}', "versions/x")


def test_record_round_trip_and_format():
    r = record()
    d = r.to_dict()
    assert d["format"] == FORMAT_VERSION
    assert d["parents"] == [ID_A]
    assert VersionRecord.from_dict(d) == r
    assert VersionRecord.decode(r.encode()) == r
    assert json.loads(r.encode()) == d


def test_record_id_is_hash_of_canonical_bytes():
    r = record()
    assert r.version_id() == content_hash(r.encode())
    assert record(message="other").version_id() != r.version_id()
    assert (
        record(operation={"op": "ingest", "params": {"b": 1, "a": 2}}).version_id()
        == record(operation={"op": "ingest", "params": {"a": 2, "b": 1}}).version_id()
    )


@settings(max_examples=60, deadline=None)
@given(operation=operations, schema=st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_any_json_operation_round_trips_with_a_stable_id(operation, schema):
    r = record(operation=operation, schema=schema)
    again = VersionRecord.decode(r.encode())
    assert again == r
    assert again.operation == operation
    assert again.version_id() == r.version_id()
    assert again.encode() == r.encode()
    # Rebuilt from a freshly built dict: same bytes, same id.
    assert record(operation=json.loads(json.dumps(operation)), schema=schema).version_id() == r.version_id()


def test_record_copies_dicts_and_lists_become_tuples():
    op = {"op": "append", "sources": ("a", "b")}
    r = record(operation=op, parents=[ID_A])
    op["op"] = "changed"
    assert r.operation == {"op": "append", "sources": ["a", "b"]}
    assert r.parents == (ID_A,)


@pytest.mark.parametrize(
    ("changes", "quoted"),
    [
        ({"records": -1}, "-1"),
        ({"records": True}, "True"),
        ({"shards": "2"}, "'2'"),
        ({"parents": ("zz",)}, "'zz'"),
        ({"parents": ID_A}, ID_A),
        ({"parents": (ID_A, ID_A)}, ID_A),
        ({"data_hash": "ABC"}, "'ABC'"),
        ({"created": "yesterday"}, "'yesterday'"),
        ({"created": "2024-05-01T12:00:00"}, "2024-05-01T12:00:00"),
        ({"created": "2024-05-01T12:00:00+02:00"}, "+02:00"),
        ({"message": 5}, "5"),
        ({"operation": {"params": {}}}, "None"),
        ({"operation": {"op": "dedup", "audit": "nope"}}, "'nope'"),
        ({"schema": ["x"]}, "['x']"),
        ({"format": 0}, "0"),
    ],
)
def test_bad_fields_are_quoted(changes, quoted):
    with pytest.raises(BadInputError) as info:
        record(**changes)
    assert quoted in str(info.value)


def test_from_dict_names_subject_and_rejects_unknown_missing_and_newer():
    d = record().to_dict()
    with pytest.raises(BadInputError, match=r"versions/abc.*'records'.*'many'"):
        VersionRecord.from_dict({**d, "records": "many"}, subject="versions/abc")
    with pytest.raises(BadInputError, match=r"unknown field.*'extra'"):
        VersionRecord.from_dict({**d, "extra": 1})
    del d["author"]
    with pytest.raises(BadInputError, match=r"missing field.*'author'"):
        VersionRecord.from_dict(d)
    with pytest.raises(BadInputError, match=r"newer.*upgrade"):
        VersionRecord.from_dict({**record().to_dict(), "format": FORMAT_VERSION + 1})
    with pytest.raises(BadInputError, match="JSON object"):
        VersionRecord.from_dict([1, 2])


def test_timestamps():
    now = utc_now()
    assert now.endswith("Z")
    assert parse_timestamp(now).utcoffset().total_seconds() == 0
    assert parse_timestamp("2024-05-01T12:00:00+00:00").year == 2024


def test_save_and_load_version_verifies_id(store):
    r = record()
    vid = save_version(store, r)
    assert vid == r.version_id()
    assert save_version(store, r) == vid  # idempotent
    assert load_version(store, vid) == r
    store.put(version_key(vid), r.encode().replace(b"ann", b"bob"))
    with pytest.raises(IntegrityError, match=vid):
        load_version(store, vid)
    with pytest.raises(NotFoundError, match="c" * 64):
        load_version(store, "c" * 64)
    with pytest.raises(BadInputError, match="'main'"):
        load_version(store, "main")


def test_load_version_with_valid_hash_but_bad_content_is_integrity_error(store):
    data = b'{"format":1}'
    vid = content_hash(data)
    store.put(version_key(vid), data)
    with pytest.raises(IntegrityError, match="missing field"):
        load_version(store, vid)
