#!/usr/bin/env bash
# Top-1 selection mixers on a CUDA machine: the GPU correctness tests (fast CUDA path against the dense
# reference), then the selection benchmark up to 64k. About 5-8 minutes on one recent GPU.
#
#   scripts/gpu_top1.sh [OUT_DIR]            default OUT_DIR: bench_results/selection_gpu
#
# Python: $PYTHON if set, else the first of .venv/bin/python, python3, python whose torch sees a GPU.
# The environment's torch is used as is (never reinstalled). basecap is pip-installed editable without
# dependencies (falling back to PYTHONPATH=src); missing pure-Python requirements are installed with pip,
# offline from $WHEELS (a folder of wheels) when set.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench_results/selection_gpu}"
mkdir -p "$OUT"

has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in .venv/bin/python python3 python; do
    if command -v "$cand" >/dev/null 2>&1 && has_cuda "$cand"; then PY="$cand"; break; fi
  done
fi
if [ -z "$PY" ] || ! has_cuda "$PY"; then
  echo "gpu_top1: no Python whose torch sees a CUDA device (set PYTHON=...)" >&2
  exit 1
fi
echo "gpu_top1: using $PY"

missing=$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("pydantic", "pytest", "matplotlib", "numpy") if u.find_spec(m) is None))')
if [ -n "$missing" ]; then
  echo "gpu_top1: installing $missing"
  if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" $missing
  else
    "$PY" -m pip install -q $missing
  fi
fi
if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip_install.log" 2>&1; then
  echo "gpu_top1: editable install failed (see $OUT/pip_install.log); using PYTHONPATH=src"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

"$PY" - <<'EOF' | tee "$OUT/device.txt"
import torch, basecap
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
print("basecap from", basecap.__file__)
EOF

echo "== GPU correctness tests (fast CUDA path vs dense reference) =="
status=0
timeout 240 "$PY" -m pytest tests/test_top1.py -m gpu -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$OUT/gpu_tests.log" || status=$?
if [ "$status" -ne 0 ]; then
  echo "gpu_top1: GPU tests failed (exit $status); the benchmark still runs and skips any variant whose check fails" >&2
fi

echo "== selection benchmark (layer 2k-64k, model step 16k, decode 1k-64k) =="
timeout 300 "$PY" -m basecap.bench.selection --device cuda \
  --lengths 2048 4096 8192 16384 32768 65536 --memory-max-len 65536 --reps 5 --long-reps 3 \
  --model-len 16384 --model-variants sdpa top1_chunk_approx top1_chunk_exact top1_element \
  --decode-lens 1024 4096 16384 65536 --out "$OUT" 2>&1 | tee "$OUT/bench.log" || status=$?
echo "== model training step at 64k =="
timeout 120 "$PY" -m basecap.bench.selection --device cuda --variants sdpa top1_chunk_approx --lengths 65536 \
  --no-memory --model-len 65536 --model-variants sdpa top1_chunk_approx --decode-lens 1024 \
  --out "$OUT/model64k" 2>&1 | tee "$OUT/bench_model64k.log" || status=$?
echo "gpu_top1: results in $OUT (exit $status)"
exit "$status"
