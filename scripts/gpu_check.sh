#!/usr/bin/env bash
# On a CUDA machine: every GPU-marked test, then the whole-model throughput table (tokens/s, peak memory)
# at T = 2k, 8k, 32k for Transformer++, Mamba-2, Gated DeltaNet and Top-1 Chunk at the 110m preset.
# Budget: under 8 minutes on one H100/H200-class GPU.
#
#   scripts/gpu_check.sh [OUT_DIR]            default OUT_DIR: bench_results/gpu_check
#
# Exits non-zero, before the benchmark, when any GPU test fails, errors or is skipped (on a GPU machine
# a skip, e.g. fla not importing, means a fast path went unchecked), or when no GPU test ran.
# Python and installation: see scripts/gpu_common.sh (set PYTHON=..., WHEELS=... for offline machines).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench_results/gpu_check}"
. scripts/gpu_common.sh
gpu_setup "$OUT" numpy pydantic tokenizers safetensors tqdm matplotlib zstandard platformdirs scipy pytest einops \
  fla=flash-linear-attention==0.6.0

echo "== GPU tests (fla fast paths, Top-1 CUDA path, fused LM head) =="
gpu_pytest 300 "$OUT/gpu_tests.xml" tests 2>&1 | tee "$OUT/gpu_tests.log"

echo "== whole-model throughput (bf16 autocast) =="
timeout 150 "$PY" -m basecap bench throughput --preset 110m --lengths 2048 8192 32768 --reps 1 \
  --mixers attention mamba2 gated_deltanet top1_chunk --out "$OUT/throughput" 2>&1 | tee "$OUT/throughput.log"
echo "gpu_check: results in $OUT"
