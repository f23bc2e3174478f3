#!/usr/bin/env bash
# Top-1 selection mixers on a CUDA machine: the GPU correctness tests (fast CUDA path and its Triton tile kernel against the dense
# reference), then the selection benchmark up to 64k. About 5-8 minutes on one recent GPU.
#
#   scripts/gpu_top1.sh [OUT_DIR]            default OUT_DIR: bench_results/selection_gpu
#
# The benchmark runs even when a test fails (it refuses any variant whose own check fails), but the
# script then exits non-zero; a skipped GPU test counts as a failure, as does a failed benchmark step.
# Python and installation: see scripts/gpu_common.sh (set PYTHON=..., WHEELS=... for offline machines).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench_results/selection_gpu}"
. scripts/gpu_common.sh
gpu_setup "$OUT" pydantic pytest matplotlib numpy

status=0
echo "== GPU correctness tests (fast CUDA path vs dense reference) =="
gpu_pytest 300 "$OUT/gpu_tests.xml" tests/test_top1.py tests/test_top1_kernel_gpu.py 2>&1 | tee "$OUT/gpu_tests.log" || status=$?
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
