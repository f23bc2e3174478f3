#!/usr/bin/env bash
# On a CUDA machine, one command for everything that needs the GPU, ending in one table (OUT_DIR/summary.md):
#   1. every GPU-marked test (fla fast paths in fp32 and bf16 and under bf16 autocast, Top-1's CUDA path and its
#      Triton tile kernel in fp32 and bf16, the fused LM head);
#   2. `basecap bench selection` up to 64k: Top-1 Chunk Approx on its kernel path against SDPA (flash) attention,
#      layer forward+backward, the mixing op alone, a model training step at 16k, decode latency;
#   3. `basecap bench throughput` at the 110m preset (bf16 autocast, one AdamW step per measurement):
#      Transformer++, Mamba-2, Gated DeltaNet, Top-1 Chunk at 2k and 8k tokens.
# (`basecap bench train` is the trainer-overhead benchmark of the CPU machine: its plain loop, peak probe and
# corpus are CPU-side, so the 110m training speed on the GPU comes from `bench throughput`.)
# Budget: about 15 minutes on one H100/H200-class GPU.
#
#   scripts/gpu_check.sh [OUT_DIR]            default OUT_DIR: bench_results/gpu_check
#
# Every step runs even when an earlier one fails (GPU time is scarce: the benchmarks refuse any variant whose
# own correctness check fails), then the script exits non-zero and prints FAILED with the failed steps when
# any GPU test failed, errored or was skipped (on a GPU machine a skip means a path went unchecked), when
# no GPU test ran, when a benchmark failed or left out a variant or length, or when no GPU is visible.
# Python and installation: see scripts/gpu_common.sh (set PYTHON=..., WHEELS=... for offline machines).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench_results/gpu_check}"
. scripts/gpu_common.sh
gpu_setup "$OUT" numpy pydantic tokenizers safetensors tqdm matplotlib zstandard platformdirs scipy pytest einops \
  triton fla=flash-linear-attention==0.6.0

failed=()
echo "== 1. GPU tests (fp32, bf16, autocast) =="
gpu_pytest 480 "$OUT/gpu_tests.xml" tests 2>&1 | tee "$OUT/gpu_tests.log" || failed+=("GPU tests")

echo "== 2. selection benchmark: Top-1 Chunk Approx (Triton tile kernel) vs SDPA, 2k-64k =="
timeout 420 "$PY" -m basecap bench selection --device cuda --variants sdpa top1_chunk_approx \
  --core-variants sdpa top1_chunk_approx --lengths 2048 8192 16384 32768 65536 --memory-max-len 65536 \
  --reps 3 --long-reps 2 --model-len 16384 --model-variants sdpa top1_chunk_approx --decode-lens 1024 16384 \
  --out "$OUT/selection" 2>&1 | tee "$OUT/selection.log" || failed+=("selection benchmark")

echo "== 3. whole-model training throughput at the 110m preset (bf16 autocast) =="
timeout 300 "$PY" -m basecap bench throughput --preset 110m --lengths 2048 8192 --reps 2 \
  --mixers attention mamba2 gated_deltanet top1_chunk --out "$OUT/throughput" 2>&1 | tee "$OUT/throughput.log" \
  || failed+=("throughput benchmark")

echo "== summary =="
gpu_summary "$OUT" 2048 8192 16384 32768 65536 || failed+=("summary (missing benchmark rows)")
if [ "${#failed[@]}" -gt 0 ]; then
  echo "gpu_check: FAILED: ${failed[*]} (results in $OUT)" >&2
  exit 1
fi
echo "gpu_check: all GPU tests passed, every benchmark row present; results in $OUT (summary.md)"
