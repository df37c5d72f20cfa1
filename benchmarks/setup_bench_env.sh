#!/usr/bin/env bash
# Create the benchmark environment /work/main/.bench-venv (git-ignored; CI never builds it).
#
# The peers we compare against live here, apart from the project's .venv, because some of
# them pull heavy dependencies. torch is pinned to the local CPU wheel first, so no peer can
# drag in an unpinned (CUDA, multi-GB) torch.
#
# Usage:  bash benchmarks/setup_bench_env.sh            (idempotent; re-run after edits)
#         BENCH_VENV=/other/path bash benchmarks/setup_bench_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.bench-venv}"
PYTHON="${PYTHON:-python3.11}"

# The pinned torch: a local CPU wheel (pip's find-links points at it). Never unpinned.
TORCH_SPEC="torch==2.13.0"

# Peers and benchmark tools, one per line. Add yours here (dvc, litdata,
# mosaicml-streaming, webdataset, ...); keep versions pinned to what RESULTS.md reports.
PEERS=(
    "datasketch==2.0.0"   # dedup: MinHash + MinHashLSH (bulk API)
    "rensa==0.5.0"        # dedup: Rust MinHash
    "matplotlib>=3.8"     # plots for every benchmark
)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e "$ROOT[dev]"
# The constraint keeps torch where it is while the peers resolve.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "$TORCH_SPEC" > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" "${PEERS[@]}"

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "tierdata", "datasketch", "rensa", "matplotlib"):
    try:
        print(f"{name:12s} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:12s} (not installed)")
PY
echo "bench env ready: $VENV"
