"""Train a tiny model on a streamed dataset; checkpoint mid-epoch; after a crash, resume exactly.

    python examples/train_tiny.py --data /tmp/tiny --make-data           # write a small dataset
    python examples/train_tiny.py --data /tmp/tiny --run /tmp/run --crash-after 7
                                  # trains, checkpoints every 3 steps, is killed (SIGKILL) at step 7
    python examples/train_tiny.py --data /tmp/tiny --run /tmp/run     # resumes from the checkpoint

Every sample a step trained on is appended to ``<run>/seen.txt`` as ``epoch id``; a
checkpoint records how long that log was, and a resume cuts the log back to it, so the
log lists exactly what the checkpointed model has seen: each sample once per epoch.

The data here is a folder of Arrow IPC files read through ``ArrowFileSource``; with a
repository, pass its URL (and a ref) to ``StreamingDataset`` instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from loaders import ArrowFileSource, DevicePrefetcher, StreamingDataLoader, StreamingDataset


def make_data(folder: Path, shards: int = 6, per_shard: int = 50, features: int = 8) -> None:
    """Write ``shards`` zstd Arrow IPC files of {id, x: float32[features], y: label}."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in range(shards):
        ids = np.arange(s * per_shard, (s + 1) * per_shard, dtype=np.int64)
        x = rng.standard_normal((per_shard, features)).astype(np.float32)
        table = pa.table(
            {
                "id": ids,
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), features),
                "y": (x.sum(axis=1) > 0).astype(np.int64),
            }
        )
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with (
            pa.OSFile(str(folder / f"part-{s:03d}.arrow"), "wb") as sink,
            pa.ipc.new_file(sink, table.schema, options=options) as writer,
        ):
            writer.write_table(table)


def _record_worker_pid(pid_file: str | None):
    def init(_worker_id: int) -> None:
        if pid_file:
            with open(pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")

    return init


def linked_shared_memory() -> list[str]:
    """Names in /dev/shm that this process or its workers map or hold open and that are
    still linked: what a crash right now would leave behind (Linux only)."""
    import psutil

    names = set()
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            paths = [m.path for m in proc.memory_maps(grouped=False)] + [f.path for f in proc.open_files()]
        except (psutil.Error, OSError):
            continue
        names.update(p for p in paths if p.startswith("/dev/shm/") and os.path.exists(p))
    return sorted(names)


def save_checkpoint(path: Path, state: dict) -> None:
    """Write the checkpoint atomically: a crash leaves the old one or the new one."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> dict:
    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    ckpt_path, log_path = run / "checkpoint.pt", run / "seen.txt"

    dataset = StreamingDataset(
        ArrowFileSource.from_dir(args.data),
        columns=["id", "x", "y"],
        shuffle=True,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    loader = StreamingDataLoader(
        dataset,
        num_workers=args.num_workers,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=_record_worker_pid(args.pid_file),
    )
    batches = DevicePrefetcher(loader)  # a pass-through without a GPU
    device = batches.device
    torch.manual_seed(args.seed)
    model = nn.Linear(8, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    start_epoch, step = 0, 0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        batches.load_state_dict(ckpt["loader"])
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        with open(log_path, "r+b") as f:
            f.truncate(ckpt["log_bytes"])
    with open(log_path, "a") as log:
        loss = torch.tensor(0.0)
        for epoch in range(start_epoch, args.epochs):
            dataset.set_epoch(epoch)  # keeps a loaded position in this epoch
            for batch in batches:
                loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                log.write("".join(f"{epoch} {i}\n" for i in batch["id"].tolist()))
                step += 1
                if step % args.checkpoint_every == 0:
                    log.flush()
                    os.fsync(log.fileno())
                    save_checkpoint(
                        ckpt_path,
                        {
                            "model": model.state_dict(),
                            "opt": opt.state_dict(),
                            "loader": batches.state_dict(),
                            "epoch": epoch,
                            "step": step,
                            "log_bytes": log.tell(),
                        },
                    )
                if step == args.crash_after:
                    log.flush()
                    if args.shm_report:
                        Path(args.shm_report).write_text(json.dumps(linked_shared_memory()))
                    os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: nothing gets cleaned up
    return {"steps": step, "epochs": args.epochs, "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="folder of Arrow IPC shard files")
    parser.add_argument("--make-data", action="store_true", help="write a small dataset into --data and exit")
    parser.add_argument("--run", help="folder for the checkpoint and the log of seen samples")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=3, help="steps between checkpoints")
    parser.add_argument("--crash-after", type=int, default=0, help="SIGKILL this process after this step")
    parser.add_argument("--pid-file", help="append the pid of every DataLoader worker here")
    parser.add_argument("--shm-report", help="before crashing, list the /dev/shm names in use here (JSON)")
    args = parser.parse_args()
    if args.make_data:
        make_data(Path(args.data))
        return
    if not args.run:
        parser.error("--run is required to train")
    print(json.dumps(train(args)))


if __name__ == "__main__":
    main()
