#!/usr/bin/env bash
# Create .venv (if missing) and install basecap with the given extras. torch is pinned to the CPU
# build 2.13.0 and installed first so no other requirement can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
if [ -n "$extras" ]; then
  python -m pip install -q -e ".[$extras]"
else
  python -m pip install -q -e .
fi
# an editable install carries no extra files: put the one-line .pth that lets `lm_eval --model basecap`
# find basecap (a wheel install ships it) into the environment
python -c "from basecap.lm_eval_plugin import main; main()"
