#!/usr/bin/env bash
# On a CUDA machine: every GPU-marked test, then the whole-model throughput table (tokens/s, peak memory)
# at T = 2k, 8k, 32k for Transformer++, Mamba-2, Gated DeltaNet and Top-1 Chunk at the 110m preset.
# Budget: under 8 minutes on one H100/H200-class GPU. Results land in bench_results/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# the CUDA build of torch: take what the machine provides, else the default index's build
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || python -m pip install -q torch
python -m pip install -q --no-deps -e . && python -m pip install -q numpy pydantic tokenizers safetensors tqdm matplotlib zstandard platformdirs pytest "flash-linear-attention==0.6.0"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('device:', torch.cuda.get_device_name())"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
timeout 300 python -m pytest tests -m gpu -q -p no:cacheprovider || echo "GPU tests FAILED (see above)"
timeout 150 python -m basecap bench throughput --preset 110m --lengths 2048 8192 32768 --reps 1 \
  --mixers attention mamba2 gated_deltanet top1_chunk
