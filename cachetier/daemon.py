"""``dataset cache serve``: the node's housekeeping loop and its Prometheus endpoint."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cachetier.config import CacheConfig
from cachetier.metrics import serve_metrics
from cachetier.objects import ObjectStore
from cachetier.tiered import TieredStore

__all__ = ["serve"]


def serve(
    config: CacheConfig,
    *,
    metrics_port: int,
    objects: ObjectStore | None = None,
    interval: float = 5.0,
    host: str = "127.0.0.1",
    stop: threading.Event | None = None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Rebalance the node cache every ``interval`` seconds and serve ``/metrics``; block until ``stop``.

    ``metrics_port=0`` picks a free port; ``on_ready(port)`` is called once serving.
    Prometheus text shows the same figures as :meth:`TieredStore.stats`.
    """
    stop = stop or threading.Event()
    with TieredStore(objects, config) as store:
        server = serve_metrics(store.stats, metrics_port, host=host)
        try:
            if on_ready is not None:
                on_ready(server.port)
            while not stop.wait(interval):
                store.rebalance()
        finally:
            server.close()
