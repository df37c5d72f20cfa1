"""The loaders under test, behind one small interface.

Each candidate builds a loader yielding batches of ``batch_size`` dicts (or tuples) with
an ``id`` entry, reports a resume state, and resumes from one. ``limit`` is the
reference: plain file read, Arrow IPC decode (zstd), numpy column-wise batches, shards
split over workers, nothing else. ``tierdata`` is ours. ``litdata``, ``mds`` and ``wds``
are the peers, used when importable (see ``benchmarks/loader/README.md``); each converts
the same records into its own format once, under the work folder.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from benchmarks.loader.data import TOKENS

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["CANDIDATES", "Candidate", "RunConfig", "batch_len", "import_streaming", "write_parquet"]


@dataclass(frozen=True)
class RunConfig:
    """What every candidate gets: the shard files, a work folder and the DataLoader settings."""

    paths: tuple[str, ...]
    work: str
    num_workers: int
    shuffle: bool
    batch_size: int = 64
    seed: int = 0
    shuffle_window: int = 2  # tierdata only: shards mixed by its shuffle


def batch_len(batch: Any) -> int:
    """Samples in a batch (dict with an ``id`` entry, or tuple whose first item is the ids)."""
    ids = batch["id"] if isinstance(batch, dict) else batch[0]
    return len(ids)


def _read_table(path: str) -> pa.Table:
    import pyarrow as pa  # only where a candidate reads Arrow: a peer's process must not pay for it

    with open(path, "rb") as f:
        data = f.read()
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


def _records(paths: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Every record as Python/numpy values (for converting into the peers' formats)."""
    for path in paths:
        table = _read_table(path)
        ids = table["id"].to_numpy()
        tokens = table["tokens"].combine_chunks().flatten().to_numpy().reshape(-1, TOKENS)
        texts = table["text"].to_pylist()
        for i in range(len(ids)):
            yield {"id": int(ids[i]), "tokens": tokens[i].copy(), "text": texts[i]}


def write_parquet(paths: Iterable[str], out: Path) -> None:
    """The records of the shard files as one Parquet file (what a repository ingests)."""
    import pyarrow.parquet as pq

    paths = list(paths)
    with pq.ParquetWriter(str(out), _read_table(paths[0]).drop(["__record_hash"]).schema) as writer:
        for path in paths:
            writer.write_table(_read_table(path).drop(["__record_hash"]))


