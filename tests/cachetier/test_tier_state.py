"""A state machine: whatever tier holds an object, a read returns its stored bytes.

Hypothesis drives reads (raw and decoded), announcements, warms, evictions and damage to
cached values against a small RAM and SSD budget, and checks after every step that both
tiers stay within their budgets, measured as tmpfs blocks and LMDB pages in use.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import zlib
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from cachetier.config import CacheConfig
from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore

RAM_BUDGET = 96 << 10
SSD_BUDGET = 160 << 10


class TieredReads(RuleBasedStateMachine):
    objects = Bundle("objects")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tierdata-state-"))
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else self.tmp
        self.ram_dir = shm / f"tierdata-state-{uuid.uuid4().hex[:12]}"
        self.repo = ObjectStore(LocalStore(self.tmp / "repo"))
        config = CacheConfig(
            dir=self.tmp / "cache",
            ram_dir=self.ram_dir,
            ram_bytes=RAM_BUDGET,
            ssd_bytes=SSD_BUDGET,
            prefetch_depth=2,
            prefetch_workers=2,
        )
        self.store = TieredStore(self.repo, config)
        self.truth: dict[str, bytes] = {}

    @rule(
        target=objects,
        data=st.binary(min_size=0, max_size=40_000) | st.integers(1, 60_000).map(lambda n: b"z" * n),
    )
    def add(self, data: bytes) -> str:
        oid = self.repo.put(data)
        self.truth[oid] = data
        return oid

    @rule(oid=objects)
    def read(self, oid: str) -> None:
        assert bytes(self.store.read(oid)) == self.truth[oid]

    @rule(oid=objects)
    def read_decoded(self, oid: str) -> None:
        value = self.store.get_decoded(oid, lambda v: zlib.compress(v, 1), kind="z")
        assert zlib.decompress(value) == self.truth[oid]

    @rule(oids=st.lists(objects, max_size=8))
    def announce(self, oids: list[str]) -> None:
        self.store.announce(oids, reader="plan")

    @rule(oids=st.lists(objects, max_size=4))
    def warm(self, oids: list[str]) -> None:
        self.store.warm(oids, workers=2)

    @rule(oid=objects, tier=st.sampled_from(["ram", "ssd", None]))
    def evict(self, oid: str, tier: str | None) -> None:
        self.store.evict([oid], tier=tier)

    @precondition(lambda self: self.truth)
    @rule(oid=objects, offset=st.integers(0, 1 << 16))
    def damage(self, oid: str, offset: int) -> None:
        self.store.prefetcher.wait()
        path = self.store.ram.values / oid
        if path.exists():
            raw = bytearray(path.read_bytes())
            raw[offset % len(raw)] ^= 0x01
            path.write_bytes(raw)
        env = self.store.ssd.env
        with env.write() as txn:
            frame = txn.get(oid.encode(), db=env.db("data"))
            if frame is not None:
                frame = bytearray(frame)
                frame[offset % len(frame)] ^= 0x01
                txn.put(oid.encode(), bytes(frame), db=env.db("data"))

    @invariant()
    def budgets_hold(self) -> None:
        self.store.prefetcher.wait()  # measure between admissions (the budget holds at each commit)
        values = self.store.ram.values
        if values.exists():
            assert sum(p.stat().st_blocks * 512 for p in values.iterdir()) <= RAM_BUDGET
        env = self.store.ssd.env
        with env.read() as txn:
            assert env.used_bytes(txn) <= SSD_BUDGET
        assert env.file_bytes() <= env.map_size

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        shutil.rmtree(self.ram_dir, ignore_errors=True)


TieredReads.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
test_tiered_reads = TieredReads.TestCase
