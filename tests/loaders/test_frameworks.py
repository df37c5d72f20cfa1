"""The loader unchanged under real frameworks: DDP (torch.distributed, gloo) and Lightning.

DDP runs two real processes joined by ``init_process_group("gloo")``: the dataset takes
its rank from ``torch.distributed`` (no RANK/WORLD_SIZE in the environment), each rank
uses two DataLoader workers, and what the ranks saw is gathered over the process group.
Lightning runs a real ``Trainer.fit`` on CPU for two epochs.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import lightning
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from loaders import StreamingDataLoader, StreamingDataset
from tests.loaders._shards import IpcShardSource

pytestmark = pytest.mark.filterwarnings(
    "ignore:This DataLoader will create",
    "ignore:.*does not have many workers",
    "ignore:Your `IterableDataset` has `__len__` defined",  # our workers split the epoch themselves
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank: int, world: int, port: int, folder: str, out: str) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)  # the rank must come from the process group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        source = IpcShardSource.from_folder(Path(folder))
        per_epoch = []
        for epoch in range(2):
            ds = StreamingDataset(source, shuffle=True, seed=5, batch_size=8)
            ds.set_epoch(epoch)
            ids = [i for b in StreamingDataLoader(ds, num_workers=2) for i in b["id"].tolist()]
            gathered: list[list[int] | None] = [None] * world
            dist.all_gather_object(gathered, ids)
            per_epoch.append(gathered)
        if rank == 0:
            torch.save(per_epoch, out)
    finally:
        dist.destroy_process_group()


def test_ddp_ranks_from_the_process_group_are_disjoint_equal_and_cover_the_epoch(
    shard_folder, total_records, tmp_path
):
    world = 2
    out = tmp_path / "ids.pt"
    mp.start_processes(
        _ddp_rank,
        args=(world, _free_port(), str(shard_folder), str(out)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    for ranks in torch.load(out):
        assert len(ranks[0]) == len(ranks[1]) > 0, "ranks got different counts"
        assert not set(ranks[0]) & set(ranks[1]), "a record went to both ranks"
        seen = set(ranks[0]) | set(ranks[1])
        assert len(seen) == len(ranks[0]) + len(ranks[1])
        assert total_records - len(seen) < world  # only the remainder that cannot split evenly
    first, second = (set(r[0]) for r in torch.load(out))
    assert first != second, "rank 0 saw the same records in both epochs: set_epoch had no effect"


class _Recorder(lightning.LightningModule):
    """Records the ids each training step sees, by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        x = batch["id"].float().unsqueeze(1)
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-6)


def _trainer(root: Path, **options) -> lightning.Trainer:
    return lightning.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **options,
    )


def test_lightning_trainer_fits_every_record_once_per_epoch(source, total_records, tmp_path):
    ds = StreamingDataset(source, shuffle=True, seed=1, batch_size=16)
    model = _Recorder()
    trainer = _trainer(tmp_path, max_epochs=2, enable_checkpointing=False)
    trainer.fit(model, train_dataloaders=StreamingDataLoader(ds, num_workers=2))
    assert sorted(model.seen) == [0, 1]
    for epoch, ids in model.seen.items():
        assert sorted(ids) == list(range(total_records)), f"epoch {epoch} missed or repeated records"
    assert model.seen[0] != model.seen[1], "Lightning's set_epoch did not reach the dataset"


def test_lightning_resumes_mid_epoch_with_every_record_once(source, total_records, tmp_path):
    """Lightning saves the loader's state with its own count of batches done and, resumed,
    ends the epoch when that count reaches ``len(loader)``: the whole epoch's length."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def loader() -> StreamingDataLoader:
        return StreamingDataLoader(
            StreamingDataset(source, shuffle=True, seed=1, batch_size=16), num_workers=2
        )

    first = _Recorder()
    every_4 = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}")
    _trainer(tmp_path, max_steps=4, callbacks=[every_4]).fit(first, train_dataloaders=loader())
    assert len(first.seen[0]) == 4 * 16
    resumed = _Recorder()
    _trainer(tmp_path, max_epochs=2, enable_checkpointing=False).fit(
        resumed, train_dataloaders=loader(), ckpt_path=tmp_path / "step=4.ckpt"
    )
    assert sorted(first.seen[0] + resumed.seen[0]) == list(range(total_records)), "epoch 0 lost records"
    assert sorted(resumed.seen[1]) == list(range(total_records)), "epoch 1 is not a whole epoch"
