"""The content hash in a forked child: blake3's thread pool does not survive a fork."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The parent hashes a big buffer (blake3 starts its native thread pool), then forks; the
# child hashes a big buffer too. The child must finish with the right digest; the parent
# kills it after a deadline, so a hang is a failure, not a stuck test.
_FORK_AFTER_THREADS = textwrap.dedent("""
    import os, sys, time
    import blake3
    from cachetier.hashing import content_hash
    data = os.urandom(16 << 20)
    expected = blake3.blake3(data).hexdigest()
    assert content_hash(data) == expected
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, content_hash(data).encode())
        os._exit(0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("hung")
        sys.exit(1)
    print("ok" if os.read(read, 64).decode() == expected else "wrong digest")
    print("parent hashes as before:", content_hash(data) == expected)
""")


def test_a_child_forked_after_threaded_hashing_hashes_without_hanging() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FORK_AFTER_THREADS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split("\n")[:2] == ["ok", "parent hashes as before: True"], result.stdout
