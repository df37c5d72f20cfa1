"""The dask pipeline on a real LocalCluster (2 worker processes) equals the single-process run."""

import numpy as np
import pytest
from distributed import Client

from dedup import DedupConfig, find_duplicates, local_cluster, tune_worker_malloc


@pytest.fixture(scope="module")
def client():
    with local_cluster(2) as cluster, Client(cluster) as c:
        yield c


def assert_same(a, b):
    assert np.array_equal(a.keep, b.keep)
    assert a.removed.equals(b.removed)
    assert a.skipped.equals(b.skipped)
    assert a.pairs.select(["left", "right"]).equals(b.pairs.select(["left", "right"]))
    sa, sb = a.pairs.column("similarity").to_numpy(), b.pairs.column("similarity").to_numpy()
    assert np.array_equal(sa, sb, equal_nan=True)
    assert a.clusters == b.clusters


@pytest.mark.slow
def test_cluster_equals_single_process(planted, client):
    table = planted["table"]
    single = find_duplicates(table)
    assert single.removed_records > 0
    on_cluster = find_duplicates(table.to_batches(max_chunksize=97), client=client)
    assert_same(single, on_cluster)
    again = find_duplicates(table, client=client)  # other partitioning, same result
    assert_same(single, again)
    assert on_cluster.stats["workers"] == 2 and set(on_cluster.stats["worker_cpu_seconds"]) >= {
        "sketch",
        "reduce",
    }


@pytest.mark.slow
def test_cluster_exact_and_signature_modes(planted, client):
    table = planted["table"]
    for config in (DedupConfig(method="exact"), DedupConfig(verify="signature"), DedupConfig(verify="none")):
        assert_same(
            find_duplicates(table, config=config), find_duplicates(table, config=config, client=client)
        )


@pytest.mark.slow
def test_parts_as_callables_and_malloc_tuning(planted, client):
    table = planted["table"]
    parts = [lambda lo=lo: table.slice(lo, 150) for lo in range(0, table.num_rows, 150)]
    assert_same(find_duplicates(table), find_duplicates(parts, client=client))
    assert all(tune_worker_malloc(client).values())
