#!/usr/bin/env bash
# Set up (fresh machine is fine) and run the whole test suite on CPU.
# --fast (first argument): the tier to run while editing: the tests measured under 1 s (tests/slow_tests.txt lists
# the others), the same static checks, and no setup when .venv exists (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
if [ "$fast" = 0 ] || [ ! -x .venv/bin/python ]; then
  ./scripts/setup.sh test
fi
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export CI="${CI:-1}"  # a test skipped for a missing test extra fails instead (tests/conftest.py)
# static checks first (pyproject.toml configures them): lint, format, then types (about a minute on a cold cache)
ruff check src
ruff format --check src
mypy src/basecap
if [ "$fast" = 1 ]; then
  python -m pytest tests -m "not gpu and not slow" "$@"
else
  python -m pytest tests -m "not gpu" "$@"
fi
