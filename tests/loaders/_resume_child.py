"""Child process for the fresh-process resume test: load each state, read to the end of the epoch.

Usage: python -m tests.loaders._resume_child '<json spec>'; prints one JSON line: the ids
delivered after each job's state.
"""

from __future__ import annotations

import json
import sys
import warnings

from loaders import StreamingDataLoader, StreamingDataset
from tests.loaders._shards import IpcShardSource


def main() -> None:
    spec = json.loads(sys.argv[1])
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    results = []
    for job in spec["jobs"]:
        source = IpcShardSource.from_folder(spec["folder"], record_bytes=spec.get("record_bytes"))
        ds = StreamingDataset(source, shuffle=True, seed=spec["seed"], batch_size=spec["batch_size"])
        loader = StreamingDataLoader(ds, num_workers=job["num_workers"])
        loader.load_state_dict(job["state"])
        ds.set_epoch(job["state"]["epoch"])
        results.append([i for batch in loader for i in batch["id"].tolist()])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
