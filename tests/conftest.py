"""Fixtures for every test package: a real S3 server on loopback (see ``tests/s3server.py``).

- ``s3_server`` (session): the :class:`~tests.s3server.S3Endpoint` of a running server,
  started on first use (one per pytest-xdist worker) and stopped at the end.
- ``s3_url``: a fresh ``s3://bucket/prefix`` that no other test uses; the bucket exists.
- ``s3_store``: an :class:`~cachetier.s3store.S3Store` opened on ``s3_url``.
- ``s3_env``: the ``AWS_*`` variables for that server, set for this test (and so for
  any subprocess it starts); returns them as a dict.

Tests that use ``s3_server`` get the ``s3`` marker, so ``-m "not s3"`` skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cachetier.ramowner import remove_owned_under
from tests.s3server import S3Endpoint, start_s3_server

if TYPE_CHECKING:
    from cachetier.s3store import S3Store

_AWS_VARIABLES_TO_CLEAR = ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")


@pytest.fixture(scope="session", autouse=True)
def _no_ram_tiers_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Remove the /dev/shm RAM tiers of the caches the tests made: pytest keeps its temp
    folders (the caches' owners) after the session, so the tiers would outlive it."""
    yield
    remove_owned_under(Path("/dev/shm"), tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    server = start_s3_server()
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_server: S3Endpoint) -> str:
    return s3_server.unique_url()


@pytest.fixture
def s3_store(s3_server: S3Endpoint, s3_url: str) -> Iterator[S3Store]:
    with s3_server.store(s3_url) as store:
        yield store


@pytest.fixture
def s3_env(s3_server: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name in _AWS_VARIABLES_TO_CLEAR:
        monkeypatch.delenv(name, raising=False)
    env = s3_server.env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
