#!/usr/bin/env bash
# A separate environment for DVC (.bench-venv-dvc, git-ignored; CI never builds it).
# DVC pins its own fsspec/s3fs, so it lives apart from tierdata's environments; the
# ingest benchmark runs its CLI as a subprocess.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DVC_VENV:-$ROOT/.bench-venv-dvc}"
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "dvc[s3]==3.67.1"
"$VENV/bin/dvc" --version
