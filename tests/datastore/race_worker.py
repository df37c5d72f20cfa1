"""A process that commits to a shared branch when a barrier opens (for the race tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def commit_after_barrier(
    project: str, source: str, message: str, barrier: Any, results: Any, env: dict
) -> None:
    """Ingest ``source`` in workspace ``project``, wait at ``barrier``, commit; report the outcome."""
    import os

    os.environ.update(env)
    from cachetier.errors import TierdataError
    from datastore.repo import Repo

    repo = Repo.open(workspace=project)
    repo.ingest(source)
    barrier.wait()
    try:
        info = repo.commit(message)
        results.put(json.dumps({"ok": True, "version": info.version, "source": source}))
    except TierdataError as e:
        results.put(json.dumps({"ok": False, "error": str(e), "source": source}))


def write_rows(path: Path, tag: str, n: int) -> None:
    """Write ``n`` distinct JSON lines tagged ``tag``."""
    path.write_text("".join(json.dumps({"who": tag, "i": i}) + "\n" for i in range(n)))
