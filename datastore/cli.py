"""The ``dataset`` command line: a thin layer over :class:`datastore.Repo`.

Each command is one function that calls the library and renders the result: text on
stdout (tables on a TTY), JSON with ``--json``; progress and logs go to stderr. Exit
codes: 0 success, 1 a user error (one line naming the file, line or ref at fault, no
traceback), 2 a usage error. Set ``TIERDATA_DEBUG=1`` for tracebacks.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from cachetier.errors import TierdataError

__all__ = ["build_parser", "main"]

log = logging.getLogger("tierdata")

Handler = Callable[[argparse.Namespace], Any]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    # numpy's OpenBLAS starts a busy-waiting thread per core when it is imported, and no
    # command uses BLAS: one thread saves ~0.14 s of CPU per command here (unless set).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        result = args.handler(args)
    except TierdataError as e:
        return _fail(args, str(e), type(e).__name__)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`dataset log | head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:
        if os.environ.get("TIERDATA_DEBUG"):
            raise
        return _fail(
            args,
            f"internal error: {type(e).__name__}: {e} (set TIERDATA_DEBUG=1 for a traceback)",
            "InternalError",
        )
    if isinstance(result, int):
        return result
    return 0


def run() -> NoReturn:
    """The ``dataset`` program: :func:`main`, then an exit without the interpreter's teardown.

    Arrow's native thread pools can abort a process while the interpreter and its static
    objects are torn down ("terminate called without an active exception",
    apache/arrow#34314), after the command did its work and printed its result: a commit
    that landed would report a crash. So the exit runs what a normal one runs for us
    (other threads finished, ``atexit`` handlers: logging, multiprocessing finalizers, the
    cache's counters), flushes the output, and ends with ``os._exit``.
    """
    code = main()
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
            pass
    os._exit(code)


def _fail(args: argparse.Namespace, message: str, kind: str) -> int:
    message = message.replace("\n", " ")
    print(f"error: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        _emit_json({"error": message, "kind": kind})
    return 1


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=None, sort_keys=True, ensure_ascii=False) + "\n")


def _emit(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> None:
    if args.json:
        _emit_json(data)
    else:
        out = text(data)
        if out:
            print(out)


# -- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every command (exposed for docs and tests)."""
    parser = argparse.ArgumentParser(
        prog="dataset",
        description="Versioned, deduplicated, tiered datasets for ML training.",
        parents=[_common_options(argparse.SUPPRESS)],
    )
    parser.set_defaults(json=False, verbose=False, chdir=None)
    # Options are accepted before and after the command; SUPPRESS keeps a subcommand's
    # default from overwriting what was given before it.
    common = _common_options(argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(handler=_in_dir(handler))
        return p

    p = command("init", cmd_init, "create (or attach to) a repository and write .dataset/")
    p.add_argument(
        "url", nargs="?", default="data-repo", help="local path or s3://bucket/prefix (default: ./data-repo)"
    )
    p.add_argument("--endpoint", help="S3 endpoint URL (default: AWS_ENDPOINT_URL)")

    p = command("ingest", cmd_ingest, "read sources, write shards, stage them")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--format", default="auto", choices=["auto", "jsonl", "parquet", "csv", "text", "files"])
    p.add_argument(
        "--shard-size", type=_byte_size(1), metavar="BYTES", help="target shard size (e.g. 32MiB; 1MB = 10^6)"
    )
    p.add_argument("--text-column", metavar="COL")
    p.add_argument("--on-error", default="fail", choices=["fail", "skip"])
    p.add_argument("--dedup", default="none", choices=["none", "exact", "minhash"])

    command("status", cmd_status, "staged changes and HEAD")
    command("reset", cmd_reset, "drop everything staged (its objects stay until gc)")

    p = command("version", cmd_version, "commit staged shards as a new version (or `version list`)")
    p.add_argument("action", nargs="?", choices=["list"], help="`list`: the history, like `log`")
    p.add_argument("-m", "--message", help="the version message")
    p.add_argument("--tag", metavar="T", help="also tag the new version")
    p.add_argument("--replace", action="store_true", help="replace the parent's data instead of appending")
    p.add_argument("-n", "--limit", type=_count)

    p = command("log", cmd_log, "history of REF (default HEAD)")
    p.add_argument("ref", nargs="?")
    p.add_argument("-n", "--limit", type=_count)

    p = command("show", cmd_show, "one version")
    p.add_argument("ref", nargs="?")

    p = command("diff", cmd_diff, "what changed from A to B (shards and records)")
    p.add_argument("a")
    p.add_argument("b", nargs="?")

    p = command("tag", cmd_tag, "create tag NAME at REF (no NAME: list tags)")
    p.add_argument("name", nargs="?")
    p.add_argument("ref", nargs="?")

    p = command("branch", cmd_branch, "create branch NAME at REF (no NAME: list branches)")
    p.add_argument("name", nargs="?")
    p.add_argument("ref", nargs="?")

    p = command("checkout", cmd_checkout, "switch HEAD; with --to, write the data into DIR")
    p.add_argument("ref")
    p.add_argument(
        "--to",
        metavar="DIR",
        help="a new or empty folder, or one holding an earlier checkout's part files (they are "
        "replaced); a files checkout writes into any folder, replacing files of the same paths",
    )
    p.add_argument("--format", choices=["jsonl", "parquet", "csv", "text", "files"])

    p = command("dedup", cmd_dedup, "new version without duplicates, with an audit of what was removed")
    p.add_argument("ref", nargs="?", help="the version to deduplicate (default HEAD)")
    p.add_argument("--method", default="minhash", choices=["exact", "minhash"])
    p.add_argument(
        "--threshold", type=_fraction, default=0.8, help="Jaccard threshold for near duplicates, in (0, 1]"
    )
    p.add_argument("--num-perm", type=_positive, default=128, help="MinHash permutations (default 128)")
    p.add_argument("--text-column", metavar="COL")
    p.add_argument("--scheduler", metavar="ADDR", help="a dask.distributed scheduler (tcp://host:8786)")
    p.add_argument("-m", "--message")

    p = command("cache", cmd_cache, "the node cache: stats | warm REF | evict | serve")
    p.add_argument("action", choices=["stats", "warm", "evict", "serve"])
    p.add_argument("ref", nargs="?", help="with warm: the version to fetch ahead (default HEAD)")
    p.add_argument("--ram-bytes", type=_byte_size(0), metavar="N", help="RAM tier budget (0: no RAM tier)")
    p.add_argument("--ssd-bytes", type=_byte_size(0), metavar="N", help="SSD tier budget (0: no SSD tier)")
    p.add_argument("--cache-dir", metavar="D")
    p.add_argument("--tier", choices=["ram", "ssd"], help="warm/evict: one tier (warm default: ssd)")
    p.add_argument(
        "--metrics-port", type=int, default=9108, metavar="P", help="serve: Prometheus port (0: any)"
    )
    p.add_argument(
        "--interval", type=float, default=5.0, metavar="S", help="serve: seconds between rebalances"
    )

    p = command("verify", cmd_verify, "re-hash everything a version references")
    p.add_argument("ref", nargs="?")
    p.add_argument("--all", action="store_true", help="every version any branch or tag reaches")

    p = command("gc", cmd_gc, "delete unreferenced objects older than the grace period")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--grace", type=_seconds, default=3600.0, metavar="SECONDS", help="default 3600")

    return parser


def _common_options(default: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=default, help="machine-readable output on stdout"
    )
    common.add_argument("-v", "--verbose", action="store_true", default=default, help="debug logs on stderr")
    common.add_argument("-C", dest="chdir", metavar="DIR", default=default, help="run as if started in DIR")
    return common


def _in_dir(handler: Handler) -> Handler:
    def run(args: argparse.Namespace) -> Any:
        if args.chdir:
            try:
                os.chdir(args.chdir)
            except OSError as e:
                from cachetier.errors import UsageError

                raise UsageError(f"cannot change into it: {e.strerror}", subject=f"-C {args.chdir}") from e
        return handler(args)

    return run


def _number(convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)`` if ``ok`` accepts it, else a usage error saying ``what``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}: {text!r}")
        return value

    return parse


_count = _number(int, lambda v: v >= 0, "a whole number, 0 or more")
_positive = _number(int, lambda v: v >= 1, "a whole number, 1 or more")
_seconds = _number(float, lambda v: 0 <= v < float("inf"), "a finite number of seconds, 0 or more")
_fraction = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")


def _byte_size(minimum: int) -> Callable[[str], int]:
    """An argparse type: a byte size read by :func:`cachetier.parse_size`, at least ``minimum``."""

    def parse(text: str) -> int:
        from cachetier.config import parse_size

        try:
            value = parse_size(text, name="size")
        except TierdataError as e:
            raise argparse.ArgumentTypeError(f"{e.message} (e.g. 33554432, 32MiB, 1GB)") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"byte size must be at least {minimum}: {text!r}")
        return value

    return parse


def _open() -> Any:
    from datastore.repo import Repo

    return Repo.open()


@contextmanager
def _progress(args: argparse.Namespace, desc: str, unit: str = "B"):
    if args.json or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(desc=desc, unit=unit, unit_scale=True, unit_divisor=1024, file=sys.stderr, leave=False) as bar:
        yield bar.update


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# -- commands -----------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> None:
    from datastore.repo import Repo

    options = {"endpoint": args.endpoint} if args.endpoint else {}
    repo = Repo.init(args.url, workspace=".", **options)
    _emit(
        args,
        {"repo": repo.url, "branch": repo.head.branch},
        lambda d: f"repository {d['repo']} (branch {d['branch']})",
    )


def cmd_ingest(args: argparse.Namespace) -> None:
    repo = _open()
    with _progress(args, "ingest") as progress:
        summary = repo.ingest(
            args.sources,
            format=args.format,
            shard_size=args.shard_size,
            text_column=args.text_column,
            on_error=args.on_error,
            progress=progress,
        )
    if args.dedup != "none":
        summary["dedup"] = repo.dedup_staged(method=args.dedup)
    _emit(
        args,
        summary,
        lambda d: (
            f"staged {d['records']} records in {d['shards']} shards "
            f"({_human(d['bytes'])}, {_human(d['new_bytes'])} new)"
            + (f", skipped {d['skipped']} bad records" if d["skipped"] else "")
        ),
    )


def cmd_status(args: argparse.Namespace) -> None:
    status = _open().status()

    def text(d: dict[str, Any]) -> str:
        where = f"on branch {d['branch']}" if d["branch"] else f"HEAD detached at {d['version'][:12]}"
        head = f"{where} at {d['version'][:12]}" if d["branch"] and d["version"] else where
        staged = d["staged"]
        if not staged["ingests"]:
            return f"{head}\nnothing staged"
        size = _human(staged["bytes"])
        return f"{head}\nstaged: {staged['records']} records in {staged['shards']} shards ({size})"

    _emit(args, status, text)


def cmd_reset(args: argparse.Namespace) -> None:
    repo = _open()
    dropped = repo.status()["staged"]
    repo.unstage()

    def text(d: dict[str, Any]) -> str:
        if not d["dropped"]["ingests"]:
            return "nothing staged"
        return f"dropped {d['dropped']['records']} staged records in {d['dropped']['shards']} shards"

    _emit(args, {"dropped": dropped}, text)


def cmd_version(args: argparse.Namespace) -> int | None:
    if args.action == "list":
        return cmd_log(argparse.Namespace(**{**vars(args), "ref": None}))
    if not args.message:  # a usage error, like argparse's (exit 2)
        print("dataset version: error: a version needs a message (-m MESSAGE)", file=sys.stderr)
        return 2
    info = _open().commit(args.message, tag=args.tag, replace=args.replace)
    _emit(
        args,
        info.to_dict(),
        lambda d: f"version {d['version'][:12]}: {d['records']} records, {d['shards']} shards",
    )
    return None


def _log_line(d: dict[str, Any]) -> str:
    return f"{d['version'][:12]}  {d['created'][:19]}  {d['records']:>10} records  {d['message']}"


def cmd_log(args: argparse.Namespace) -> None:
    infos = _open().log(args.ref, limit=args.limit)
    _emit(args, [i.to_dict() for i in infos], lambda rows: "\n".join(_log_line(d) for d in rows))


def cmd_show(args: argparse.Namespace) -> None:
    info = _open().show(args.ref)

    def text(d: dict[str, Any]) -> str:
        lines = [
            f"version  {d['version']}",
            f"parents  {' '.join(p[:12] for p in d['parents']) or '-'}",
            f"created  {d['created']}  by {d['author']}",
            f"records  {d['records']}   shards {d['shards']}   bytes {_human(d['bytes'])}",
            f"op       {d['operation'].get('op')}",
            f"columns  {', '.join(f['name'] + ':' + f['type'] for f in d['schema'])}",
            "",
            f"    {d['message']}",
        ]
        return "\n".join(lines)

    _emit(args, info.to_dict(), text)


def cmd_diff(args: argparse.Namespace) -> None:
    result = _open().diff(args.a, args.b).to_dict()
    _emit(
        args,
        result,
        lambda d: (
            f"+{d['added_records']} records, -{d['removed_records']} records "
            f"(+{d['added_shards']} shards, -{d['removed_shards']} shards)"
        ),
    )


def cmd_tag(args: argparse.Namespace) -> None:
    repo = _open()
    if args.name is None:
        tags = repo.tags()
        _emit(args, tags, lambda d: "\n".join(f"{k}  {v[:12]}" for k, v in sorted(d.items())))
        return
    version = repo.tag(args.name, args.ref)
    _emit(args, {"tag": args.name, "version": version}, lambda d: f"tag {d['tag']} -> {d['version'][:12]}")


def cmd_branch(args: argparse.Namespace) -> None:
    repo = _open()
    if args.name is None:
        current = repo.head.branch
        branches = repo.branches()
        _emit(
            args,
            branches,
            lambda d: "\n".join(
                f"{'*' if k == current else ' '} {k}  {v[:12]}" for k, v in sorted(d.items())
            ),
        )
        return
    version = repo.branch(args.name, args.ref)
    _emit(
        args,
        {"branch": args.name, "version": version},
        lambda d: f"branch {d['branch']} -> {d['version'][:12]}",
    )


def cmd_checkout(args: argparse.Namespace) -> None:
    repo = _open()
    info = repo.checkout(args.ref, to=args.to, format=args.format)
    data = {**info.to_dict(), "head": repo.head.to_dict(), "to": args.to}
    _emit(
        args,
        data,
        lambda d: (
            f"HEAD is now {args.ref} ({d['version'][:12]})"
            + (f"; data written to {d['to']}" if d["to"] else "")
        ),
    )


def cmd_dedup(args: argparse.Namespace) -> None:
    repo = _open()
    result = repo.dedup(
        args.ref,
        method=args.method,
        threshold=args.threshold,
        num_perm=args.num_perm,
        text_column=args.text_column,
        scheduler=args.scheduler,
        message=args.message,
    )
    _emit(
        args,
        result,
        lambda d: (
            f"version {d['version'][:12]}: removed {d['removed_records']} of {d['records']} records "
            f"({d['exact_removed']} exact, {d['near_removed']} near) in {d['clusters']} clusters; "
            f"audit {d['audit'][:12]}"
        ),
    )


def _cache_config(args: argparse.Namespace) -> Any:
    from cachetier.config import load_cache_config
    from datastore.workspace import find_workspace

    ws = find_workspace()
    settings = ws.settings.get("cache", {}) if ws else {}
    return load_cache_config(settings, dir=args.cache_dir, ram_bytes=args.ram_bytes, ssd_bytes=args.ssd_bytes)


def cmd_cache(args: argparse.Namespace) -> None:
    from cachetier.daemon import serve
    from cachetier.tiered import TieredStore

    config = _cache_config(args)
    if args.action == "serve":

        def ready(port: int) -> None:
            print(f"serving Prometheus metrics on http://127.0.0.1:{port}/metrics", file=sys.stderr)
            if args.json:
                _emit_json({"metrics_port": port, "cache_dir": str(config.dir)})
                sys.stdout.flush()

        serve(config, metrics_port=args.metrics_port, interval=args.interval, on_ready=ready)
        return
    if args.action == "warm":
        repo = _open()
        with TieredStore(repo.objects, config) as cache:
            info = repo.show(args.ref)
            table = repo.shard_table(info.version)
            # The shard table too: a loader reads it through the cache (see RepoShardSource).
            oids = [info.record.data_hash, *table.hashes(), *table.chunk_ids()]
            result = {"version": info.version, **cache.warm(oids, tier=args.tier or "ssd")}
        _emit(
            args,
            result,
            lambda d: (
                f"warmed {d['requested']} objects: {d['admitted']} admitted, {d['cached']} already cached, "
                f"{d['refused']} refused, {d['failed']} failed"
            ),
        )
        return
    with TieredStore(None, config) as cache:
        if args.action == "evict":
            result = cache.evict(tier=args.tier)
            _emit(args, result, lambda d: ", ".join(f"{k}: {v} evicted" for k, v in d.items()))
            return
        stats = cache.stats()

    def text(d: dict[str, Any]) -> str:
        rows = [f"{'tier':5} {'used':>10} {'budget':>10} {'hits':>8} {'misses':>8} {'evictions':>9}"]
        for name, t in d["tiers"].items():
            if "budget" in t:
                rows.append(
                    f"{name:5} {_human(t['bytes_used']):>10} {_human(t['budget']):>10} "
                    f"{t['hits']:>8} {t['misses']:>8} {t['evictions']:>9}"
                )
        return "\n".join(rows)

    _emit(args, stats, text)


def cmd_verify(args: argparse.Namespace) -> int:
    report = _open().verify(args.ref, all_refs=args.all)

    def text(d: dict[str, Any]) -> str:
        lines = [f"{p['problem']} {p['kind']} {p['object']}: {p['message']}" for p in d["problems"]]
        verdict = "ok" if d["ok"] else f"{len(d['problems'])} problem(s)"
        lines.append(
            f"{verdict}: checked {d['objects']} objects ({_human(d['bytes'])}) of {d['versions']} version(s)"
        )
        return "\n".join(lines)

    _emit(args, report, text)
    if not report["ok"]:
        for p in report["problems"]:
            print(f"error: {p['problem']} {p['kind']} {p['object']}", file=sys.stderr)
        return 1
    return 0


def cmd_gc(args: argparse.Namespace) -> None:
    report = _open().gc(dry_run=args.dry_run, grace_seconds=args.grace)

    def text(d: dict[str, Any]) -> str:
        verb = "would remove" if d["dry_run"] else "removed"
        lines = [f"{i['kind']} {i['id']}  {_human(i['size'])}" for i in d["items"]] if d["dry_run"] else []
        lines.append(f"{verb} {d['removed']} item(s), {_human(d['bytes'])}")
        return "\n".join(lines)

    _emit(args, report, text)


if __name__ == "__main__":
    run()
