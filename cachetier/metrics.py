"""Cache counters in dataclasses, and their Prometheus exposition.

Each tier counts its own events in a :class:`TierCounters`; fetches from the object
store go in a :class:`FetchCounters` with a latency histogram. :class:`CacheCounters`
groups them, adds and subtracts them (so a process can publish only what changed since
its last flush into the node-wide totals kept in the LMDB environment) and turns them
into plain dicts. :func:`serve_metrics` serves a stats dict (the shape returned by
:meth:`cachetier.tiered.TieredStore.stats`) as Prometheus text on ``/metrics`` from a
registry of its own, bound to 127.0.0.1 by default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetier.errors import UsageError

__all__ = [
    "LATENCY_BUCKETS",
    "CacheCounters",
    "FetchCounters",
    "MetricsServer",
    "TierCounters",
    "render_prometheus",
    "serve_metrics",
]

#: Upper bounds (seconds) of the fetch-latency histogram buckets; the last bucket is +Inf.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Arithmetic:
    """Field-wise ``+`` and ``-`` for counter dataclasses (lists element-wise)."""

    __slots__ = ()

    def _combine(self, other: Any, sign: int) -> Any:
        values = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                values[f.name] = [x + sign * y for x, y in zip(a, b)]
            elif isinstance(a, _Arithmetic):
                values[f.name] = a._combine(b, sign)
            else:
                values[f.name] = a + sign * b
        return type(self)(**values)

    def __add__(self, other: Any) -> Any:
        return self._combine(other, 1)

    def __sub__(self, other: Any) -> Any:
        return self._combine(other, -1)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict of every counter."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(slots=True)
class TierCounters(_Arithmetic):
    """Events of one cache tier (RAM or SSD)."""

    hits: int = 0
    misses: int = 0
    admissions: int = 0
    rejections: int = 0
    evictions: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    corrupt: int = 0
    errors: int = 0
    map_full: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierCounters:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing ones are 0."""
        return cls(**{f.name: int(data.get(f.name, 0)) for f in dataclasses.fields(cls)})


@dataclass(slots=True)
class FetchCounters(_Arithmetic):
    """Reads from the object store: count, bytes, retries, failures, latency histogram."""

    fetches: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    failures: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))

    def observe(self, seconds: float, nbytes: int) -> None:
        """Count one successful fetch of ``nbytes`` that took ``seconds``."""
        self.fetches += 1
        self.bytes_fetched += nbytes
        self.latency_sum += seconds
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.latency_buckets[i] += 1
                return
        self.latency_buckets[-1] += 1

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FetchCounters:
        """Inverse of :meth:`to_dict`."""
        buckets = list(data.get("latency_buckets", ()))
        buckets += [0] * (len(LATENCY_BUCKETS) + 1 - len(buckets))
        return cls(
            fetches=int(data.get("fetches", 0)),
            bytes_fetched=int(data.get("bytes_fetched", 0)),
            retries=int(data.get("retries", 0)),
            failures=int(data.get("failures", 0)),
            latency_sum=float(data.get("latency_sum", 0.0)),
            latency_buckets=[int(b) for b in buckets[: len(LATENCY_BUCKETS) + 1]],
        )

    def latency_dict(self) -> dict[str, Any]:
        """The histogram as ``{count, sum_seconds, buckets: {bound: cumulative count}}``."""
        cumulative, running = {}, 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.latency_buckets):
            running += n
            cumulative[bound] = running
        return {"count": running, "sum_seconds": self.latency_sum, "buckets": cumulative}


@dataclass(slots=True)
class CacheCounters(_Arithmetic):
    """Counters of the whole cache: reads asked for, RAM tier, SSD tier, object-store fetches."""

    reads: int = 0
    ram: TierCounters = field(default_factory=TierCounters)
    ssd: TierCounters = field(default_factory=TierCounters)
    store: FetchCounters = field(default_factory=FetchCounters)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CacheCounters:
        """Inverse of :meth:`to_dict`."""
        return cls(
            reads=int(data.get("reads", 0)),
            ram=TierCounters.from_dict(data.get("ram", {})),
            ssd=TierCounters.from_dict(data.get("ssd", {})),
            store=FetchCounters.from_dict(data.get("store", {})),
        )


# -- Prometheus ------------------------------------------------------------------------

_TIER_GAUGES = {
    "bytes_used": "Bytes the tier really occupies (tmpfs blocks, LMDB pages in use)",
    "budget": "Byte budget of the tier",
    "entries": "Values held by the tier",
}
_TIER_COUNTERS = {
    "hits": "Reads served by the tier",
    "misses": "Reads the tier could not serve",
    "evictions": "Values evicted from the tier",
    "admissions": "Values admitted to the tier",
    "rejections": "Admissions the placement policy refused",
    "bytes_read": "Bytes served by the tier",
    "bytes_written": "Bytes admitted to the tier",
    "corrupt": "Damaged values detected, dropped and re-fetched",
}


def _families(stats: Mapping[str, Any]) -> Iterator[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    tiers = {name: t for name, t in stats.get("tiers", {}).items() if name in ("ram", "ssd")}
    for key, doc in _TIER_GAUGES.items():
        family = GaugeMetricFamily(f"tierdata_cache_{key}", doc, labels=["tier"])
        for name, tier in tiers.items():
            family.add_metric([name], float(tier.get(key, 0)))
        yield family
    for key, doc in _TIER_COUNTERS.items():
        family = CounterMetricFamily(f"tierdata_cache_{key}", doc, labels=["tier"])
        for name, tier in tiers.items():
            family.add_metric([name], float(tier.get(key, 0)))
        yield family
    store = stats.get("tiers", {}).get("store", {})
    for key, doc in (
        ("fetches", "Objects fetched from the object store"),
        ("bytes_fetched", "Bytes fetched from the object store"),
        ("retries", "Object-store fetch retries"),
        ("failures", "Object-store fetches that failed after retries"),
    ):
        family = CounterMetricFamily(f"tierdata_store_{key}", doc)
        family.add_metric([], float(store.get(key, 0)))
        yield family
    latency = store.get("fetch_latency") or FetchCounters().latency_dict()
    hist = HistogramMetricFamily("tierdata_store_fetch_latency_seconds", "Object-store fetch latency")
    hist.add_metric([], [(b, float(n)) for b, n in latency["buckets"].items()], latency["sum_seconds"])
    yield hist


class _Collector:
    def __init__(self, stats: Callable[[], Mapping[str, Any]]):
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        return _families(self._stats())


def render_prometheus(stats: Mapping[str, Any]) -> bytes:
    """Return ``stats`` as Prometheus text exposition."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(lambda: stats))
    return generate_latest(registry)


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it."""

    def __init__(self, server: Any, thread: Any, port: int):
        self._server = server
        self._thread = thread
        self.port = port

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(
    stats: Callable[[], Mapping[str, Any]], port: int, *, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve ``stats()`` (called on every scrape) as Prometheus text on ``http://host:port/metrics``.

    ``port=0`` picks a free port (see ``.port``).
    """
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise UsageError(
            f"cannot serve metrics on {host}:{port}: {e.strerror or e}",
            subject=f"--metrics-port {port}",
            hint="pick another port (0: any free one)",
        ) from e
    return MetricsServer(server, thread, server.server_address[1])
