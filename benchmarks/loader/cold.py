"""The loaders under test, read cold from an S3 server (the ``s3`` mode of ``bench_loader``).

Every loader reads the same records from the same server, in its own format, uploaded
once per benchmark run: ``limit`` the Arrow shard files (plain GET + decode, no prefetch),
``tierdata-repo`` a repository made with ``datastore.Repo`` at ``s3://<bucket>/repo`` read
through a fresh tiered cache, ``litdata`` its optimized chunks (input dir ``s3://...``),
``mds`` its compressed shards (``remote=s3://...``) and ``wds`` its tar shards through
presigned HTTP URLs (WebDataset's ``curl`` pipe). Each run starts with empty local folders
(``ColdConfig.local``), whose bytes on disk are part of the result.

Credentials and endpoint come from the environment (``AWS_ENDPOINT_URL``,
``S3_ENDPOINT_URL`` for MDS, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), set by the
benchmark for its children.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from benchmarks.loader.candidates import (
    CANDIDATES,
    RunConfig,
    _as_is,
    import_streaming,
    webdataset_loader,
    write_parquet,
)
from benchmarks.loader.data import TOKENS

__all__ = ["COLD", "ColdCandidate", "ColdConfig", "minio_client"]


@dataclass(frozen=True)
class ColdConfig:
    """One cold run: the records (as shard files), the bucket, empty local folders, the settings."""

    paths: tuple[str, ...]
    work: str
    bucket: str
    local: str  # empty before the run: the loader's caches go here
    ram_dir: str  # ours: the RAM tier's folder (tmpfs), also empty before the run
    num_workers: int = 2
    batch_size: int = 64
    shuffle: bool = False
    seed: int = 0
    ssd_bytes: int = 1 << 30  # ours: the SSD tier's budget

    def warm(self) -> RunConfig:
        """The warm benchmark's config for the same records (to reuse the peers' converters)."""
        return RunConfig(
            paths=self.paths,
            work=self.work,
            num_workers=self.num_workers,
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            seed=self.seed,
        )


def minio_client() -> Any:
    """A plain minio client for the server in ``AWS_ENDPOINT_URL`` (uploads, the limit, presigning)."""
    import minio

    url = urlparse(os.environ["AWS_ENDPOINT_URL"])
    return minio.Minio(
        url.netloc,
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        secure=url.scheme == "https",
        region=os.environ.get("AWS_REGION", "us-east-1"),
    )


def _upload_folder(bucket: str, prefix: str, folder: Path, names: list[str]) -> None:
    client = minio_client()
    for name in names:
        client.fput_object(bucket, f"{prefix}/{name}", str(folder / name))


def _keys(bucket: str, prefix: str) -> list[str]:
    return sorted(
        o.object_name for o in minio_client().list_objects(bucket, prefix=f"{prefix}/", recursive=True)
    )


class ColdCandidate:
    """A loader read from S3: ``upload`` puts its data there once; ``make`` builds a cold loader."""

    name = "?"
    requires: tuple[str, ...] = ()

    def available(self) -> bool:
        return all(CANDIDATES[n].available() for n in self.requires)

    def preload(self) -> None:
        """Import what ``make`` needs before the clock starts."""
        for n in self.requires:
            CANDIDATES[n].preload()

    def upload(self, cfg: ColdConfig) -> None:
        raise NotImplementedError

    def make(self, cfg: ColdConfig) -> Any:
        raise NotImplementedError

    def local_dirs(self, cfg: ColdConfig) -> dict[str, Path]:
        """The folders this loader writes locally (all under ``cfg.local`` but our RAM tier)."""
        return {}

    def report(self, cfg: ColdConfig) -> dict[str, Any]:
        """Loader-specific figures read after a run (its local folders are still there)."""
        return {}


class ColdLimit(ColdCandidate):
    """Plain GET of whole Arrow shards + decode + numpy column-wise batches (no prefetch, no cache)."""

    name = "limit"
    requires = ("limit",)

    def upload(self, cfg: ColdConfig) -> None:
        folder = Path(cfg.paths[0]).parent
        _upload_folder(cfg.bucket, "limit", folder, [Path(p).name for p in cfg.paths])

    def make(self, cfg: ColdConfig) -> Any:
        ds = _S3Shards(cfg, _keys(cfg.bucket, "limit"))
        return DataLoader(ds, batch_size=None, num_workers=cfg.num_workers, collate_fn=_as_is)


class _S3Shards(IterableDataset):
    def __init__(self, cfg: ColdConfig, keys: list[str]) -> None:
        super().__init__()
        self.cfg, self.keys = cfg, keys

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import pyarrow as pa  # here: the peers' processes import this module

        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        client = minio_client()
        bs = self.cfg.batch_size
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # from_numpy on read-only Arrow memory
            for key in self.keys[wid::nw]:
                resp = client.get_object(self.cfg.bucket, key)
                try:
                    data = resp.read()
                finally:
                    resp.close()
                    resp.release_conn()
                table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
                ids = table["id"].to_numpy()
                tokens = table["tokens"].combine_chunks().flatten().to_numpy().reshape(-1, TOKENS)
                text = table["text"].combine_chunks()
                for i in range(0, len(ids), bs):
                    yield {
                        "id": torch.from_numpy(ids[i : i + bs]),
                        "tokens": torch.from_numpy(tokens[i : i + bs]),
                        "text": text.slice(i, bs).to_pylist(),
                    }


class ColdTierdata(ColdCandidate):
    """Ours: a repository on S3 through a fresh tiered cache (SSD tier on disk, RAM tier on tmpfs)."""

    name = "tierdata-repo"
    requires = ("tierdata-repo",)

    def preload(self) -> None:
        """Also pyarrow, which a cold read loads to decode its shard table and shards (a
        warm one does not; before, importing the loader loaded it)."""
        super().preload()
        import pyarrow.ipc
        import pyarrow.parquet  # noqa: F401

    def upload(self, cfg: ColdConfig) -> None:
        from datastore import Repo

        parquet = Path(cfg.local) / "upload.parquet"
        parquet.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(cfg.paths, parquet)
        repo = Repo.init(f"s3://{cfg.bucket}/repo", workspace=None)
        repo.ingest(parquet, format="parquet")
        repo.commit("loader benchmark data")
        parquet.unlink()

    def make(self, cfg: ColdConfig) -> Any:
        from loaders import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(
            f"s3://{cfg.bucket}/repo",
            "main",
            cache=self._cache(cfg),
            shuffle=cfg.shuffle,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
        )
        return StreamingDataLoader(ds, num_workers=cfg.num_workers)

    def _cache(self, cfg: ColdConfig) -> Any:
        from cachetier.config import CacheConfig

        return CacheConfig(dir=Path(cfg.local) / "cache", ram_dir=Path(cfg.ram_dir), ssd_bytes=cfg.ssd_bytes)

    def local_dirs(self, cfg: ColdConfig) -> dict[str, Path]:
        return {"ssd tier": Path(cfg.local) / "cache", "ram tier (tmpfs)": Path(cfg.ram_dir)}

    def report(self, cfg: ColdConfig) -> dict[str, Any]:
        """The cache's node-wide counters: object-store fetches against the version's shards."""
        from cachetier.tiered import TieredStore
        from datastore import Repo

        repo = Repo.open(f"s3://{cfg.bucket}/repo")
        table = repo.shard_table(repo.resolve("main"))
        with TieredStore(repo.objects, self._cache(cfg)) as cache:
            stats = cache.stats()
        return {
            "shards": len(table),
            "stored_bytes": int(table.bytes_total),
            "uncompressed_bytes": int(table.uncompressed_bytes_total),
            "store_fetches": stats["tiers"]["store"]["fetches"],
            "store_bytes_fetched": stats["tiers"]["store"]["bytes_fetched"],
            "ssd_budget": cfg.ssd_bytes,
            "ssd_bytes_used": stats["tiers"]["ssd"]["bytes_used"],
        }


class ColdLitData(ColdCandidate):
    """LitData: its optimized chunks on S3, its own StreamingDataLoader, its default cache settings."""

    name = "litdata"
    requires = ("litdata",)

    def upload(self, cfg: ColdConfig) -> None:
        CANDIDATES["litdata"].prepare(cfg.warm())
        folder = CANDIDATES["litdata"].data_dir(cfg.warm())
        names = [p.name for p in sorted(folder.iterdir()) if p.is_file()]
        _upload_folder(cfg.bucket, "litdata", folder, names)

    def make(self, cfg: ColdConfig) -> Any:
        import litdata
        from litdata.streaming import downloader

        if os.environ["AWS_ENDPOINT_URL"].startswith("http://"):
            # LitData fetches chunks with obstore, built with fixed client options that do
            # not allow plain http (real S3 is https): without this every GET fails here.
            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        ds = litdata.StreamingDataset(
            f"s3://{cfg.bucket}/litdata",
            cache_dir=str(Path(cfg.local) / "litdata"),
            shuffle=cfg.shuffle,
            seed=cfg.seed,
        )
        return litdata.StreamingDataLoader(ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers)

    def local_dirs(self, cfg: ColdConfig) -> dict[str, Path]:
        return {"cache_dir": Path(cfg.local) / "litdata"}


class ColdMDS(ColdCandidate):
    """MosaicML Streaming: its zstd shards on S3 (``remote``), an empty ``local``, its defaults."""

    name = "mds"
    requires = ("mds",)

    def upload(self, cfg: ColdConfig) -> None:
        CANDIDATES["mds"].prepare(cfg.warm())
        folder = CANDIDATES["mds"].data_dir(cfg.warm())
        # Only what MDSWriter wrote: the index and the compressed shards (a warm run leaves
        # decompressed ``.mds`` copies beside them).
        names = ["index.json", *sorted(p.name for p in folder.glob("*.mds.zstd"))]
        _upload_folder(cfg.bucket, "mds", folder, names)

    def make(self, cfg: ColdConfig) -> Any:
        streaming = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = streaming.StreamingDataset(
            remote=f"s3://{cfg.bucket}/mds",
            local=str(Path(cfg.local) / "mds"),
            shuffle=cfg.shuffle,
            shuffle_seed=cfg.seed,
            batch_size=cfg.batch_size,
        )
        return streaming.StreamingDataLoader(ds, batch_size=cfg.batch_size, num_workers=cfg.num_workers)

    def local_dirs(self, cfg: ColdConfig) -> dict[str, Path]:
        return {"local": Path(cfg.local) / "mds"}


class ColdWebDataset(ColdCandidate):
    """WebDataset: its tar shards streamed through ``curl`` from presigned HTTP URLs (no cache)."""

    name = "wds"
    requires = ("wds",)

    def upload(self, cfg: ColdConfig) -> None:
        CANDIDATES["wds"].prepare(cfg.warm())
        folder = CANDIDATES["wds"].data_dir(cfg.warm())
        _upload_folder(cfg.bucket, "wds", folder, sorted(p.name for p in folder.glob("shard-*.tar")))

    def make(self, cfg: ColdConfig) -> Any:
        client = minio_client()
        urls = [
            client.presigned_get_object(cfg.bucket, key, expires=timedelta(hours=2))
            for key in _keys(cfg.bucket, "wds")
        ]
        return webdataset_loader(urls, cfg)


COLD: dict[str, ColdCandidate] = {
    c.name: c for c in (ColdLimit(), ColdTierdata(), ColdLitData(), ColdMDS(), ColdWebDataset())
}
