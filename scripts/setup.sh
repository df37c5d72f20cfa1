#!/usr/bin/env bash
# Create .venv (if missing) and install tierdata with its dev extras, from scratch.
# torch is pinned to a CPU build first, so nothing pulls several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >&2
python -m pip install -q "torch==2.13.*" >&2
# The constraint keeps that torch while the dev extras (torchdata, lightning) resolve.
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.*" > "$constraints"
python -m pip install -q -c "$constraints" -e ".[dev]" >&2
