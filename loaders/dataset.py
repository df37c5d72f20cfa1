"""``StreamingDataset``: one version of a dataset as a torch ``IterableDataset``.

An iteration is a pipeline of small stages, each a module of its own::

    plan (loaders.plan)  ->  partition over ranks and workers (loaders.partition)
      ->  shards decoded ahead on threads (loaders.prefetch, loaders.decoded)
      ->  each batch's records taken from them (loaders.assemble)
      ->  batches built column-wise (loaders.columns)  ->  optional transform

Where an iteration starts (epoch, what remains of it, a worker's own progress) is resolved
once, in :meth:`StreamingDataset._begin`; ``StreamingDataLoader`` resolves it in the
training process and hands the result to its workers, so every worker of every rank
partitions the same remaining stream.

Epochs: ``set_epoch(e)`` selects one (as with ``DistributedSampler``). Without it, a new
iteration continues where the last one stopped, and after a finished epoch starts the
next one. The dataset counts what it yields when it is iterated directly or by a plain
``DataLoader(num_workers=0)``; with worker processes, ``StreamingDataLoader`` (or
torchdata's ``StatefulDataLoader``, which asks each worker) keeps the count.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from cachetier.config import parse_size
from cachetier.errors import BadInputError, UsageError
from loaders.assemble import batch_rows
from loaders.columns import kind_of
from loaders.decoded import DecodedShard, batch_from_pieces, join_pieces, samples_from_pieces, select_columns
from loaders.ipcview import Field, IpcFile, UnsupportedIpc
from loaders.lead import Lead
from loaders.partition import MAX_LEVELS, Partition, Remaining, Runs
from loaders.plan import EpochPlan, make_plan
from loaders.prefetch import ShardPrefetcher, needed_shards, touched_windows
from loaders.selection import check_columns, select
from loaders.source import ShardSource, chunk_reader, open_source, source_schema, use_loader_memory_pool
from loaders.state import LoaderState, WorkerProgress
from loaders.world import World

__all__ = ["StreamingDataset"]

#: decoded bytes a shuffle group of small shards reaches (a typical shard is a group alone)
DEFAULT_SHUFFLE_GROUP = 8 << 20
#: decoded bytes of a page-local shuffle block (see loaders.plan)
DEFAULT_SHUFFLE_BLOCK = 4 << 20
_READ_THREADS = 4  # shard reads in flight per reader: hides object-store latency


@dataclass(frozen=True, slots=True)
class _Spec:
    """Where one iteration starts, decided once for every reader of every rank."""

    epoch: int
    remaining: Remaining
    rank: int
    world_size: int
    block: int
    drop_last: bool
    by_loader: bool
    resume_worker: WorkerProgress | None = None

    #: Length of :meth:`to_ints`' list (the persistent workers' channel).
    INTS = 7 + 3 * MAX_LEVELS

    def to_ints(self) -> list[int]:
        levels = [x for level in self.remaining.levels for x in level]
        head = [self.epoch, self.rank, self.world_size, self.block, int(self.drop_last), int(self.by_loader)]
        return [*head, len(self.remaining.levels), *levels, *[0] * (self.INTS - 7 - len(levels))]

    @classmethod
    def from_ints(cls, v: Sequence[int], records: int) -> _Spec:
        v = [int(x) for x in v]
        levels = tuple((v[i], v[i + 1], v[i + 2]) for i in range(7, 7 + 3 * v[6], 3))
        return cls(v[0], Remaining(records, levels), v[1], v[2], v[3], bool(v[4]), bool(v[5]))


@dataclass(slots=True)
class _Progress:
    """What the iteration running in this process has yielded so far.

    ``open`` until the iteration ends: exhausted, or closed by a consumer that stopped.
    """

    spec: _Spec
    part: Partition
    world: World
    skipped: int
    chunks: int = 0
    samples: int = 0
    complete: bool = False
    open: bool = True
    #: made by a DataLoader worker (not inherited from the process that forked it)
    in_worker: bool = False

    def give_back(self, items: int, *, batches: bool) -> None:
        """Count the last ``items`` items yielded (batches, else samples) as not yielded:
        a consumer read them ahead and never handed them on (one process, no workers)."""
        if items <= 0:
            return
        if batches:
            self.chunks = max(0, self.chunks - items)
            self.samples = self.part.samples_through(self.chunks - 1)
        else:
            self.samples = max(0, self.samples - items)
            self.chunks = min(self.chunks, self.samples // max(1, self.part.block))
        self.complete = False


class StreamingDataset(IterableDataset):
    """A version of a dataset streamed in a reproducible, resumable order.

    ``repo_or_url`` is a :class:`~loaders.source.ShardSource`, or a repository (object or
    URL) opened at ``ref`` through ``datastore.open_shard_source`` with ``cache`` (a
    ``cachetier.CacheConfig``, or None for the workspace/environment defaults).

    - ``columns``: the columns to read, a name or a sequence of names (default: all but
      hidden ``__`` columns); checked against the version's schema when the source knows
      it. A ``files`` dataset gives every file's bytes in ``data``, big files reassembled
      from their chunks through the cache; its ``chunks`` column (the chunk ids) is
      hidden unless named (see :mod:`loaders.selection`).
    - ``shuffle`` / ``seed``: shuffle shards, then records within a window sliding over
      ``shuffle_window`` groups of shards (:mod:`loaders.plan`); the order is a pure
      function of (version, seed, epoch). A wider window mixes more groups per batch but
      holds more decoded shards, and a resume must decode a whole window (read in
      parallel) before its first batch, where the fresh start ramps up from one group: 2
      keeps a resume close to a fresh start; 4 or more suits data whose shards are
      internally correlated. Shards are grouped when the source knows their decoded
      sizes (a repository does): consecutive shards (in the shuffled order) form a group
      of at least ``shuffle_group`` decoded bytes (an int or a size such as ``"32MiB"``),
      so a dataset of small shards mixes as many records per window as one of big
      shards; a shard of that size or more is a group of its own. Within a window the
      shuffle is page-local when the decoded sizes are known: records are permuted
      within blocks of about ``shuffle_block`` decoded bytes (default 4 MiB), each made
      of 16 runs of neighbouring rows drawn from across the window, so a shuffled epoch
      reads each page of the shards about once (a batch mixes records of about 16 runs
      of all the window's groups); ``shuffle_block=0`` permutes the whole window
      uniformly, at the cost of page faults and mapped memory.
    - ``batch_size``: yield dicts of tensors built column-wise (see :mod:`loaders.columns`);
      ``drop_last`` drops each rank's short last batch. Without it, yield one dict per
      sample (let the DataLoader batch them).
    - ``transform``: applied to every yielded item (a sample, or a batch in batch mode);
      it must return one item per input.
    - ``prefetch``: shards decoded ahead of those in use (memory per reader: at most
      ``shuffle_window + prefetch`` decoded groups, ``1 + prefetch`` shards without
      shuffle; with several readers, ranks or workers, ``shuffle_window - 1 + prefetch``
      and a small part of one, see :mod:`loaders.assemble`).

    Promises: per epoch every record is yielded at most once over all ranks, every rank
    yields the same count, and with one rank every record exactly once.
    """

    #: in a DataLoader worker whose process has not yet set the loader's Arrow pool
    _worker_pool = False

    def __init__(
        self,
        repo_or_url: Any,
        ref: str = "main",
        *,
        columns: str | Iterable[str] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        batch_size: int | None = None,
        drop_last: bool = False,
        transform: Callable[[Any], Any] | None = None,
        cache: Any = None,
        shuffle_window: int = 2,
        shuffle_group: int | str = DEFAULT_SHUFFLE_GROUP,
        shuffle_block: int | str = DEFAULT_SHUFFLE_BLOCK,
        prefetch: int = 1,
    ) -> None:
        super().__init__()
        columns = check_columns(columns)
        batch_size = _check_int("batch_size", batch_size, 1, optional=True)
        shuffle_window = _check_int("shuffle_window", shuffle_window, 1)
        seed = _check_int("seed", seed, None)
        prefetch = _check_int("prefetch", prefetch, None)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, not {type(transform).__name__}")
        self.source: ShardSource = open_source(repo_or_url, ref, cache)
        self.version_id = str(self.source.version_id)
        self._shards = tuple((str(sid), int(n)) for sid, n in self.source.shards)
        self.records = sum(n for _, n in self._shards)
        self.columns = columns
        schema = source_schema(self.source)
        #: what is read for ``columns`` (a files dataset's chunks too: see loaders.selection)
        self._selection = select(columns, schema)
        #: whether a decoded file can hold the columns read (else shards are read as tables)
        self._views = _views_hold(schema, self._selection.read)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.transform = transform
        self.shuffle_window = shuffle_window
        self.shuffle_group = parse_size(shuffle_group, name="shuffle_group")
        self.shuffle_block = parse_size(shuffle_block, name="shuffle_block")
        sizes = getattr(self.source, "shard_bytes", None)
        self._shard_bytes = tuple(int(b) for b in sizes) if sizes is not None else None
        self.prefetch = max(0, prefetch)
        self._epoch = 0
        self._explicit_epoch = False
        self._resume: LoaderState | None = None
        self._progress: _Progress | None = None
        self._ranks: World | None = None
        self._block: tuple[int, bool] | None = None
        self._loader_spec: _Spec | None = None
        self._channel: Any = None
        self._turns: Any = None

    # -- epochs and state -------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration reads."""
        return self._progress.spec.epoch if self._progress is not None else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next; a loaded state for another epoch is dropped."""
        if epoch < 0:
            raise BadInputError(f"epoch {epoch} is negative", subject="epoch")
        self._fold_progress()
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None
        self._epoch = int(epoch)
        self._explicit_epoch = True

    def plan(self, epoch: int | None = None) -> EpochPlan:
        """The plan (global order) of ``epoch`` (default: the current one)."""
        return make_plan(
            self.version_id,
            self._shards,
            seed=self.seed,
            epoch=self.epoch if epoch is None else epoch,
            shuffle=self.shuffle,
            window=self.shuffle_window,
            weights=self._shard_bytes,
            min_group=self.shuffle_group if self._shard_bytes is not None else 0,
            block=self.shuffle_block if self._shard_bytes is not None else 0,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where this process's iteration stands, as a small JSON-able dict (see loaders.state)."""
        return self._current_state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration; another version, seed or plan is refused."""
        parsed = LoaderState.from_dict(state)
        parsed.check_compatible(
            version=self.version_id,
            seed=self.seed,
            records=self.records,
            shuffle=self.shuffle,
            window=self.shuffle_window,
            group=self.shuffle_group,
            block=self.shuffle_block,
        )
        self._resume = parsed
        self._epoch = parsed.epoch
        self._progress = None
        self._explicit_epoch = False

    def _state(self, epoch: int, remaining: Remaining, worker: WorkerProgress | None = None) -> LoaderState:
        return LoaderState(
            version=self.version_id,
            seed=self.seed,
            epoch=epoch,
            remaining=remaining,
            shuffle=self.shuffle,
            window=self.shuffle_window,
            worker=worker,
            group=self.shuffle_group,
            block=self.shuffle_block,
        )

    def _current_state(self, progress: _Progress | None = None) -> LoaderState:
        p = self._progress if progress is None else progress
        if p is None:
            return (
                self._resume
                if self._resume is not None
                else self._state(self._epoch, Remaining(self.records))
            )
        if p.world.num_workers == 1:
            return self._state(p.spec.epoch, p.part.after(p.samples))
        done = p.skipped + p.chunks
        last_chunk = p.world.worker + (done - 1) * p.world.num_workers if done else -1
        remaining = p.part.after(p.part.samples_through(last_chunk))
        progress = WorkerProgress(
            levels=p.part.remaining.levels,
            world_size=p.part.world_size,
            rank=p.part.rank,
            block=p.part.block,
            num_workers=p.world.num_workers,
            worker=p.world.worker,
            chunks=done,
        )
        return self._state(p.spec.epoch, remaining, progress)

    def _fold_progress(self) -> None:
        """Turn the progress of the last in-process iteration into the resume point."""
        p = self._progress
        if p is None:
            return
        self._resume = self._current_state()
        self._epoch = p.spec.epoch
        self._progress = None

    # -- where an iteration starts ----------------------------------------------------

    def _start(
        self, ranks: World, block: int, drop_last: bool
    ) -> tuple[int, Remaining, WorkerProgress | None]:
        """Where the next iteration starts (epoch, what remains, a pool worker's own
        progress), from the last iteration's progress or the loaded state; changes nothing."""
        p = self._progress
        if p is not None:
            resume, epoch, completed = self._current_state(), p.spec.epoch, p.complete
        else:
            resume, epoch, completed = self._resume, self._epoch, False
        remaining, resume_worker = Remaining(self.records), None
        if resume is not None and resume.epoch == epoch:
            remaining = self._resume_point(resume)
            resume_worker = resume.worker
        left = Partition(remaining, ranks.world_size, ranks.rank, block, drop_last).samples
        started = remaining.consumed > 0
        if (completed or (started and left == 0 and resume_worker is None)) and not self._explicit_epoch:
            return epoch + 1, Remaining(self.records), None
        return epoch, remaining, resume_worker

    def _begin(self, ranks: World, block: int, drop_last: bool, *, by_loader: bool) -> _Spec:
        """Resolve the start of the next iteration and consume the pending resume point."""
        epoch, remaining, resume_worker = self._start(ranks, block, drop_last)
        self._progress = None
        self._epoch = epoch
        self._resume = None
        self._explicit_epoch = False
        return _Spec(
            epoch, remaining, ranks.rank, ranks.world_size, block, drop_last, by_loader, resume_worker
        )

    def _resume_point(self, state: LoaderState) -> Remaining:
        """Where ``state`` resumes: what remains, or for a pool worker's own state what
        remained when its pool started (the worker then skips what it delivered)."""
        if state.worker is not None:
            return Remaining(self.records, state.worker.levels)
        return state.remaining

    def _default_block(self) -> tuple[int, bool]:
        if self.batch_size is not None:
            return self.batch_size, self.drop_last
        return self._block if self._block is not None else (1, False)

    def _detect_ranks(self) -> World:
        return self._ranks if self._ranks is not None else World.detect_ranks()

    def _next_spec(self) -> _Spec:
        worker = get_worker_info()
        if self._channel is not None and worker is not None:  # a persistent worker
            return _Spec.from_ints(self._channel[:], self.records)
        if self._loader_spec is not None:
            return self._loader_spec
        p = self._progress
        if p is not None and p.in_worker and not p.complete and (p.chunks or p.samples):
            _warn_read_ahead_lost(p.world.worker)
        block, drop_last = self._default_block()
        return self._begin(self._detect_ranks(), block, drop_last, by_loader=False)

    def __len__(self) -> int:
        """Items (batches in batch mode, else samples) this rank yields in a whole epoch.

        Also while an epoch that was stopped or loaded from a state goes on: the iteration
        then yields only what remains, and a trainer that restores its own count of the
        batches done (Lightning) ends the epoch when that count reaches this length, as
        with torchdata's ``StatefulDataLoader``. torch's ``DataLoader`` warns only when an
        iterator yields more than the length, which a whole epoch never is.
        """
        p = self._progress
        spec = p.spec if p is not None and p.open else self._loader_spec
        if spec is not None:
            world_size, rank, block, drop_last = spec.world_size, spec.rank, spec.block, spec.drop_last
        else:
            ranks = self._detect_ranks()
            world_size, rank = ranks.world_size, ranks.rank
            block, drop_last = self._default_block()
        part = Partition(Remaining(self.records), world_size, rank, block, drop_last)
        return part.num_chunks if self.batch_size is not None else part.samples

    # -- iteration --------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        in_worker = get_worker_info() is not None
        if in_worker:  # a DataLoader worker: whatever the source allocates
            self._worker_pool = True
            use_loader_memory_pool()
        spec = self._next_spec()
        world = World(rank=spec.rank, world_size=spec.world_size).with_worker_info()
        plan = self.plan(spec.epoch)
        part = Partition(spec.remaining, spec.world_size, spec.rank, spec.block, spec.drop_last)
        skip = _worker_skip(spec, world)
        chunks = part.worker_chunks(world.worker, world.num_workers, skip)
        progress = _Progress(spec, part, world, skipped=skip, in_worker=in_worker)
        if not spec.by_loader:
            self._progress = progress
        return self._generate(plan, part, chunks, progress, Lead.of(self._turns, world))

    def _decode(self, plan: EpochPlan, index: int) -> DecodedShard:
        shard_id = plan.shard_ids[index]
        columns = self._selection.read
        read_view = getattr(self.source, "read_shard_view", None) if self._views else None
        records = (read_view or self.source.read_shard)(shard_id, columns)
        if self._worker_pool and "pyarrow" in sys.modules:
            # a worker forked from a process without pyarrow loads it for its first cold
            # shard: its later shards are then decoded into the loader's pool
            self._worker_pool = False
            use_loader_memory_pool()
        drop = getattr(self.source, "drop_pages", None)
        drop_pages = functools.partial(drop, shard_id) if drop else None
        shard = None
        if isinstance(records, IpcFile):
            try:
                shard = DecodedShard(index, shard_id, records, drop_pages, columns)
            except UnsupportedIpc:  # a column type only pyarrow converts (structs, lists of strings, ...)
                records = self.source.read_shard(shard_id, columns)
        if shard is None:
            shard = DecodedShard(index, shard_id, select_columns(records, columns, shard_id), drop_pages)
        if shard.rows != plan.counts[index]:
            raise BadInputError(
                f"shard has {shard.rows} records, the version lists {plan.counts[index]}",
                subject=shard_id,
                hint="the source returned another shard than the version names",
            )
        shard.drop_pages()  # reading and checking it paged in more than the batches will use
        return shard

    def _generate(
        self, plan: EpochPlan, part: Partition, chunks: range, progress: _Progress, lead: Lead | None
    ) -> Iterator[Any]:
        try:
            yield from self._items(plan, part, chunks, progress, lead)
        finally:
            progress.open = False

    def _items(
        self, plan: EpochPlan, part: Partition, chunks: range, progress: _Progress, lead: Lead | None
    ) -> Iterator[Any]:
        if len(chunks) == 0:
            if lead is not None:
                lead.done()
            progress.complete = True
            return
        transform = self.transform
        batched = self.batch_size is not None
        selection = self._selection
        read_chunks = chunk_reader(self.source) if selection.reassemble else None
        order = needed_shards(plan, touched_windows(plan, part, chunks))
        announce = self.source.announce
        with ShardPrefetcher(
            functools.partial(self._decode, plan),
            order,
            depth=self.prefetch,
            threads=_READ_THREADS,
            announce=lambda idx: announce([plan.shard_ids[i] for i in idx]),
        ) as shards:
            if lead is not None:  # after announcing: a cache may fetch meanwhile
                lead.wait()
            for kinds, parts, n in batch_rows(plan, shards, _Spans(part, chunks)):
                if selection.active:
                    kinds, joined = selection.finish(kinds, join_pieces(kinds, parts), read_chunks)
                    parts = [joined]
                if batched:
                    item = batch_from_pieces(kinds, parts)
                    progress.chunks += 1
                    progress.samples += n
                    yield item if transform is None else transform(item)
                else:
                    samples = samples_from_pieces(kinds, parts)
                    last = len(samples) - 1
                    for i, sample in enumerate(samples):
                        progress.samples += 1
                        if i == last:
                            progress.chunks += 1
                        yield sample if transform is None else transform(sample)
                if lead is not None:  # the first batch is out
                    lead.done()
                    lead = None
        progress.complete = True

    def _give_back(self, items: int) -> None:
        """Count the last ``items`` items of the in-process iteration as not yielded (a
        wrapper read them ahead and never handed them on: see loaders.device)."""
        if self._progress is not None:
            self._progress.give_back(items, batches=self.batch_size is not None)

    def _state_dict_holding_back(self, items: int) -> dict[str, Any]:
        """The state as if the last ``items`` items yielded had not been yielded."""
        p = self._progress
        if p is None or items <= 0:
            return self.state_dict()
        held = dataclasses.replace(p)
        held.give_back(items, batches=self.batch_size is not None)
        return self._current_state(held).to_dict()

    def __repr__(self) -> str:
        return (
            f"StreamingDataset(version={self.version_id[:12]}, records={self.records}, "
            f"shards={len(self._shards)}, shuffle={self.shuffle}, seed={self.seed}, "
            f"batch_size={self.batch_size})"
        )


class _Spans(Sequence[Runs]):
    """The runs of positions of chunks ``chunks`` of ``part``, computed on demand."""

    def __init__(self, part: Partition, chunks: range) -> None:
        self._part = part
        self._chunks = chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return _Spans(self._part, self._chunks[i])
        return self._part.chunk(self._chunks[i])


def _views_hold(schema: Sequence[Field] | None, columns: Sequence[str] | None) -> bool:
    """Whether :mod:`loaders.ipcview` columns can hold ``columns`` of a version with
    ``schema`` (None: every visible column; an unknown schema or column: try, the read
    falls back to a table then): no column of a type only pyarrow converts."""
    if schema is None:
        return True
    wanted = set(columns) if columns is not None else {f.name for f in schema if not f.name.startswith("__")}
    return not any(kind_of(f.type).arrow for f in schema if f.name in wanted)


def _warn_read_ahead_lost(worker: int) -> None:
    """Warn that a persistent worker of a loader other than ours begins an iteration while
    its last one was left unfinished: only the training process knows which of the batches
    the worker read ahead were delivered, so the worker goes on after all of them."""
    warnings.warn(
        f"DataLoader worker {worker}: a new iteration began before the last one ended; a "
        "persistent worker cannot tell which of the batches it read ahead (prefetch_factor) "
        "were delivered, so it goes on after them and skips them. For an exact continuation "
        "use loaders.StreamingDataLoader, or call loader.load_state_dict(loader.state_dict()) "
        "before iterating again (torchdata's StatefulDataLoader)",
        RuntimeWarning,
        stacklevel=2,
    )


def _worker_skip(spec: _Spec, world: World) -> int:
    """Chunks a pool worker already delivered, when resuming from its own state."""
    r = spec.resume_worker
    if r is None:
        return 0
    same = (r.levels, r.world_size, r.rank, r.block, r.num_workers, r.worker) == (
        spec.remaining.levels,
        spec.world_size,
        spec.rank,
        spec.block,
        world.num_workers,
        world.worker,
    )
    if not same:
        raise UsageError(
            f"worker state of worker {r.worker}/{r.num_workers} (world {r.world_size}, block {r.block}) "
            f"does not fit worker {world.worker}/{world.num_workers} "
            f"(world {spec.world_size}, block {spec.block})",
            subject="loader state",
            hint="resume per-worker states with the same num_workers, world size and batch size, "
            "or use StreamingDataLoader, whose state fits any",
        )
    return r.chunks


def _check_int(name: str, value: Any, minimum: int | None, *, optional: bool = False) -> Any:
    """``value`` as an int of at least ``minimum``; TypeError for another type (a bool,
    a float, a string), BadInputError for one too small."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        expected = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {expected}, not {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise BadInputError(
            f"{name}={value}", subject=name, hint=f"use {minimum} or more" + (", or None" if optional else "")
        )
    return int(value)
