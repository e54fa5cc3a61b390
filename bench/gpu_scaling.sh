#!/usr/bin/env bash
# The Steerling scaling experiment on a GPU machine (run from the repository root):
#   bash bench/gpu_scaling.sh            (OUT=folder for the results, default build/scaling-cuda)
# 1) a CUDA smoke run of the tiny mode (bf16 autocast; a few seconds), 2) the `cuda` mode of
# penrose_zoo.steerling.scaling (sizes e32 … e256, both families, all four variants) with seed 0,
# stopped after SCALING_BUDGET_S seconds (default 420). Finished runs are cached under the output
# folder's runs/, so running the script again continues where it stopped; the analysis and plots
# are rewritten from whatever runs exist. Copies results.json and the plots to $OUT when set.
set -uo pipefail
DEST=${SCALING_OUT:-build/scaling-cuda}
BUDGET=${SCALING_BUDGET_S:-420}
SEEDS=${SCALING_SEEDS:-0}
python - <<'PY'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
python -m penrose.cli steerling scaling --tiny --device cuda --out build/scaling-cuda-smoke --families causal \
  --variants base,bottleneck_attached || exit 1
timeout "$BUDGET" python -m penrose.cli steerling scaling --device cuda --seeds "$SEEDS" --out "$DEST" --threads 4
rc=$?
if [ "$rc" -eq 124 ]; then
  echo "budget of ${BUDGET}s reached; rerun to continue (cached runs are kept)"
  python -m penrose.cli steerling scaling --device cuda --seeds "$SEEDS" --out "$DEST" --analyse-only
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$DEST"/results.json "$DEST"/*.png "$OUT"/ 2>/dev/null || true
  cp -r "$DEST"/runs "$OUT"/ 2>/dev/null || true
fi
exit 0
