"""Simulated caches: the peers' eviction algorithms and ours, on unit-size objects.

Every cache has ``access(job, key, position) -> bool`` (a hit or not) and
``start_epoch(job, plans)`` (a job starts an epoch; ``plans`` are the orders of this
epoch and the following ones, which only hinted caches look at).
``capacity`` counts objects. These are written from the papers' descriptions:

- ``LruCache``: least recently used.
- ``LfuCache``: exact counts, evict the least frequent (ties: least recent), always admit.
- ``NoEvictionCache``: fill once, never evict.
- ``ArcCache``: ARC (Megiddo & Modha, FAST 2003).
- ``S3FifoCache``: S3-FIFO (Yang et al., SOSP 2023): small FIFO 10%, main FIFO, ghost FIFO.
- ``WTinyLfuCache``: W-TinyLFU (Einziger et al., 2017): 1% LRU window, SLRU main
  (20% probation / 80% protected), TinyLFU admission with counts halved every 10×C
  accesses (exact counters instead of a count-min sketch).
- ``BeladyCache``: the offline optimum, with the whole future (evicts, or bypasses, the
  object whose next use is furthest).
- ``PolicyCache``: any :class:`cachetier.policy.PlacementPolicy` driven the way
  :class:`cachetier.tiered.TieredStore` drives it: decayed frequencies from
  :class:`cachetier.stats.MemoryStats`, next use from :class:`cachetier.hints.HintIndex`,
  the access recorded after the admission decision.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Sequence

from cachetier.hints import HintIndex
from cachetier.policy import Candidate, PlacementPolicy
from cachetier.stats import MemoryStats

__all__ = [
    "ArcCache",
    "BeladyCache",
    "LfuCache",
    "LruCache",
    "NoEvictionCache",
    "PolicyCache",
    "S3FifoCache",
    "WTinyLfuCache",
]


class SimCache:
    """Base: unit-size objects, ``capacity`` of them."""

    def __init__(self, capacity: int):
        self.capacity = capacity

    def start_epoch(self, job: int, plans: Sequence[Sequence[int]]) -> None:
        pass

    def access(self, job: int, key: int, position: int) -> bool:
        raise NotImplementedError


class LruCache(SimCache):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.items: OrderedDict[int, None] = OrderedDict()

    def access(self, job: int, key: int, position: int) -> bool:
        if key in self.items:
            self.items.move_to_end(key)
            return True
        self.items[key] = None
        if len(self.items) > self.capacity:
            self.items.popitem(last=False)
        return False


class NoEvictionCache(SimCache):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.items: set[int] = set()

    def access(self, job: int, key: int, position: int) -> bool:
        if key in self.items:
            return True
        if len(self.items) < self.capacity:
            self.items.add(key)
        return False


class LfuCache(SimCache):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.count: defaultdict[int, int] = defaultdict(int)
        self.last: dict[int, int] = {}
        self.items: set[int] = set()
        self.t = 0

    def access(self, job: int, key: int, position: int) -> bool:
        self.t += 1
        self.count[key] += 1
        self.last[key] = self.t
        if key in self.items:
            return True
        if len(self.items) >= self.capacity:
            victim = min(self.items, key=lambda k: (self.count[k], self.last[k]))
            self.items.remove(victim)
        self.items.add(key)
        return False


class ArcCache(SimCache):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def _replace(self, in_b2: bool) -> None:
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)):
            old, _ = self.t1.popitem(last=False)
            self.b1[old] = None
        elif self.t2:
            old, _ = self.t2.popitem(last=False)
            self.b2[old] = None
        else:
            old, _ = self.t1.popitem(last=False)
            self.b1[old] = None

    def access(self, job: int, key: int, position: int) -> bool:
        c = self.capacity
        if key in self.t1 or key in self.t2:
            self.t1.pop(key, None)
            self.t2.pop(key, None)
            self.t2[key] = None
            return True
        if key in self.b1:
            self.p = min(c, self.p + max(len(self.b2) / len(self.b1), 1))
            self._replace(False)
            del self.b1[key]
            self.t2[key] = None
            return False
        if key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1))
            self._replace(True)
            del self.b2[key]
            self.t2[key] = None
            return False
        if len(self.t1) + len(self.b1) == c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                self._replace(False)
            else:
                self.t1.popitem(last=False)
        elif len(self.t1) + len(self.b1) < c:
            total = len(self.t1) + len(self.t2) + len(self.b1) + len(self.b2)
            if total >= c:
                if total == 2 * c:
                    self.b2.popitem(last=False)
                self._replace(False)
        self.t1[key] = None
        return False


class S3FifoCache(SimCache):
    def __init__(self, capacity: int, small_ratio: float = 0.1):
        super().__init__(capacity)
        self.small_cap = max(1, int(capacity * small_ratio))
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def _evict_main(self) -> None:
        while self.main:
            key, _ = self.main.popitem(last=False)
            if self.freq[key] > 0:
                self.freq[key] -= 1
                self.main[key] = None
            else:
                del self.freq[key]
                return

    def _evict_small(self) -> None:
        while self.small:
            key, _ = self.small.popitem(last=False)
            if self.freq[key] > 1:
                self.main[key] = None
                self.freq[key] = 0
                if len(self.main) > self.capacity - self.small_cap:
                    self._evict_main()
            else:
                del self.freq[key]
                self.ghost[key] = None
                if len(self.ghost) > self.capacity - self.small_cap:
                    self.ghost.popitem(last=False)
                return

    def access(self, job: int, key: int, position: int) -> bool:
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, 3)
            return True
        while len(self.small) + len(self.main) >= self.capacity:
            if len(self.small) >= self.small_cap or not self.main:
                self._evict_small()
            else:
                self._evict_main()
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = None
        else:
            self.small[key] = None
        self.freq[key] = 0
        return False


class WTinyLfuCache(SimCache):
    def __init__(self, capacity: int, window_ratio: float = 0.01, protected_ratio: float = 0.8):
        super().__init__(capacity)
        self.window_cap = max(1, round(capacity * window_ratio))
        main_cap = capacity - self.window_cap
        self.protected_cap = int(main_cap * protected_ratio)
        self.main_cap = main_cap
        self.window: OrderedDict[int, None] = OrderedDict()
        self.probation: OrderedDict[int, None] = OrderedDict()
        self.protected: OrderedDict[int, None] = OrderedDict()
        self.count: defaultdict[int, int] = defaultdict(int)
        self.samples = 0
        self.reset_at = 10 * capacity

    def _touch(self, key: int) -> None:
        self.count[key] = min(self.count[key] + 1, 15)
        self.samples += 1
        if self.samples >= self.reset_at:
            for k in list(self.count):
                self.count[k] //= 2
                if not self.count[k]:
                    del self.count[k]
            self.samples //= 2

    def access(self, job: int, key: int, position: int) -> bool:
        self._touch(key)
        if key in self.window:
            self.window.move_to_end(key)
            return True
        if key in self.protected:
            self.protected.move_to_end(key)
            return True
        if key in self.probation:
            del self.probation[key]
            self.protected[key] = None
            if len(self.protected) > self.protected_cap:
                demoted, _ = self.protected.popitem(last=False)
                self.probation[demoted] = None
            return True
        self.window[key] = None
        if len(self.window) > self.window_cap:
            candidate, _ = self.window.popitem(last=False)
            if len(self.probation) + len(self.protected) < self.main_cap:
                self.probation[candidate] = None
            else:
                victims = self.probation or self.protected
                victim = next(iter(victims))
                if self.count[candidate] > self.count[victim]:
                    del victims[victim]
                    self.probation[candidate] = None
        return False


class BeladyCache(SimCache):
    """Needs the whole trace: ``future[t]`` is the time of the next read of read t's key."""

    def __init__(self, capacity: int, keys: Sequence[int]):
        super().__init__(capacity)
        self.next_at = [0] * len(keys)
        last: dict[int, int] = {}
        for t in range(len(keys) - 1, -1, -1):
            self.next_at[t] = last.get(keys[t], len(keys) + 1)
            last[keys[t]] = t
        self.items: dict[int, int] = {}
        self.t = 0

    def access(self, job: int, key: int, position: int) -> bool:
        nxt = self.next_at[self.t]
        self.t += 1
        if key in self.items:
            self.items[key] = nxt
            return True
        if len(self.items) < self.capacity:
            self.items[key] = nxt
        else:
            victim = max(self.items, key=self.items.__getitem__)
            if self.items[victim] > nxt:
                del self.items[victim]
                self.items[key] = nxt
        return False


