"""A second lane of work in a forked child process, for work whose Python holds the GIL.

One process of ingest or checkout uses about 1.3 of 2 cores; a child forked to do half
of the work uses the rest. The child inherits everything imported and opened (no start-up
cost), talks to the parent over a pipe (progress, intermediate values, its result or its
error), dies with the parent (``PR_SET_PDEATHSIG``), and exits without running the
parent's clean-ups. The parent kills and reaps it whenever it fails, so the child never
outlives the operation.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Any

from cachetier.errors import TierdataError

__all__ = ["Lane", "Send", "can_fork"]

log = logging.getLogger(__name__)

Send = Callable[[str, Any], None]
_PR_SET_PDEATHSIG = 1


def can_fork() -> bool:
    """True when a second process would run on its own core and may be forked here.

    Forking needs a process without other threads (a lock one of them holds would stay
    locked in the child) and at least two usable cores.
    """
    if not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        log.debug("no second process: other threads run (%s)", [t.name for t in threading.enumerate()])
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores >= 2


class Lane:
    """A forked child running ``work(send)``; its return value is its ``"done"`` message.

    ``send(kind, value)`` (safe in the child's threads) passes a message to the parent;
    ``"progress"`` messages go to ``progress`` as they are handled, the others wait for
    :meth:`wait_for`. An error in the child is raised in the parent by :meth:`poll` or
    :meth:`wait_for`; a child that dies is a RuntimeError there, not a hang.
    """

    def __init__(self, work: Callable[[Send], Any], progress: Callable[[int], None] | None = None):
        ours, theirs = Pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            ours.close()
            _die_with(parent)
            _child_main(theirs, work)
        theirs.close()
        self.pid, self.conn, self.progress = pid, ours, progress
        self._got: dict[str, Any] = {}
        self._reaped = False

    def poll(self) -> None:
        """Handle the messages that have arrived; raise the child's error."""
        while "done" not in self._got and self.conn.poll():
            self._handle()

    def wait_for(self, kind: str) -> Any:
        """Wait for the child's ``kind`` message (handling the others); return its value.

        ``"done"`` is the last message: after it the pipe is at its end, and is not read.
        """
        while kind not in self._got:
            if "done" in self._got:
                raise RuntimeError(f"the second worker process finished without sending {kind!r}")
            self._handle()
        return self._got[kind] if kind == "done" else self._got.pop(kind)

    def _handle(self) -> None:
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError) as e:
            raise RuntimeError(f"the second worker process died ({self._end()})") from e
        if kind == "progress":
            if self.progress is not None:
                self.progress(value)
        elif kind == "error":
            raise value
        else:
            self._got[kind] = value

    def kill(self) -> None:
        """Kill the child now (after a failure on this side)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        """Close the pipe and wait for the child to exit (call once it is done or killed)."""
        self.conn.close()
        if not self._reaped:
            os.waitpid(self.pid, 0)
            self._reaped = True

    def _end(self) -> str:
        """How the child ended (it has closed its end of the pipe)."""
        _, status = os.waitpid(self.pid, 0)
        self._reaped = True
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.waitstatus_to_exitcode(status)}"


def _child_main(conn: Connection, work: Callable[[Send], Any]) -> None:
    code = 1
    try:
        lock = threading.Lock()

        def send(kind: str, value: Any) -> None:
            with lock:
                conn.send((kind, value))

        try:
            send("done", work(send))
            code = 0
        except BaseException as e:
            send("error", _portable(e))
    finally:
        os._exit(code)


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives a pickle with its message, else a RuntimeError saying it."""
    if isinstance(error, TierdataError):
        return error
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _die_with(parent: int) -> None:
    """Have the kernel kill this child when ``parent`` dies (Linux); exit if it is gone already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
