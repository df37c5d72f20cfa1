"""CacheConfig and the one function that reads it from the workspace and the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachetier.config import CacheConfig, load_cache_config, parse_size
from cachetier.errors import BadInputError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (123, 123),
        ("123", 123),
        ("4GiB", 4 << 30),
        ("512mib", 512 << 20),
        ("20G", 20 * 10**9),
        ("1.5GiB", 3 << 29),
        (" 7 kb ", 7000),
    ],
)
def test_parse_size(text, expected) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "5 parsecs", "-3", -3, True, "1e9"])
def test_parse_size_rejects_with_the_value(bad) -> None:
    with pytest.raises(BadInputError, match="ram_bytes"):
        parse_size(bad, name="ram_bytes")


@given(st.integers(0, 1 << 50))
def test_sizes_round_trip(n: int) -> None:
    assert parse_size(str(n)) == n == parse_size(n)


def test_precedence_flags_then_environment_then_workspace(tmp_path: Path) -> None:
    workspace = {"dir": str(tmp_path / "ws"), "ram_bytes": "1MiB", "ssd_bytes": 10, "policy": "lru"}
    env = {"TIERDATA_CACHE_DIR": str(tmp_path / "env"), "TIERDATA_CACHE_SSD_BYTES": "2GiB"}
    config = load_cache_config(workspace, environ=env, ram_bytes=None, ssd_bytes="3GiB")
    assert config.dir == tmp_path / "env"
    assert config.ram_bytes == 1 << 20  # from the workspace: no env, flag not given
    assert config.ssd_bytes == 3 << 30  # the flag wins
    assert config.policy == "lru"
    assert load_cache_config(None, environ=env).ssd_bytes == 2 << 30


def test_defaults_and_xdg(tmp_path: Path) -> None:
    config = load_cache_config(environ={"XDG_CACHE_HOME": str(tmp_path)})
    assert config.dir == tmp_path / "tierdata"
    assert config.lmdb_dir == tmp_path / "tierdata" / "lmdb"
    assert load_cache_config(environ={}).dir == Path.home() / ".cache" / "tierdata"
    a, b = CacheConfig(dir=tmp_path / "a"), CacheConfig(dir=tmp_path / "b")
    assert a.resolved_ram_dir != b.resolved_ram_dir  # two caches on a node never share RAM files


def test_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="'colour'"):
        load_cache_config({"colour": "blue"}, environ={})
    with pytest.raises(BadInputError, match="TIERDATA_CACHE_RAM_BYTES"):
        load_cache_config(environ={"TIERDATA_CACHE_RAM_BYTES": "plenty"})
    with pytest.raises(BadInputError, match="verify"):
        CacheConfig(verify="sometimes")
    with pytest.raises(TypeError):
        CacheConfig(tmp_path)  # keyword-only


def test_config_round_trips_through_its_dict(tmp_path: Path) -> None:
    config = CacheConfig(dir=tmp_path, ram_bytes="2MiB", ssd_bytes=5 << 20)
    assert CacheConfig(**config.to_dict()) == config.replace(ram_dir=config.resolved_ram_dir)
