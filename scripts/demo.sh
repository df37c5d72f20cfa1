#!/usr/bin/env bash
# The main job end to end on the embedded default (a local repository):
# generate a sample corpus -> ingest -> version -> dedup -> log -> checkout -> stream an epoch
# through the tiered cache. Usage: bash scripts/demo.sh [WORKDIR]   (default: a temp folder)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bash "$here/scripts/setup.sh"
. "$here/.venv/bin/activate"
work="${1:-$(mktemp -d -t tierdata-demo.XXXXXX)}"
mkdir -p "$work" && cd "$work"
echo "== working in $work" >&2

python -c "from datastore.sample import write_sample_jsonl; write_sample_jsonl('corpus.jsonl', 20000, seed=0)"
dataset init data-repo
dataset ingest corpus.jsonl
dataset version -m "raw corpus" --tag raw
if dataset dedup --help >/dev/null 2>&1; then
  dataset dedup --method minhash --threshold 0.8
fi
dataset log
dataset show
dataset checkout raw --to checkout-raw --format jsonl
dataset checkout main
dataset verify
if [ -f "$here/examples/stream_epoch.py" ]; then
  python "$here/examples/stream_epoch.py" --repo data-repo --cache-dir "$work/cache"
fi
echo "== done: repository in $work/data-repo" >&2
