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
    "litdata==0.2.76"             # loader peer (pulls torchvision 0.28.0; see below)
    "mosaicml-streaming==0.13.0"  # loader peer (MDS); needs numpy<2.2 and xxhash<4
    "webdataset==1.0.2"           # loader peer
)

# Installed packages the peers may move (everything else stays as the project installed
# it): mosaicml-streaming 0.13 caps numpy below 2.2 and xxhash below 4, both within the
# project's own ranges.
FLOAT=(numpy xxhash)

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" -e "$ROOT[dev]"
# The constraints keep torch, and every package already installed but the peers and
# FLOAT, where they are while the peers resolve: pip does not re-check the requirements of
# installed packages, so an unconstrained peer could e.g. move botocore past what
# aiobotocore (s3fs) accepts.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
{
    echo "$TORCH_SPEC"
    "$VENV/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
        | grep -v -i -E "^(torch|$(IFS='|'; echo "${FLOAT[*]} ${PEERS[*]%%[<=>]*}" | tr ' ' '|'))==" || true
} > "$CONSTRAINTS"
"${PIP[@]}" -c "$CONSTRAINTS" "${PEERS[@]}"

# litdata and mosaicml-streaming require torchvision, and PyPI's torchvision wheels are
# CUDA builds: against the CPU torch their C extension cannot load (it links
# libtorch_cuda.so) and `import torchvision` raises. A torchvision that raises on import is
# worse than none (libraries that probe for it crash), so it goes. litdata imports it only
# for image data; the loader benchmark imports MDS without its torchvision-only
# `streaming.vision` module (benchmarks/loader/candidates.py). `pip check` then reports the
# missing torchvision; that is expected.
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall -y --disable-pip-version-check torchvision >/dev/null 2>&1 || true
    echo "torchvision removed: PyPI's CUDA build cannot load against the CPU torch"
fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "torchvision", "numpy", "tierdata", "datasketch", "rensa", "matplotlib",
             "litdata", "mosaicml-streaming", "webdataset"):
    try:
        print(f"{name:20s} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:20s} (not installed)")
PY
echo "bench env ready: $VENV"
