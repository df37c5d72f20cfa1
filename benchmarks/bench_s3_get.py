"""GET throughput and CPU cost from an S3 server: our S3Store (minio client) against s3fs.

Both clients fetch the same ``--objects`` objects of ``--size-mib`` MiB with ``--inflight``
requests in flight (S3Store: a thread pool; s3fs: its own async ``cat`` with that batch
size), alternating round by round. CPU time is this process's (``time.process_time``:
every thread, s3fs's event loop included; the server's CPU is not counted). Also the
latency of small sequential GETs. Prints one JSON document (and writes it with ``--out``).

Run from the repository root (the server comes from ``tests/s3server.py`` unless
``--endpoint`` is given, with keys from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)::

    python -m benchmarks.bench_s3_get                       # full: 64 x 4 MiB, 5 rounds
    python -m benchmarks.bench_s3_get --objects 16 --rounds 2 --small-gets 50   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["main"]

MiB = 1 << 20
GiB = 1 << 30


def measure(fetch: Callable[[], int]) -> dict[str, float]:
    """Run ``fetch`` (returns bytes read) once; return wall and CPU figures."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    nbytes = fetch()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "bytes": nbytes,
        "wall_s": wall,
        "cpu_s": cpu,
        "wall_gb_per_s": nbytes / 1e9 / wall,
        "cpu_s_per_gib": cpu / (nbytes / GiB),
    }


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Medians over rounds, plus the rounds themselves."""
    keys = ("wall_gb_per_s", "cpu_s_per_gib", "wall_s", "cpu_s")
    return {**{k: round(statistics.median(r[k] for r in rounds), 4) for k in keys}, "rounds": rounds}


def small_get_latency_ms(get: Callable[[], bytes], count: int) -> dict[str, float]:
    """Median and p90 latency of ``count`` sequential small GETs, in milliseconds."""
    get()  # warm the connection
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        get()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"median_ms": round(statistics.median(times), 3), "p90_ms": round(times[int(0.9 * len(times))], 3)}


def run(endpoint: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Upload the objects, then time both clients round by round."""
    import s3fs

    from cachetier.s3store import S3Store

    url = f"s3://tierdata-bench/get-{uuid.uuid4().hex[:12]}"
    store = S3Store.from_url(url, options=endpoint.options())
    store.ensure_bucket()
    size = int(args.size_mib * MiB)
    keys = [f"obj/{i:05d}" for i in range(args.objects)]
    payload = os.urandom(size)
    with ThreadPoolExecutor(args.inflight) as pool:
        list(pool.map(lambda k: store.put(k, payload), keys))
    store.put("small", os.urandom(1024))

    fs = s3fs.S3FileSystem(
        key=endpoint.access_key,
        secret=endpoint.secret_key,
        endpoint_url=endpoint.url,
        client_kwargs={"region_name": endpoint.region},
        max_concurrency=args.inflight,
    )
    paths = [f"{store.bucket}/{store.prefix}/{k}" for k in keys]
    pool = ThreadPoolExecutor(args.inflight)

    def ours() -> int:
        return sum(len(b) for b in pool.map(store.get, keys))

    def theirs() -> int:
        return sum(len(b) for b in fs.cat(paths, batch_size=args.inflight).values())

    clients = {"tierdata_s3store": ours, "s3fs": theirs}
    for fetch in clients.values():  # warm-up: connections, credentials, event loop
        fetch()
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in clients}
    for _ in range(args.rounds):
        for name, fetch in clients.items():
            rounds[name].append(measure(fetch))
    small_path = f"{store.bucket}/{store.prefix}/small"
    small = {
        "tierdata_s3store": small_get_latency_ms(lambda: store.get("small"), args.small_gets),
        "s3fs": small_get_latency_ms(lambda: fs.cat_file(small_path), args.small_gets),
    }
    pool.shutdown()
    for key in [*keys, "small"]:
        store.delete(key)
    store.close()
    return {
        "benchmark": "s3_get",
        "server": endpoint.kind,
        "params": {
            "objects": args.objects,
            "object_mib": args.size_mib,
            "inflight": args.inflight,
            "rounds": args.rounds,
            "small_gets": args.small_gets,
        },
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "get_4mib": {name: summarize(r) for name, r in rounds.items()},
        "small_get_1kib": small,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=64, help="objects per round (default 64)")
    parser.add_argument("--size-mib", type=float, default=4.0, help="object size in MiB (default 4)")
    parser.add_argument("--inflight", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per client (default 5)")
    parser.add_argument("--small-gets", type=int, default=200, help="sequential 1 KiB GETs (default 200)")
    parser.add_argument("--endpoint", help="use this S3 endpoint instead of starting SeaweedFS")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:  # run as a script: make `tests` and `cachetier` importable
        sys.path.insert(0, root)
    from tests.s3server import S3Endpoint, S3Server, start_s3_server

    if args.endpoint:
        endpoint = S3Endpoint(
            args.endpoint,
            os.environ.get("AWS_ACCESS_KEY_ID", "minioadmin"),
            os.environ.get("AWS_SECRET_ACCESS_KEY", "minioadmin"),
            region=os.environ.get("AWS_REGION", "us-east-1"),
        )
        server = S3Server(endpoint)
    else:
        server = start_s3_server()
    try:
        result = run(server.endpoint, args)
    finally:
        server.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
