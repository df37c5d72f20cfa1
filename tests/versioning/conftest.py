from __future__ import annotations

import pytest

from cachetier.localstore import LocalStore
from cachetier.objects import ObjectStore


@pytest.fixture
def store(tmp_path):
    with LocalStore(tmp_path / "repo") as s:
        yield s


@pytest.fixture
def objects(store):
    return ObjectStore(store)
