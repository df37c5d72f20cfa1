#!/usr/bin/env bash
# Install (scripts/setup.sh), lint, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
python -m pytest -n 2 -q "$@"
