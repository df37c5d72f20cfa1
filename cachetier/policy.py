"""Placement policies: which objects a byte-budgeted tier keeps, as small named classes.

A policy sees one admission at a time: the *newcomer* (an object that could enter a
tier) and the tier's *residents*, each described by a :class:`Candidate` (size, decayed
access frequency, last access, next announced use). It answers with the residents to
evict so the newcomer fits, or ``None`` to leave the newcomer out. A policy holds no
storage state, so the same class drives the real tiers (:mod:`cachetier.tiered`) and the
trace simulator (``benchmarks/cache``), and another policy plugs in by name::

    get_policy("freq-hint")      # ours: next announced use, then frequency; stable set
    get_policy("lru")            # least recently used (thrashes on epoch shuffles)
    get_policy("lfu")            # least frequently used, always admits
    get_policy("no-eviction")    # fill once, never evict

Time is logical everywhere (the shared access count, see :mod:`cachetier.stats`), and
``next_use`` counts reads of the announcing reader until the object is read again
(``math.inf`` when no reader announced it).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from cachetier.errors import BadInputError

__all__ = [
    "Candidate",
    "FrequencyHintPolicy",
    "LfuPolicy",
    "LruPolicy",
    "NoEvictionPolicy",
    "PlacementPolicy",
    "available_policies",
    "get_policy",
    "register_policy",
]

INF = math.inf


@dataclass(frozen=True, slots=True)
class Candidate:
    """What a policy knows of one object: its key, bytes it takes, and how it is used."""

    key: str
    size: int
    frequency: float = 0.0
    last_access: float = -INF
    next_use: float = INF


class PlacementPolicy(ABC):
    """Decide admissions and evictions for one byte-budgeted tier."""

    #: The name that :func:`get_policy` finds this policy under.
    name: ClassVar[str]

    @abstractmethod
    def rank(self, residents: Sequence[Candidate]) -> list[Candidate]:
        """Return ``residents`` ordered least useful first (the eviction order)."""

    @abstractmethod
    def may_replace(self, newcomer: Candidate, victim: Candidate) -> bool:
        """True when ``newcomer`` is worth evicting ``victim`` for."""

    def choose_victims(
        self, newcomer: Candidate, residents: Sequence[Candidate], free: int
    ) -> list[Candidate] | None:
        """Return the residents to evict so ``newcomer`` fits in ``free`` bytes plus theirs.

        ``[]`` admits without evicting; ``None`` leaves the newcomer out, which happens
        when some victim it would need is at least as useful as the newcomer.
        """
        if newcomer.size <= free:
            return []
        victims: list[Candidate] = []
        for victim in self.rank([r for r in residents if r.key != newcomer.key]):
            if not self.may_replace(newcomer, victim):
                return None
            victims.append(victim)
            free += victim.size
            if newcomer.size <= free:
                return victims
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FrequencyHintPolicy(PlacementPolicy):
    """Ours: keep what is read soonest by announced plans, then what is read most often.

    Usefulness orders first by next announced use (sooner is better; unannounced is
    last), then by decayed frequency. A newcomer evicts a resident only when it is
    *strictly* more useful: an earlier announced use, or with equal announcements a
    frequency above the resident's by more than ``margin`` (relative). Ties keep the
    resident, so with one job reading shuffled epochs (every object read once per epoch,
    equal frequencies) the first objects admitted stay and the hit ratio converges to
    the C/N ceiling, where LRU thrashes. Residents whose next use is within ``protect``
    reads (prefetched, about to be read) are never evicted.

    The newcomer's frequency must exclude the access being served (callers record the
    access after deciding), so that it is compared on the same footing as residents.
    """

    name = "freq-hint"

    def __init__(self, *, margin: float = 0.25, protect: float = 0.0):
        if margin < 0 or protect < 0:
            raise BadInputError(f"margin={margin} and protect={protect} must be >= 0", subject="policy")
        self.margin = margin
        self.protect = protect

    def rank(self, residents: Sequence[Candidate]) -> list[Candidate]:
        return sorted(residents, key=lambda c: (-c.next_use, c.frequency, c.last_access, -c.size))

    def may_replace(self, newcomer: Candidate, victim: Candidate) -> bool:
        if victim.next_use <= self.protect:
            return False
        if newcomer.next_use != victim.next_use:
            return newcomer.next_use < victim.next_use
        return newcomer.frequency > victim.frequency * (1.0 + self.margin) + 1e-9

    def __repr__(self) -> str:
        return f"FrequencyHintPolicy(margin={self.margin}, protect={self.protect})"


class LruPolicy(PlacementPolicy):
    """Evict the least recently used resident; always admit."""

    name = "lru"

    def rank(self, residents: Sequence[Candidate]) -> list[Candidate]:
        return sorted(residents, key=lambda c: c.last_access)

    def may_replace(self, newcomer: Candidate, victim: Candidate) -> bool:
        return True


class LfuPolicy(PlacementPolicy):
    """Evict the least frequently used resident (decayed counts); always admit."""

    name = "lfu"

    def rank(self, residents: Sequence[Candidate]) -> list[Candidate]:
        return sorted(residents, key=lambda c: (c.frequency, c.last_access))

    def may_replace(self, newcomer: Candidate, victim: Candidate) -> bool:
        return True


class NoEvictionPolicy(PlacementPolicy):
    """Admit while there is room, never evict: the "fill once" baseline."""

    name = "no-eviction"

    def rank(self, residents: Sequence[Candidate]) -> list[Candidate]:
        return list(residents)

    def may_replace(self, newcomer: Candidate, victim: Candidate) -> bool:
        return False


_REGISTRY: dict[str, Callable[..., PlacementPolicy]] = {
    cls.name: cls for cls in (FrequencyHintPolicy, LruPolicy, LfuPolicy, NoEvictionPolicy)
}


def register_policy(cls: type[PlacementPolicy]) -> type[PlacementPolicy]:
    """Make ``cls`` available to :func:`get_policy` under ``cls.name`` (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def available_policies() -> list[str]:
    """Return the names :func:`get_policy` accepts."""
    return sorted(_REGISTRY)


def get_policy(policy: str | PlacementPolicy, **params: Any) -> PlacementPolicy:
    """Return ``policy`` itself, or a new instance of the policy registered under that name."""
    if isinstance(policy, PlacementPolicy):
        return policy
    try:
        factory = _REGISTRY[policy]
    except KeyError:
        known = ", ".join(available_policies())
        raise BadInputError(f"unknown placement policy {policy!r} (known: {known})", subject=policy) from None
    return factory(**params)
