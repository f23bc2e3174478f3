#!/usr/bin/env bash
# Set up (fresh machine is fine) and run the quickstart experiment on the built-in corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
exec basecap run experiments/quickstart.toml "$@"
