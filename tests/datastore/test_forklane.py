"""The forked second lane: messages in order, the result after the child has exited,
errors with their subject, and a child that dies reported with how it ended."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cachetier.errors import BadInputError
from datastore._forklane import Lane


def reaped(pid: int) -> bool:
    """True when ``pid`` is no child of ours to wait for (reaped already)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_result_is_read_after_the_child_has_exited() -> None:
    seen: list[int] = []

    def work(send):
        send("progress", 5)
        send("sync", 7)
        return {"shards": [1, 2, 3]}

    lane = Lane(work, seen.append)
    time.sleep(0.3)  # the child is done and gone: its end of the pipe is closed
    for _ in range(3):
        lane.poll()  # must not read past the last message
    assert lane.wait_for("sync") == 7
    lane.poll()
    assert lane.wait_for("done") == {"shards": [1, 2, 3]}
    lane.reap()
    assert seen == [5] and reaped(lane.pid)


def test_an_error_in_the_child_is_raised_with_its_subject() -> None:
    def work(send):
        raise BadInputError("file changed while being ingested", subject="src/a.bin", hint="run it again")

    lane = Lane(work)
    with pytest.raises(BadInputError) as info:
        lane.wait_for("done")
    lane.reap()
    assert info.value.subject == "src/a.bin" and str(info.value) == (
        "src/a.bin: file changed while being ingested (run it again)"
    )


def test_a_child_that_dies_is_reported_with_its_signal() -> None:
    def work(send):
        os.kill(os.getpid(), signal.SIGKILL)

    lane = Lane(work)
    with pytest.raises(RuntimeError, match=r"died \(killed by SIGKILL\)"):
        lane.wait_for("done")
    lane.reap()
    assert reaped(lane.pid)


def test_an_unpicklable_error_arrives_as_its_message() -> None:
    class Local(Exception):  # defined in a function: cannot be pickled
        pass

    def work(send):
        raise Local("boom")

    lane = Lane(work)
    with pytest.raises(RuntimeError, match="Local: boom"):
        lane.wait_for("done")
    lane.reap()
