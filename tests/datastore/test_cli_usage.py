"""Usage errors exit 2 and name the option; a bad environment (a folder, a port, staged data
of another repository) is one line and exit 1; byte sizes mean the same everywhere."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cachetier.config import CacheConfig, load_cache_config, parse_size
from datastore.cli import build_parser, main
from tests.datastore.conftest import run_cli_process


@pytest.mark.parametrize(
    "args",
    [
        ["log", "-n", "-1"],
        ["gc", "--grace", "nan"],
        ["gc", "--grace", "inf"],
        ["gc", "--grace", "-5"],
        ["dedup", "--threshold", "1.5"],
        ["dedup", "--threshold", "0"],
        ["dedup", "--num-perm", "0"],
        ["cache", "stats", "--ram-bytes", "1e400"],
        ["cache", "stats", "--ram-bytes", "9" * 400],
        ["ingest", "x.jsonl", "--shard-size", "0"],
    ],
)
def test_bad_option_values_are_usage_errors(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse exits at once, as `dataset` would
        main(args)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "Traceback" not in err and args[-2] in err


def test_byte_sizes_are_read_one_way(cli, local_url: str, tmp_path: Path) -> None:
    parser = build_parser()
    for text, size in [("1KiB", 1024), ("1KB", 1000), ("2MiB", 2 << 20), ("3", 3), ("1.5GB", 1_500_000_000)]:
        assert parser.parse_args(["cache", "stats", "--ram-bytes", text]).ram_bytes == size
        assert load_cache_config({}, environ={"TIERDATA_CACHE_RAM_BYTES": text}).ram_bytes == size
        assert parse_size(text) == size
    assert parser.parse_args(["cache", "stats", "--ram-bytes", "0"]).ram_bytes == 0  # no RAM tier
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"i": i, "t": "x" * 100}) + "\n" for i in range(2000)))
    assert cli("init", local_url).code == 0
    big = cli("ingest", src, "--shard-size", "2MB", "--json").json
    assert big["shards"] == 1
    assert cli("reset").code == 0
    small = cli("ingest", src, "--shard-size", "20KB", "--json").json
    assert small["shards"] > 5


def test_every_spelling_of_a_cache_folder_is_one_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "cache")
    monkeypatch.chdir(tmp_path / "other")
    spellings = [tmp_path / "cache", "../cache", tmp_path / "other" / ".." / "cache", tmp_path / "link"]
    configs = [CacheConfig(dir=d) for d in spellings]
    assert {c.dir for c in configs} == {tmp_path.resolve() / "cache"}
    assert len({c.resolved_ram_dir for c in configs}) == 1


def test_a_missing_folder_for_dash_c_is_one_line(cli, tmp_path: Path) -> None:
    result = cli("-C", tmp_path / "nowhere", "status")
    assert result.code == 1 and "nowhere" in result.err and len(result.err.strip().splitlines()) == 1


def test_a_metrics_port_in_use_is_named(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERDATA_CACHE_DIR", str(tmp_path / "cache"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("cache", "serve", "--metrics-port", port)
    assert result.code == 1 and f"{port}" in result.err and "in use" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_init_elsewhere_with_staged_data_is_refused(cli, tmp_path: Path) -> None:
    first, second = tmp_path / "r1", tmp_path / "r2"
    src = tmp_path / "a.jsonl"
    src.write_text('{"a": 1}\n')
    assert cli("init", first).code == 0
    assert cli("ingest", src).code == 0
    refused = cli("init", second)
    assert refused.code == 1 and "staged" in refused.err and "dataset reset" in refused.err
    assert not second.exists()  # nothing created
    assert cli("status", "--json").json["staged"]["records"] == 1
    assert cli("init", first).code == 0  # the same repository again is fine
    assert cli("reset").code == 0
    assert cli("init", second).code == 0
    assert (second / "repo.json").exists()


def test_a_reader_that_goes_away_stops_the_output_quietly(tmp_path: Path) -> None:
    # `dataset log | head -1`: the pipe's reader is gone before the first line is written.
    assert run_cli_process("init", tmp_path / "repo", cwd=tmp_path).code == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    proc = subprocess.run(
        [sys.executable, "-m", "datastore.cli", "status"],
        cwd=tmp_path,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=60,
    )
    os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""


def test_init_where_no_folder_can_be_is_one_line(cli, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    result = cli("init", tmp_path / "afile" / "repo")
    assert result.code == 1 and "afile" in result.err and "internal error" not in result.err
