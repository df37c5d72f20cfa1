"""``take_rows``: the loader's gather without Arrow's compute kernels, against ``pyarrow.compute.take``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from datastore import Repo
from loaders.columns import row_ranges
from loaders.take import take_rows

ROOT = Path(__file__).resolve().parents[2]

_TYPES = [
    pa.string(),
    pa.large_string(),
    pa.binary(),
    pa.large_binary(),
    pa.list_(pa.int32()),
    pa.large_list(pa.float64()),
    pa.list_(pa.int8()),
    pa.list_(pa.decimal128(10, 2)),
    pa.list_(pa.bool_()),  # no fast path (bits): falls back to compute
    pa.list_(pa.struct([("a", pa.int64())])),  # no fast path: falls back to compute
]


def _values(typ: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        item = st.text(max_size=12)
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        item = st.binary(max_size=12)
    elif pa.types.is_struct(typ.value_type):
        item = st.lists(st.fixed_dictionaries({"a": st.integers(-5, 5)}), max_size=4)
    elif pa.types.is_boolean(typ.value_type):
        item = st.lists(st.booleans(), max_size=6)
    elif pa.types.is_decimal(typ.value_type):
        item = st.lists(st.decimals(-999, 999, places=2), max_size=6)
    elif pa.types.is_floating(typ.value_type):
        item = st.lists(st.floats(allow_nan=False, width=64), max_size=6)
    else:
        item = st.lists(st.integers(-100, 100), max_size=6)
    return st.lists(st.one_of(st.none(), item), min_size=1, max_size=40)


@st.composite
def _cases(draw):
    typ = draw(st.sampled_from(_TYPES))
    values = draw(_values(typ))
    array = pa.array(values, typ)
    start = draw(st.integers(0, len(array) - 1))
    array = array.slice(start, draw(st.integers(1, len(array) - start)))  # an offset, as in a chunk
    rows = draw(st.lists(st.integers(0, len(array) - 1), max_size=60))
    return array, np.array(rows, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_take_rows_gives_what_arrow_take_gives(case):
    array, rows = case
    taken = take_rows(array, rows)
    taken.validate(full=True)
    assert taken.type == array.type
    assert taken.to_pylist() == pc.take(array, pa.array(rows, pa.int64())).to_pylist()


_READER = """
import json, sys
from loaders import StreamingDataLoader, StreamingDataset
from cachetier.config import CacheConfig
repo, cache = sys.argv[1], sys.argv[2]
config = CacheConfig(dir=cache + "/ssd", ram_dir=cache + "/ram", ram_bytes=64 << 20, ssd_bytes=64 << 20)
for shuffle in (False, True):
    ds = StreamingDataset(repo, "main", cache=config, shuffle=shuffle, batch_size=16)
    ids = [i for b in StreamingDataLoader(ds, num_workers=0) for i in b["id"].tolist()]
    assert sorted(ids) == list(range(300)), ids
print(json.dumps(sorted(m for m in sys.modules if m.startswith("pyarrow."))))
"""


def test_a_process_that_only_reads_a_repository_never_loads_compute_or_dataset(tmp_path):
    # Each of these imports costs a loader process (and every DataLoader worker) 9-15 MB.
    src = tmp_path / "data.jsonl"
    rows = ({"id": i, "text": f"r{i} " * (i % 7), "tags": list(range(i % 4))} for i in range(300))
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    repo = Repo.init(tmp_path / "repo", workspace=None)
    repo.ingest(src, shard_size=4 << 10)
    repo.commit("data")
    out = subprocess.run(
        [sys.executable, "-c", _READER, str(tmp_path / "repo"), str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert "pyarrow.parquet" in loaded  # the shard table: proves the version was really opened
    assert not {"pyarrow.compute", "pyarrow.dataset"} & set(loaded), loaded


@given(
    runs=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 40)), min_size=0, max_size=12),
    shuffle=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_row_ranges_spell_out_the_rows_exactly_or_decline(runs, shuffle):
    rows = np.concatenate([np.arange(a, a + n) for a, n in runs]) if runs else np.zeros(0, np.int64)
    if shuffle:
        rows = np.random.default_rng(len(rows)).permutation(rows)
    ranges = row_ranges(rows)
    if ranges is None:  # declined: too few rows, or too scattered to be worth slicing
        breaks = int((np.diff(rows) != 1).sum()) + 1 if len(rows) else 0
        assert len(rows) < 8 or breaks * 8 > len(rows)
        return
    assert all(b > a for a, b in ranges)
    assert np.concatenate([np.arange(a, b) for a, b in ranges]).tolist() == rows.tolist()
