"""Placement policies: the admission rule as properties, and convergence on epoch shuffles."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachetier.errors import BadInputError
from cachetier.hints import HintIndex
from cachetier.policy import (
    Candidate,
    FrequencyHintPolicy,
    PlacementPolicy,
    available_policies,
    get_policy,
    register_policy,
)
from cachetier.stats import Decay, MemoryStats

uses = st.one_of(st.just(math.inf), st.integers(0, 50).map(float))
candidates = st.builds(
    Candidate,
    key=st.text("abcdef", min_size=1, max_size=4),
    size=st.integers(1, 100),
    frequency=st.floats(0, 20),
    last_access=st.floats(0, 1000),
    next_use=uses,
)


def residents_of(cands: list[Candidate]) -> list[Candidate]:
    seen: dict[str, Candidate] = {}
    for c in cands:
        seen.setdefault(c.key, c)
    return list(seen.values())


@given(
    newcomer=candidates,
    residents=st.lists(candidates, max_size=12),
    free=st.integers(0, 100),
    margin=st.floats(0, 1),
    protect=st.integers(0, 5),
)
def test_victims_make_room_and_are_each_less_useful(newcomer, residents, free, margin, protect) -> None:
    policy = FrequencyHintPolicy(margin=margin, protect=protect)
    residents = [r for r in residents_of(residents) if r.key != newcomer.key]
    victims = policy.choose_victims(newcomer, residents, free)
    if victims is None:
        return
    assert free + sum(v.size for v in victims) >= newcomer.size
    for v in victims:
        assert v.next_use > protect  # protected residents stay
        if v.next_use == newcomer.next_use:
            assert newcomer.frequency > v.frequency * (1 + margin)  # strictly more useful
        else:
            assert newcomer.next_use < v.next_use
    if victims:  # no victim is kept while a less useful resident could have gone instead
        order = policy.rank(residents)
        assert [v.key for v in victims] == [c.key for c in order[: len(victims)]]


@given(newcomer=candidates, residents=st.lists(candidates, max_size=12))
def test_a_newcomer_never_evicts_an_equally_useful_resident(newcomer, residents) -> None:
    twins = [
        Candidate(f"r{i}", r.size, newcomer.frequency, r.last_access, newcomer.next_use)
        for i, r in enumerate(residents)
    ]
    assert FrequencyHintPolicy().choose_victims(newcomer, twins, 0) in (None, [])


def test_furthest_next_use_goes_first_then_least_frequent() -> None:
    policy = FrequencyHintPolicy(margin=0.0)
    residents = [
        Candidate("soon", 1, frequency=1, next_use=2),
        Candidate("later", 1, frequency=9, next_use=40),
        Candidate("never-hot", 1, frequency=5, next_use=math.inf),
        Candidate("never-cold", 1, frequency=1, next_use=math.inf),
    ]
    assert [c.key for c in policy.rank(residents)] == ["never-cold", "never-hot", "later", "soon"]
    assert policy.choose_victims(Candidate("new", 1, next_use=10), residents, 0)[0].key == "never-cold"
    assert policy.choose_victims(Candidate("new", 1, frequency=0.5), residents, 0) is None


def test_protected_residents_are_never_evicted() -> None:
    policy = FrequencyHintPolicy(protect=3)
    residents = [Candidate("prefetched", 10, next_use=1)]
    assert policy.choose_victims(Candidate("urgent", 10, next_use=0), residents, 0) is None


def test_baselines_and_registry() -> None:
    residents = [Candidate("old", 1, 5, last_access=1), Candidate("new", 1, 1, last_access=9)]
    assert get_policy("lru").choose_victims(Candidate("x", 1), residents, 0)[0].key == "old"
    assert get_policy("lfu").choose_victims(Candidate("x", 1), residents, 0)[0].key == "new"
    assert get_policy("no-eviction").choose_victims(Candidate("x", 1, 100), residents, 0) is None
    assert get_policy("no-eviction").choose_victims(Candidate("x", 1), residents, 1) == []
    assert {"freq-hint", "lru", "lfu", "no-eviction"} <= set(available_policies())
    with pytest.raises(BadInputError, match="unknown placement policy 'nope'"):
        get_policy("nope")

    @register_policy
    class Biggest(PlacementPolicy):
        name = "test-biggest"

        def rank(self, residents):
            return sorted(residents, key=lambda c: -c.size)

        def may_replace(self, newcomer, victim):
            return True

    assert isinstance(get_policy("test-biggest"), Biggest)


def run_epochs(policy: PlacementPolicy, n: int, capacity: int, epochs: int, *, hints: bool, seed: int = 0):
    """Drive ``policy`` the way TieredStore does; return the hit ratio of each epoch."""
    rng = random.Random(seed)
    stats, index, cache, ratios = MemoryStats(Decay()), HintIndex(), set(), []
    for _ in range(epochs):
        order = [str(k) for k in rng.sample(range(n), n)]
        if hints:
            index.set_plan("job", order)
        hits = 0
        for pos, key in enumerate(order):
            index.set_position("job", pos + 1)
            if key in cache:
                hits += 1
            else:
                recs = stats.lookup([key, *cache])
                cand = [
                    Candidate(k, 1, recs[k].frequency, recs[k].last_access, index.next_use(k)) for k in cache
                ]
                new = Candidate(key, 1, recs[key].frequency, recs[key].last_access, index.next_use(key))
                victims = policy.choose_victims(new, cand, capacity - len(cache))
                if victims is not None:
                    cache.difference_update(v.key for v in victims)
                    cache.add(key)
            stats.record(key)
        ratios.append(hits / n)
    return ratios


@pytest.mark.parametrize("hints", [False, True])
def test_one_job_converges_to_the_ceiling_where_lru_thrashes(hints: bool) -> None:
    n, capacity = 300, 90
    ours = run_epochs(FrequencyHintPolicy(), n, capacity, 5, hints=hints)
    lru = run_epochs(get_policy("lru"), n, capacity, 5, hints=False)
    assert ours[0] == 0 and all(r == capacity / n for r in ours[1:])
    assert max(lru[1:]) < 0.5 * capacity / n
