#!/usr/bin/env bash
# Steerling benchmarks and parity on a GPU machine (run from the repository root):
#   bash bench/gpu_steerling.sh
# Prints the forward+backward time ratio penrose / hand-written on CUDA for the tiny and small
# configs, bfloat16 parity / tokens per second / memory for the small config, then the parity tests.
set -euo pipefail
python - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
PENROSE_REDUCED=${PENROSE_REDUCED:-0} python bench/steerling.py --device cuda
# bfloat16 parity with float32 (stated tolerance in the script), tokens/s and peak memory
python bench/gpu_steerling_bf16.py --device cuda
python -m pytest -q tests/steerling/test_steerling_parity.py
