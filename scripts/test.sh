#!/usr/bin/env bash
# Set up (fresh machine is fine) and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh test
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CI="${CI:-1}"  # a test skipped for a missing test extra fails instead (tests/conftest.py)
# static checks first (pyproject.toml configures them): lint, format, then types (about a minute on a cold cache)
ruff check src
ruff format --check src
mypy src/basecap
python -m pytest tests -m "not gpu" "$@"
