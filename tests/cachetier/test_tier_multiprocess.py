"""Several processes, and forked DataLoader workers, share one node cache at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from cachetier.config import CacheConfig
from cachetier.hints import HintBoard
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore

REPO_ROOT = Path(__file__).resolve().parents[2]

READER = textwrap.dedent(
    """
    import json, random, sys
    from cachetier.config import CacheConfig
    from cachetier.localstore import LocalStore
    from cachetier.objects import ObjectStore
    from cachetier.tiered import TieredStore
    args = json.loads(sys.argv[1])
    objects = ObjectStore(LocalStore(args["repo"]))
    config = CacheConfig(**args["config"])
    rng = random.Random(args["seed"])
    with TieredStore(objects, config) as store:
        store.announce(args["ids"], reader=f"job-{args['seed']}")
        for _ in range(3):
            for oid in rng.sample(args["ids"], len(args["ids"])):
                assert objects.hash(store.read(oid)) == oid, oid
    print("ok")
    """
)


def test_processes_read_at_once_through_one_node_cache(
    tmp_path: Path, objects: ObjectStore, put_blobs, make_config
) -> None:
    ids = put_blobs([60_000] * 20)
    config: CacheConfig = make_config(ram_bytes=400_000, ssd_bytes=600_000, prefetch_depth=2)
    args = {"repo": str(tmp_path / "repo"), "ids": ids, "config": config.to_dict()}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, json.dumps(args | {"seed": seed})],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip() == "ok", err[-2000:]
    with TieredStore(objects, config) as observer:
        s = observer.stats()
        ram_files = sum(p.stat().st_blocks * 512 for p in observer.ram.values.iterdir())
        with observer.ssd.env.read() as txn:
            ssd_pages = observer.ssd.env.used_bytes(txn)
    assert s["reads"] == 4 * 3 * 20
    assert s["tiers"]["ram"]["hits"] + s["tiers"]["ssd"]["hits"] > 0
    assert ram_files <= 400_000 and ssd_pages <= 600_000
    assert s["degraded"] == {}


class CachedShards(Dataset):
    """Reads object ids through a TieredStore made (and used) in the parent before the fork."""

    def __init__(self, store: TieredStore, ids: list[str]):
        self.store, self.ids = store, ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        oid = self.ids[i]
        data = self.store.read(oid)
        return {"ok": self.store.objects.hash(data) == oid}


def test_forked_dataloader_workers_share_the_cache(objects: ObjectStore, put_blobs, make_config) -> None:
    ids = put_blobs([30_000] * 16)
    store = TieredStore(objects, make_config(ram_bytes=300_000, ssd_bytes=1 << 20))
    try:
        for oid in ids[:4]:
            store.read(oid)  # the parent opened LMDB and RAM: workers inherit open handles
        parent_plan = store.announce(ids[8:])  # workers must not move (or withdraw) the parent's plan
        loader = DataLoader(
            CachedShards(store, ids * 2),
            batch_size=4,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=lambda b: b,
        )
        rows = [row for batch in loader for row in batch]
        assert len(rows) == 32 and all(r["ok"] for r in rows)
        # Everything is cached somewhere, once the workers are done. (Seen from a worker
        # mid-pass, an object the other worker's fill is demoting from RAM to SSD is
        # briefly in neither: RAM unlinks it before the SSD write.)
        assert all(store.contains(oid) for oid in ids)
        observer = HintBoard(store.ssd.env)  # the board as another process sees it
        observer.refresh(force=True)
        assert observer.next_use([ids[8], ids[9]]) == {ids[8]: 0.0, ids[9]: 1.0}
        for oid in ids:
            assert objects.hash(store.read(oid)) == oid  # the parent's handle still works
        store.flush()
        assert store.stats()["reads"] == 4 + 32 + 16  # workers published their counts
        assert store.hints.local.readers() == [parent_plan]
    finally:
        store.close()
    assert torch.utils.data.get_worker_info() is None