class Candidate:
    """A loader under test. ``make`` builds it; ``state``/``resume`` save and restore a position."""

    name = "?"
    requires: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()  # imported before the clock starts (LitData's import takes ~4 s)

    def available(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def preload(self) -> None:
        """Import what ``make`` needs, so import time counts in no measurement."""
        for module in self.imports or self.requires:
            importlib.import_module(module)

    def prepare(self, cfg: RunConfig) -> None:
        """Convert the data into this candidate's format (once; cached in the work folder)."""

    def make(self, cfg: RunConfig) -> Any:
        raise NotImplementedError

    def state(self, loader: Any, delivered: int) -> Any:
        """A JSON-able position after ``delivered`` samples."""
        return loader.state_dict()

    def resume(self, loader: Any, state: Any) -> Iterator[Any]:
        """An iterator over the rest of the epoch from ``state``."""
        loader.load_state_dict(state)
        return iter(loader)


class Limit(Candidate):
    """Plain read + zstd decode + numpy column-wise batches: the floor of CPU per sample."""

    name = "limit"
    imports = ("pyarrow",)

    def make(self, cfg: RunConfig) -> Any:
        return DataLoader(_PlainShards(cfg), batch_size=None, num_workers=cfg.num_workers, collate_fn=_as_is)

    def state(self, loader: Any, delivered: int) -> Any:
        return {"skip": delivered}

    def resume(self, loader: Any, state: Any) -> Iterator[Any]:
        return _skip_batches(iter(loader), state["skip"])


def _as_is(batch: Any) -> Any:
    """No per-element conversion: the batches are tensors and lists already (the floor)."""
    return batch


def _skip_batches(it: Iterator[Any], samples: int) -> Iterator[Any]:
    """Replay: read and drop ``samples`` samples (what a loader without resume must do)."""
    skipped = 0
    for batch in it:
        if skipped >= samples:
            yield batch
        else:
            skipped += batch_len(batch)


class _PlainShards(IterableDataset):
    """An IterableDataset reading whole shards and slicing numpy arrays (the limit)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow as pa

        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        rng = np.random.default_rng(self.cfg.seed)
        paths = list(self.cfg.paths)
        if self.cfg.shuffle:
            rng.shuffle(paths)
        bs = self.cfg.batch_size
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # from_numpy on read-only Arrow memory
            for path in paths[wid::nw]:
                table = _read_table(path)
                ids = table["id"].to_numpy()
                tokens = table["tokens"].combine_chunks().flatten().to_numpy().reshape(-1, TOKENS)
                text = table["text"].combine_chunks()
                n = len(ids)
                if not self.cfg.shuffle:
                    for i in range(0, n, bs):
                        yield {
                            "id": torch.from_numpy(ids[i : i + bs]),
                            "tokens": torch.from_numpy(tokens[i : i + bs]),
                            "text": text.slice(i, bs).to_pylist(),
                        }
                    continue
                order = rng.permutation(n)
                for i in range(0, n, bs):
                    idx = order[i : i + bs]
                    yield {
                        "id": torch.from_numpy(ids[idx]),
                        "tokens": torch.from_numpy(tokens[idx]),
                        "text": text.take(pa.array(idx)).to_pylist(),
                    }


class Tierdata(Candidate):
    """Ours: StreamingDataset in batch mode through StreamingDataLoader."""

    name = "tierdata"
    imports = ("loaders.dataset", "loaders.dataloader", "loaders.filesource")  # the packages import lazily

    def make(self, cfg: RunConfig) -> Any:
        from loaders import ArrowFileSource, StreamingDataLoader, StreamingDataset

        source = ArrowFileSource(list(cfg.paths))
        ds = StreamingDataset(
            source,
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            shuffle_window=cfg.shuffle_window,
        )
        return StreamingDataLoader(ds, num_workers=cfg.num_workers)


class TierdataRepo(Candidate):
    """Ours through the real stack: a local repository read via the tiered cache, warmed once.

    ``prepare`` ingests the records (as Parquet) into ``<work>/repo`` and reads one epoch
    so the cache holds every shard: the RAM tier keeps them decoded, in its default
    place (a folder under /dev/shm named after the cache folder; about 300 MB here), as
    a user's would be. On a disk folder instead, the kernel maps a whole large folio of
    the page cache at each fault, so the pages a reader holds would say more about the
    file system than about the loader.
    """

    name = "tierdata-repo"
    requires = ("datastore",)
    # the modules themselves: the packages import their names on first use
    imports = ("loaders.dataset", "loaders.dataloader", "datastore.source", "cachetier.config")

    def _root(self, cfg: RunConfig) -> Path:
        return Path(cfg.work) / f"repo-{len(cfg.paths)}-{_fingerprint(cfg)}"

    def _cache(self, cfg: RunConfig) -> Any:
        from cachetier.config import CacheConfig

        root = self._root(cfg)
        return CacheConfig(dir=root / "cache", ram_bytes=2 << 30, ssd_bytes=4 << 30)

    def prepare(self, cfg: RunConfig) -> None:
        from datastore import Repo

        root = self._root(cfg)
        if not (root / "ready").exists():
            root.mkdir(parents=True, exist_ok=True)
            parquet = root / "data.parquet"
            write_parquet(cfg.paths, parquet)
            repo = Repo.init(root / "repo", workspace=None)
            repo.ingest(parquet, format="parquet")
            repo.commit("loader benchmark data")
            parquet.unlink()
            (root / "ready").write_text("1")
        # one epoch, every time: what the cache derives from a version (decoded shards, the
        # shard index) is in it before any measured run, whichever code made the cache
        for _ in self.make(RunConfig(**{**cfg.__dict__, "num_workers": 0})):
            pass

    def make(self, cfg: RunConfig) -> Any:
        from loaders import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(
            str(self._root(cfg) / "repo"),
            "main",
            cache=self._cache(cfg),
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            shuffle_window=cfg.shuffle_window,
        )
        return StreamingDataLoader(ds, num_workers=cfg.num_workers)


class LitData(Candidate):
    name = "litdata"
    requires = ("litdata",)

    def data_dir(self, cfg: RunConfig) -> Path:
        """Where this peer's copy of the records lives (converted once)."""
        return Path(cfg.work) / f"litdata-{len(cfg.paths)}-{_fingerprint(cfg)}"

    def prepare(self, cfg: RunConfig) -> None:
        import litdata

        out = self.data_dir(cfg)
        if (out / "index.json").exists():
            return
        litdata.optimize(
            fn=_litdata_records,
            inputs=list(cfg.paths),
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=1,
            compression="zstd",
        )

    def make(self, cfg: RunConfig) -> Any:
        import litdata

        ds = litdata.StreamingDataset(str(self.data_dir(cfg)), shuffle=cfg.shuffle, seed=cfg.seed)
        return litdata.StreamingDataLoader(ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers)


def _litdata_records(path: str) -> Iterator[dict[str, Any]]:
    yield from _records([path])


def import_streaming() -> Any:
    """Import MosaicML Streaming without ``streaming.vision`` when torchvision cannot load.

    ``streaming/__init__`` imports its image datasets, which need torchvision; PyPI's
    torchvision is a CUDA build that cannot load against the CPU torch (see
    ``benchmarks/setup_bench_env.sh``). MDS itself (``streaming.base``) never uses it.
    """
    import sys
    import types

    if importlib.util.find_spec("torchvision") is None:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


class MosaicMDS(Candidate):
    name = "mds"
    requires = ("streaming",)

    def available(self) -> bool:
        if not super().available():
            return False
        try:
            import_streaming()
        except Exception as e:  # a peer that cannot import is skipped, with the reason
            warnings.warn(f"mds: import streaming failed: {e!r}", stacklevel=1)
            return False
        return True

    def preload(self) -> None:
        import_streaming()

    def data_dir(self, cfg: RunConfig) -> Path:
        """Where this peer's copy of the records lives (converted once)."""
        return Path(cfg.work) / f"mds2-{len(cfg.paths)}-{_fingerprint(cfg)}"

    def prepare(self, cfg: RunConfig) -> None:
        MDSWriter = import_streaming().MDSWriter

        out = self.data_dir(cfg)
        if (out / "index.json").exists():
            return
        # A static dtype and shape: MDS's cheapest ndarray encoding (no per-sample header).
        columns = {"id": "int64", "tokens": f"ndarray:int32:{TOKENS}", "text": "str"}
        with MDSWriter(out=str(out), columns=columns, compression="zstd", size_limit="32mb") as writer:
            for record in _records(cfg.paths):
                writer.write(record)

    def make(self, cfg: RunConfig) -> Any:
        streaming = import_streaming()
        StreamingDataLoader, StreamingDataset = streaming.StreamingDataLoader, streaming.StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(
            local=str(self.data_dir(cfg)),
            shuffle=cfg.shuffle,
            shuffle_seed=cfg.seed,
            batch_size=cfg.batch_size,
        )
        return StreamingDataLoader(ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers)


class WebDataset(Candidate):
    name = "wds"
    requires = ("webdataset",)

    def data_dir(self, cfg: RunConfig) -> Path:
        """Where this peer's copy of the records lives (converted once)."""
        return Path(cfg.work) / f"wds-{len(cfg.paths)}-{_fingerprint(cfg)}"

    def prepare(self, cfg: RunConfig) -> None:
        import webdataset as wds

        out = self.data_dir(cfg)
        if (out / "done").exists():
            return
        out.mkdir(parents=True, exist_ok=True)
        import pyarrow as pa

        per = -(-sum(pa.ipc.open_file(p).count_rows() for p in cfg.paths) // len(cfg.paths))
        with wds.ShardWriter(str(out / "shard-%05d.tar"), maxcount=per) as sink:
            for r in _records(cfg.paths):
                sink.write(
                    {
                        "__key__": f"{r['id']:09d}",
                        "id.cls": r["id"],
                        "tokens.npy": r["tokens"],
                        "txt": r["text"],
                    }
                )
        (out / "done").write_text("1")

    def make(self, cfg: RunConfig) -> Any:

        return webdataset_loader([str(p) for p in sorted(self.data_dir(cfg).glob("shard-*.tar"))], cfg)

    def state(self, loader: Any, delivered: int) -> Any:
        return {"skip": delivered}

    def resume(self, loader: Any, state: Any) -> Iterator[Any]:
        return _skip_batches(iter(loader), state["skip"])


def _fingerprint(cfg: RunConfig) -> str:
    import hashlib

    return hashlib.blake2b(json.dumps(list(cfg.paths)).encode(), digest_size=4).hexdigest()


CANDIDATES: dict[str, Candidate] = {
    c.name: c for c in (Limit(), Tierdata(), TierdataRepo(), LitData(), MosaicMDS(), WebDataset())
}


def webdataset_loader(urls: list[str], cfg: RunConfig) -> Any:
    """The WebDataset pipeline both benchmarks use: shard shuffle, a 1000-sample buffer, batches."""
    import webdataset as wds

    ds = wds.WebDataset(
        urls,
        shardshuffle=len(urls) if cfg.shuffle else False,
        seed=cfg.seed,
        workersplitter=wds.split_by_worker,
        empty_check=False,
    )
    if cfg.shuffle:
        ds = ds.shuffle(1000)
    ds = ds.decode().to_tuple("id.cls", "tokens.npy", "txt").batched(cfg.batch_size)
    return wds.WebLoader(ds, batch_size=None, num_workers=cfg.num_workers)
