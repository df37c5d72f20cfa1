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
dataset ingest corpus.jsonl --shard-size 1MB
dataset version -m "raw corpus" --tag raw
dataset dedup --method minhash --threshold 0.8
dataset log
dataset show
dataset checkout raw --to checkout-raw --format jsonl
dataset checkout main
dataset verify
python "$here/examples/stream_epoch.py" --repo data-repo --cache-dir "$work/cache"
dataset cache stats --cache-dir "$work/cache"
echo "== done: repository in $work/data-repo" >&2