class PolicyCache(SimCache):
    """A cachetier placement policy over unit-size objects.

    With ``epochs_ahead`` > 0, each job announces that many epoch orders when it starts
    an epoch (1: the current epoch; 2: the current and the next, which a loader knows
    because its order is a pure function of seed and epoch); 0 announces nothing.
    """

    def __init__(self, capacity: int, policy: PlacementPolicy, *, epochs_ahead: int):
        super().__init__(capacity)
        self.policy = policy
        self.hints = epochs_ahead > 0
        self.epochs_ahead = epochs_ahead
        self.stats = MemoryStats()
        self.index = HintIndex()
        self.items: set[str] = set()

    def start_epoch(self, job: int, plans: Sequence[Sequence[int]]) -> None:
        if self.hints:
            self.index.set_plan(str(job), [str(k) for plan in plans[: self.epochs_ahead] for k in plan])

    def _candidate(self, key: str, record: object) -> Candidate:
        return Candidate(key, 1, record.frequency, record.last_access, self.index.next_use(key))

    def access(self, job: int, key: int, position: int) -> bool:
        skey = str(key)
        if self.hints:
            self.index.set_position(str(job), position + 1)
        hit = skey in self.items
        if not hit:
            records = self.stats.lookup([skey, *self.items])
            newcomer = self._candidate(skey, records[skey])
            residents = [self._candidate(k, records[k]) for k in self.items]
            victims = self.policy.choose_victims(newcomer, residents, self.capacity - len(self.items))
            if victims is not None:
                for v in victims:
                    self.items.discard(v.key)
                self.items.add(skey)
        self.stats.record(skey)
        return hit
