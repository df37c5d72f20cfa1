"""TieredStore: objects by id through RAM, then the SSD tier, then the object store.

Read path (:meth:`TieredStore.read`)::

    RAM hit  → a zero-copy view of the memory-mapped value
    SSD hit  → copied out of a short LMDB read transaction, then offered to RAM
               (promotion: the SSD copy stays)
    miss     → fetched from the object store (verified against its id, retried with
               backoff), then offered to RAM, and to the SSD tier if RAM refuses

A decoded value (:meth:`TieredStore.get_decoded`, e.g. a decompressed shard) lives in
RAM under its own key; a :class:`StreamingDecoder` writes it straight into a pending RAM
file, which is then admitted or unlinked, so it never sits in the reader's memory.

Each offer asks the placement policy (:mod:`cachetier.policy`) with the object's decayed
frequency (:mod:`cachetier.stats`) and next announced use (:mod:`cachetier.hints`). A raw
object that RAM evicts is offered to the SSD tier (demotion) unless it is there, so
with one job the two tiers together keep (RAM + SSD) / N of the data. Prefetched objects
are staged in RAM, and offered to the SSD tier for their use after the one they were
fetched for. A read is recorded in the
statistics *after* the decision, so a newcomer is judged on its history, like the
residents it would replace. The object store is the source of truth and is never
evicted from.

Every value from a cache tier is checked (the frame's XXH3 checksum, see
:mod:`cachetier._frame`; with ``verify="hash"`` the object id too); a damaged value is
dropped, counted as ``corrupt``, and the read falls through to the next tier.

Faults never break reads: a tier whose folder cannot be opened or written (permission,
full disk) is skipped and retried after a while (:mod:`cachetier.health`), so reads go
through to the object store; an object store that cannot be reached is retried with
backoff, then :class:`~cachetier.errors.StoreUnavailableError` is raised for that object
only, while cached objects keep being served.

Statistics, plan positions and counters are published to the node by
:mod:`cachetier.publish`, so :meth:`TieredStore.stats` in any process
(``dataset cache stats``) reports node-wide counters.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from cachetier.config import CacheConfig
from cachetier.errors import (
    IntegrityError,
    NotFoundError,
    StoreUnavailableError,
    UsageError,
)
from cachetier.flight import FlightLocks
from cachetier.hashing import BytesLike, content_hash
from cachetier.health import TIER_ERRORS, TierHealth
from cachetier.hints import HintBoard, Prefetcher
from cachetier.lmdbtier import Chooser, LmdbTier, SharedEnv
from cachetier.metrics import CacheCounters, FetchCounters, TierCounters
from cachetier.objects import ObjectStore
from cachetier.policy import Candidate, PlacementPolicy, get_policy
from cachetier.publish import CounterPublisher
from cachetier.ramtier import PendingValue, RamTier
from cachetier.stats import AccessStats, MemoryStats, SharedStats

__all__ = ["StreamingDecoder", "TieredStore", "decoded_key"]

# An SSD hit that RAM refused is not offered to RAM again for this many reads of this
# process: a refused offer costs a scan of RAM's residents (~0.5 ms, as much as the hit).
_RECONSIDER_AFTER = 128
_CORRUPT = object()

Decoder = Callable[[memoryview], BytesLike]


class StreamingDecoder(ABC):
    """A decoder that can also write its output to a file object.

    With one, :meth:`TieredStore.get_decoded` has the decoded value written straight
    into the RAM tier's file (:meth:`~cachetier.ramtier.RamTier.write_pending`): it
    never sits in the reader's memory, only in tmpfs, which the reader maps. Calling
    the decoder returns the value in memory (no RAM tier, or RAM unusable).
    """

    @abstractmethod
    def __call__(self, raw: memoryview) -> BytesLike:
        """The decoded value of ``raw``."""

    @abstractmethod
    def write_to(self, raw: memoryview, sink: Any) -> None:
        """Write the decoded value of ``raw`` (the same bytes ``self(raw)`` returns) to ``sink``."""


def decoded_key(oid: str, kind: str = "decoded") -> str:
    """The RAM-tier key of a value derived from object ``oid`` (e.g. a decompressed shard)."""
    return f"{oid}:{kind}"


def _base(key: str) -> str:
    return key.partition(":")[0]


class TieredStore:
    """Read objects by id through the node's RAM and SSD tiers, placed by a policy.

    ``objects`` is the repository's object store (None for a process that only
    inspects or rebalances the cache, such as ``dataset cache serve``). ``policy``
    overrides ``config.policy`` (a name or an instance). Safe to use from several
    threads, and from processes forked after it was made (each reopens what it needs).
    Pickling gives the same cache opened afresh in the process that unpickles it (a
    DataLoader worker started by spawn or forkserver): same tiers, its own counters.
    """

    def __init__(
        self,
        objects: ObjectStore | None,
        config: CacheConfig | None = None,
        *,
        policy: str | PlacementPolicy | None = None,
    ):
        self.objects = objects
        self.config = config = config or CacheConfig()
        self._policy_arg = policy
        self.policy = _make_policy(policy or config.policy, config)
        verify = config.verify != "none"
        self._env: SharedEnv | None = None
        self.ssd: LmdbTier | None = None
        if config.ssd_bytes:
            map_size = int(config.ssd_bytes * (1 + config.map_headroom))
            self._env = SharedEnv(config.lmdb_dir, map_size=map_size, budget=config.ssd_bytes)
            self.ssd = LmdbTier(self._env, budget=config.ssd_bytes, verify=verify)
        self.ram = (
            RamTier(
                config.resolved_ram_dir,
                budget=config.ram_bytes,
                verify=verify,
                owner=config.dir if config.ram_dir is None else None,
            )
            if config.ram_bytes
            else None
        )
        self._shared_stats = (
            SharedStats(self._env, flush_every=None) if self._env else None  # flushed by flush()
        )
        self._memory_stats = MemoryStats()
        self.hints = HintBoard(self._env)
        self.prefetcher = (
            Prefetcher(self._prefetch_one, workers=config.prefetch_workers)
            if self.ram is not None and config.prefetch_depth and config.prefetch_workers
            else None
        )
        self.counters = CacheCounters(
            ram=self.ram.counters if self.ram else TierCounters(),
            ssd=self.ssd.counters if self.ssd else TierCounters(),
            store=FetchCounters(),
        )
        self._pid = os.getpid()
        openers = {}
        if self.ram is not None:
            openers["ram"] = self.ram.open
        if self._env is not None:
            openers["ssd"] = self._env.open
        self.health = TierHealth(openers, self._count_error)
        self.publisher = CounterPublisher(
            self._env,
            snapshot=self._snapshot,
            write_buffered=self._write_buffered,
            usable=lambda: self._shared_stats is not None and self._usable("ssd"),
            on_error=lambda: self._count_error("ssd"),
        )
        #: one process fills a miss while the others on the node wait for it
        self.flights = _flight_locks(config) if self.ram is not None or self.ssd is not None else None
        self._prefetch_decode: tuple[Decoder, str] | None = None
        self._refused: dict[tuple[str, str], int] = {}
        self._closed = False

    # -- reads -------------------------------------------------------------------------

    def read(self, oid: str, *, reader: str | None = None) -> memoryview:
        """Return the verified bytes of object ``oid`` as a read-only view.

        A RAM hit is a view of the memory-mapped value (no copy); otherwise the view
        wraps a fresh ``bytes``. ``reader`` is the id :meth:`announce` returned, when a
        process reads for several plans (None moves every local plan expecting ``oid``).
        Raises NotFoundError when the object does not exist, StoreUnavailableError when
        it is not cached and the object store is unreachable.
        """
        self._begin_read(oid, reader)
        view = self._from_ram(oid, count=False)
        if view is not None:
            self._count_hit("ram", view.nbytes)
        else:
            with self._filling(oid):
                view = self._from_ram(oid)  # another process may have filled it meanwhile
                if view is None:
                    view = memoryview(self._fill_raw(oid))
        self._end_read(oid)
        return view.toreadonly()

    def _fill_raw(self, oid: str) -> bytes:
        data = self._from_ssd(oid, None)
        if data is not None:
            self._offer("ram", oid, data, promotion=True)  # the SSD copy stays
        else:
            data = self._fetch(oid)
            if not self._offer("ram", oid, data):  # what RAM takes reaches SSD when demoted
                self._offer("ssd", oid, data)
        return data

    def get(self, oid: str, *, reader: str | None = None) -> bytes:
        """Return the verified bytes of object ``oid`` (a copy on a RAM hit)."""
        view = self.read(oid, reader=reader)
        return view.obj if isinstance(view.obj, bytes) and len(view.obj) == view.nbytes else bytes(view)

    def get_decoded(
        self, oid: str, decode: Decoder, *, kind: str = "decoded", reader: str | None = None
    ) -> memoryview:
        """Return ``decode(bytes of oid)``, cached in RAM under :func:`decoded_key` ``(oid, kind)``.

        A hot read skips both the fetch and the decoding; on an SSD hit ``decode`` reads
        the LMDB value in place (no copy of the raw bytes). ``decode`` must be a pure
        function of the bytes and return a buffer.
        """
        self._begin_read(oid, reader)
        key = decoded_key(oid, kind)
        view = self._from_ram(key, count=False)
        if view is None:
            with self._filling(oid):
                view = self._from_ram(key, count=False)  # filled by another process meanwhile?
                if view is None:
                    decoded = self._fill_decoded(oid, key, decode)
                    if isinstance(decoded, PendingValue):  # written to tmpfs, mapped already
                        view = decoded.view
                    else:
                        # read it back from tmpfs when it went there: shared pages the reader
                        # maps as it goes, instead of a private copy for as long as it is used
                        view = self._from_ram(key, count=False) or memoryview(decoded)
                    del decoded
                else:
                    self._count_hit("ram", view.nbytes)
        else:
            self._count_hit("ram", view.nbytes)
        self._end_read(oid)
        return view.toreadonly()

    def _fill_decoded(self, oid: str, key: str, decode: Decoder) -> Any:
        """Decode ``oid`` (from RAM, SSD or the store) and offer the value to RAM; return
        it, a :class:`PendingValue` when it was written straight to tmpfs."""
        use = self._decoding(decode)
        raw = self._from_ram(oid)
        if raw is not None:
            decoded = use(raw)
        else:
            decoded = self._from_ssd(oid, use)
            if decoded is None:
                data = self._fetch(oid)
                self._offer("ssd", oid, data)
                decoded = use(memoryview(data))
        self._offer("ram", key, decoded)
        return decoded

    def _decoding(self, decode: Decoder) -> Callable[[memoryview], Any]:
        """``decode``, or for a :class:`StreamingDecoder` while RAM takes writes, a
        function that writes the value into a pending RAM-tier file."""
        ram = self.ram
        if not isinstance(decode, StreamingDecoder) or ram is None or not self._ram_writable():
            return decode

        def into_ram(raw: memoryview) -> Any:
            if raw.nbytes > ram.budget:  # decoded, it is bigger still: it could never be admitted
                ram.counters.rejections += 1
                return decode(raw)
            try:
                return ram.write_pending(lambda sink: decode.write_to(raw, sink))
            except StoreUnavailableError as e:  # tmpfs full or gone: decode in memory
                self.health.mark_read_only("ram", e)
                return decode(raw)

        return into_ram

    def _ram_writable(self) -> bool:
        return self.ram is not None and self._usable("ram") and self.health.writable("ram")

    def _filling(self, oid: str) -> AbstractContextManager[None]:
        """Single-flight for filling ``oid`` (raw or decoded) across threads and processes."""
        return self.flights.hold(oid) if self.flights is not None else nullcontext()

    def contains(self, oid: str) -> list[str]:
        """The tiers that hold ``oid`` now (``"ram"``, ``"ssd"``), fastest first."""
        held = []
        if self._usable("ram") and self.ram is not None and self.ram.exists(oid):
            held.append("ram")
        if self._usable("ssd") and self.ssd is not None and self.ssd.exists(oid):
            held.append("ssd")
        return held

    def _begin_read(self, oid: str, reader: str | None) -> None:
        if self._pid != os.getpid():
            self._after_fork()
        self.hints.advance(oid, reader)
        self.counters.reads += 1
        if self.prefetcher is not None:
            self.prefetcher.join(oid, timeout=60.0)

    def _end_read(self, oid: str) -> None:
        self._stats().record(oid)
        if self.prefetcher is not None:
            self.prefetcher.schedule(self.hints.upcoming(self.config.prefetch_depth))
        self.publisher.count_read()

    def _from_ram(self, key: str, *, count: bool = True) -> memoryview | None:
        if self.ram is None or not self._usable("ram"):
            return None
        try:
            view = self.ram.view(key)
        except OSError as e:
            self.health.mark_down("ram", e)
            return None
        if view is not None and not self._id_matches(key, view):
            self.ram.evict([key])
            self.ram.counters.corrupt += 1
            view = None
        if count:
            if view is None:
                self.counters.ram.misses += 1
            else:
                self._count_hit("ram", view.nbytes)
        return view

    def _from_ssd(self, oid: str, use: Callable[[memoryview], Any] | None) -> Any:
        """``use(view)`` inside a short read transaction, or a checked copy when ``use`` is None."""
        if self.ssd is None or not self._usable("ssd"):
            return None
        try:
            if use is None:
                result = self.ssd.read_bytes(oid)
                if result is not None and not self._id_matches(oid, memoryview(result)):
                    result = _CORRUPT
            else:
                result = self.ssd.read(
                    oid, lambda view: use(view) if self._id_matches(oid, view) else _CORRUPT
                )
        except TIER_ERRORS as e:
            self.health.mark_down("ssd", e)
            return None
        if result is _CORRUPT:
            self.ssd.counters.corrupt += 1
            self.health.guarded("ssd", self.ssd.evict, [oid])
            result = None
        if result is None:
            self.counters.ssd.misses += 1
        else:
            self._count_hit("ssd", _nbytes(result))
        return result

    def _count_hit(self, tier: str, nbytes: int) -> None:
        counters = self.counters.ram if tier == "ram" else self.counters.ssd
        counters.hits += 1
        counters.bytes_read += nbytes

    def _id_matches(self, key: str, view: memoryview) -> bool:
        if self.config.verify != "hash" or ":" in key or self.objects is None:
            return True
        return content_hash(view, self.objects.algorithm) == key

    def _fetch(self, oid: str) -> bytes:
        """Read ``oid`` from the object store, verified, with retries and backoff."""
        if self.objects is None:
            raise UsageError("this cache has no object store to fetch from", subject=f"object {oid}")
        attempts = self.config.fetch_retries + 1
        delay, last = self.config.retry_backoff, None
        for attempt in range(attempts):
            if attempt:
                self.counters.store.retries += 1
                time.sleep(delay)
                delay *= 2
            started = time.perf_counter()
            try:
                data = self.objects.get(oid)
            except NotFoundError:
                raise
            except (IntegrityError, StoreUnavailableError, OSError) as e:
                last = e
                continue
            self.counters.store.observe(time.perf_counter() - started, len(data))
            return data
        self.counters.store.failures += 1
        if isinstance(last, IntegrityError):
            raise last
        raise StoreUnavailableError(
            f"object store unreachable after {attempts} attempts: {last}",
            subject=f"{self.objects.store.url} object {oid}",
            hint="check the endpoint and network; objects already cached keep being served",
        ) from last

    # -- placement ---------------------------------------------------------------------

    def _offer(
        self, tier: str, key: str, data: BytesLike | PendingValue, *, skip: int = 0, promotion: bool = False
    ) -> bool:
        """Ask the policy whether ``key`` enters ``tier``; store it if so.

        Raw objects that RAM evicts to make room are offered to the SSD tier (demoted)
        unless it holds them already. A refused promotion (of an SSD hit to RAM) is not
        tried again for ``_RECONSIDER_AFTER`` reads: each try scans RAM's residents.
        A :class:`PendingValue` (RAM only) is renamed into place or discarded.
        """
        if isinstance(data, PendingValue):
            try:
                return self._offer_to(tier, key, data, skip=skip, promotion=promotion)
            finally:
                data.discard()  # a no-op once it is in place
        return self._offer_to(tier, key, data, skip=skip, promotion=promotion)

    def _offer_to(
        self, tier: str, key: str, data: BytesLike | PendingValue, *, skip: int, promotion: bool
    ) -> bool:
        target = self.ram if tier == "ram" else self.ssd
        if target is None or not self._usable(tier) or not self.health.writable(tier):
            return False
        refused_at = self._refused.get((tier, key))
        if promotion and refused_at is not None and self.counters.reads - refused_at < _RECONSIDER_AFTER:
            return False
        self.hints.refresh()
        demoted: list[tuple[str, memoryview]] = []
        chooser = self._chooser(key, skip=skip, demoted=demoted)
        try:
            if isinstance(data, PendingValue):
                assert isinstance(target, RamTier)
                admitted = target.admit_pending(key, data, chooser)
            else:
                admitted = target.admit(key, data, chooser)
        except TIER_ERRORS as e:
            self.health.mark_read_only(tier, e)
            admitted = False
        if promotion and not admitted:
            if len(self._refused) >= 1 << 16:
                self._refused.clear()
            self._refused[(tier, key)] = self.counters.reads
        for victim, view in demoted:
            if self.ssd is not None and self._usable("ssd") and not self.ssd.exists(victim):
                self._offer("ssd", victim, view)
        return admitted

    def _chooser(self, key: str, *, skip: int = 0, demoted: list[tuple[str, memoryview]]) -> Chooser:
        stats = self._stats()

        def choose(missing: int, residents: list[Any], txn: Any) -> list[str] | None:
            bases = {_base(r.key) for r in residents} | {_base(key)}
            records = stats.lookup(bases, txn=txn)
            uses = self.hints.next_use(bases, refresh=False)
            if skip:
                uses[_base(key)] = self.hints.next_use([_base(key)], skip=skip, refresh=False)[_base(key)]

            def candidate(k: str, size: int) -> Candidate:
                rec = records[_base(k)]
                return Candidate(k, size, rec.frequency, rec.last_access, uses[_base(k)])

            victims = self.policy.choose_victims(
                candidate(key, missing), [candidate(r.key, r.size) for r in residents], 0
            )
            if victims is None:
                return None
            if txn is None and self.ram is not None:  # RAM evicts: keep views of raw victims to demote
                for v in victims:
                    view = self.ram.view(v.key) if ":" not in v.key else None
                    if view is not None:
                        demoted.append((v.key, view))
            return [v.key for v in victims]

        return choose

    # -- hints and prefetch ------------------------------------------------------------

    def announce(
        self,
        oids: Iterable[str],
        *,
        reader: str | None = None,
        decode: Decoder | None = None,
        kind: str = "decoded",
    ) -> str:
        """Announce a reader's future read order; return the reader id (pass it to re-announce).

        The next ``prefetch_depth`` objects are fetched ahead into RAM and protected;
        eviction prefers what no plan needs soon. With ``decode``, prefetched objects
        are stored decoded (read them with :meth:`get_decoded` and the same ``kind``).
        A loader should announce the current epoch and the next one: its order is a
        pure function of seed and epoch, and the longer horizon lets the policy keep
        what the next epoch reads early.
        """
        if decode is not None:
            self._prefetch_decode = (decode, kind)
        reader = self.hints.announce(list(oids), reader=reader)
        if self.prefetcher is not None:
            self.prefetcher.schedule(self.hints.upcoming(self.config.prefetch_depth))
        return reader

    def withdraw(self, reader: str) -> None:
        """Withdraw a plan announced by this process."""
        self.hints.drop(reader)

    def _prefetch_one(self, oid: str) -> None:
        decode, kind = self._prefetch_decode or (None, "")
        key = decoded_key(oid, kind) if decode else oid
        if self.ram is None or not self._usable("ram") or self.ram.exists(key):
            return
        with self._filling(oid):
            if self.ram.exists(key):  # another process filled it meanwhile
                return
            use = self._decoding(decode) if decode else None
            value = self._from_ssd(oid, use)
            if value is None:
                data = self._fetch(oid)
                self._offer("ssd", oid, data, skip=1)  # worth keeping only for the read after the next
                value = use(memoryview(data)) if use else data
            self._offer("ram", key, value)

    # -- maintenance -------------------------------------------------------------------

    def warm(self, oids: Iterable[str], *, tier: str = "ssd", workers: int = 4) -> dict[str, int]:
        """Fetch objects into ``tier`` ahead of use; return counts by outcome.

        Warming records no access, so it fills free space and replaces only residents
        the policy ranks below a never-read object: it never pushes out what is in use.
        """
        if tier not in ("ram", "ssd"):
            raise UsageError(f"unknown tier {tier!r} (expected 'ram' or 'ssd')", subject=tier)
        target = self.ram if tier == "ram" else self.ssd
        outcome: Counter[str] = Counter()

        def one(oid: str) -> str:
            if target is not None and self._usable(tier) and target.exists(oid):
                return "cached"
            try:
                data = self._fetch(oid)
            except (NotFoundError, StoreUnavailableError, IntegrityError):
                return "failed"
            outcome["bytes_fetched"] += len(data)
            return "admitted" if self._offer(tier, oid, data) else "refused"

        oids = list(oids)
        with ThreadPoolExecutor(max(1, workers)) as pool:
            for result in pool.map(one, oids):
                outcome[result] += 1
        keys = ("cached", "admitted", "refused", "failed", "bytes_fetched")
        return {"requested": len(oids), **{k: outcome[k] for k in keys}}

    def evict(self, oids: Iterable[str] | None = None, *, tier: str | None = None) -> dict[str, int]:
        """Drop ``oids`` (and their decoded forms) from ``tier`` (both when None), or everything."""
        tiers = [tier] if tier else ["ram", "ssd"]
        self._refused.clear()
        removed = {}
        for name in tiers:
            target = self.ram if name == "ram" else self.ssd
            if target is None or not self._usable(name):
                removed[name] = 0
                continue
            if oids is None:
                keys = [r.key for r in target.residents()]
            else:
                wanted = set(oids)
                keys = [r.key for r in target.residents() if _base(r.key) in wanted]
            removed[name] = self.health.guarded(name, target.evict, keys) or 0
        return removed

    def rebalance(self) -> dict[str, Any]:
        """Housekeeping for ``dataset cache serve``: publish, retry broken tiers, fix budgets.

        Flushes statistics, clears reader slots and temp files left by dead processes,
        retries tiers marked broken, and evicts (least useful first) where a tier holds
        more than its budget (after the budget was lowered).
        """
        self.health.reset()
        self.flush()
        if self._env is not None and self._usable("ssd"):
            self.health.guarded("ssd", lambda: self._env.open().reader_check())
        self.hints.refresh(force=True)
        shrunk = {name: self._shrink(name) for name in ("ram", "ssd")}
        return {"evicted_over_budget": shrunk, "degraded": self.degraded()}

    def _shrink(self, tier: str) -> int:
        target = self.ram if tier == "ram" else self.ssd
        if target is None or not self._usable(tier):
            return 0
        usage = target.usage()
        over = usage["bytes_used"] - usage["budget"]
        if over <= 0:
            return 0
        residents = target.residents()
        bases = {_base(r.key) for r in residents}
        records = self._stats().lookup(bases)
        uses = self.hints.next_use(bases)
        ranked = self.policy.rank(
            [
                Candidate(
                    r.key,
                    r.size,
                    records[_base(r.key)].frequency,
                    records[_base(r.key)].last_access,
                    uses[_base(r.key)],
                )
                for r in residents
            ]
        )
        victims = []
        for c in ranked:
            if over <= 0:
                break
            victims.append(c.key)
            over -= c.size
        return self.health.guarded(tier, target.evict, victims) or 0

    def flush(self) -> None:
        """Publish buffered statistics, plan positions and counters to the node, in one commit."""
        self.publisher.flush()

    def _write_buffered(self, txn: object) -> None:
        if self._shared_stats is not None:
            self._shared_stats.flush(txn)
        self.hints.flush(txn)

    # -- reporting ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """A JSON-able report: per tier bytes used, budget, entries and counters; fetches.

        With a usable LMDB environment the counters are node-wide (every process's
        published counts plus this process's unpublished ones), else this process's.
        """
        node = self.publisher.node_counters()
        counters, scope = (self._snapshot(), "process") if node is None else (node, "node")
        served = counters.ram.hits + counters.ssd.hits
        tiers: dict[str, Any] = {}
        for name, target, tier_counters in (("ram", self.ram, counters.ram), ("ssd", self.ssd, counters.ssd)):
            entry: dict[str, Any] = {"enabled": target is not None, "path": target.url if target else None}
            entry.update({"bytes_used": 0, "budget": 0, "entries": 0})
            if target is not None and self._usable(name):
                usage = self.health.guarded(name, target.usage)
                entry.update(usage or {})
            entry.update(tier_counters.to_dict())
            tiers[name] = entry
        store = counters.store.to_dict()
        store.pop("latency_buckets")
        store["fetch_latency"] = counters.store.latency_dict()
        store["url"] = self.objects.store.url if self.objects is not None else None
        tiers["store"] = store
        return {
            "scope": scope,
            "policy": self.policy.name,
            "reads": counters.reads,
            "hit_ratio": served / counters.reads if counters.reads else 0.0,
            "tiers": tiers,
            "degraded": self.degraded(),
            "config": self.config.to_dict(),
        }

    def degraded(self) -> dict[str, str]:
        """Tiers currently skipped (or read-only), with the reason."""
        return self.health.degraded()

    def _snapshot(self) -> CacheCounters:
        return self.counters + CacheCounters()

    # -- plumbing ----------------------------------------------------------------------

    def _stats(self) -> AccessStats:
        if self._shared_stats is not None and self._usable("ssd"):
            return self._shared_stats
        return self._memory_stats

    def _usable(self, tier: str) -> bool:
        return self.health.usable(tier)

    def _count_error(self, tier: str) -> None:
        (self.counters.ram if tier == "ram" else self.counters.ssd).errors += 1

    def _after_fork(self) -> None:
        """In a forked child: the parent's unpublished counts are the parent's to publish."""
        self._pid = os.getpid()
        self.publisher.after_fork()

    def close(self) -> None:
        """Publish what is buffered, withdraw this process's plans, stop prefetching."""
        if self._closed:
            return
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.publisher.close()
        self.hints.close()
        if self.flights is not None:
            self.flights.close()
        self._closed = True
        if self._env is not None:
            self._env.close()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopened, (self.objects, self.config, self._policy_arg))

    def __enter__(self) -> TieredStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TieredStore(ram={self.config.ram_bytes}, ssd={self.config.ssd_bytes}, policy={self.policy!r})"
        )


def _nbytes(value: Any) -> int:
    if isinstance(value, PendingValue):
        return value.nbytes
    try:
        return memoryview(value).nbytes
    except TypeError:
        return 0


def _make_policy(policy: str | PlacementPolicy, config: CacheConfig) -> PlacementPolicy:
    if policy == "freq-hint":
        return get_policy(policy, protect=float(config.prefetch_depth))
    return get_policy(policy)


def _flight_locks(config: CacheConfig) -> FlightLocks:
    """The node's fill locks: next to the RAM tier when there is one, else the SSD tier."""
    folder = config.resolved_ram_dir if config.ram_bytes else config.lmdb_dir
    return FlightLocks(folder / "flight.lock")


def _reopened(
    objects: ObjectStore | None, config: CacheConfig, policy: str | PlacementPolicy | None
) -> TieredStore:
    """A :class:`TieredStore` unpickled in another process: the same cache, opened there."""
    return TieredStore(objects, config, policy=policy)
