#!/usr/bin/env bash
# Demo: export a GPT-style decoder and a CNN from PyTorch, compile them with
# sdc into shape-specialized plans, run them with sdrun, check the outputs
# against ONNX Runtime, and time both on this machine; then the training demo
# (scripts/train_demo.sh): pre-train, LoRA, merge and generate, all on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SD_PYTHON:-.venv/bin/python} # the project venv (scripts/install-deps.sh)
BUILD_DIR=${BUILD_DIR:-build}
SDC="$BUILD_DIR/tools/sdc"
SDRUN="$BUILD_DIR/tools/sdrun"
OUT=${DEMO_DIR:-$BUILD_DIR/demo}
THREADS=$(nproc)
mkdir -p "$OUT"

echo "== 1. export models with PyTorch $("$PY" -c 'import torch; print(torch.__version__)') (examples/export_models.py)"
"$PY" examples/export_models.py --out "$OUT" --opset 17 --d-model 256 --layers 4 --heads 8 --seq 128 \
  --batch 1 --cnn-width 32 --image 64 2>/dev/null

for spec in "gpt|input_ids|1x128" "cnn|image|1x3x64x64"; do
  IFS='|' read -r model input shape <<<"$spec"
  echo
  echo "== 2. sdc compile $model.onnx --shapes $input=$shape"
  "$SDC" compile "$OUT/$model.onnx" -o "$OUT/$model.sdp" --shapes "$input=$shape"
  "$SDRUN" inspect "$OUT/$model.sdp" | sed -n '5,11p'
  echo "== 3. sdrun infer, compared with ONNX Runtime"
  "$SDRUN" infer "$OUT/$model.sdp" --input "$input=$OUT/${model}_${input}.npy" --output-dir "$OUT/$model.sd" \
    --output-format npy
  "$PY" bench/ort_run.py "$OUT/$model.onnx" --input "$input=$OUT/${model}_${input}.npy" --output-dir "$OUT/$model.ort"
  "$PY" -c "
import numpy as np
a = np.load('$OUT/$model.sd/output_0.npy'); b = np.load('$OUT/$model.ort/logits.npy')
print(f'   logits {a.shape}: max |sdrun - onnxruntime| = {np.abs(a - b).max():.2e}',
      '-> match' if np.allclose(a, b, rtol=1e-3, atol=1e-4) else '-> MISMATCH')"
  echo "== 4. timing, $THREADS threads, median of 20"
  sd=$("$SDRUN" bench "$OUT/$model.sdp" --iterations 20 --threads "$THREADS" | tail -1)
  ort=$("$PY" bench/ort_run.py "$OUT/$model.onnx" --input "$input=$OUT/${model}_${input}.npy" --iterations 20 \
        --threads "$THREADS" | tail -1)
  "$PY" -c "
import json
s, o = json.loads('$sd'), json.loads('$ort')
print(f'   sdrun {s[\"median_ms\"]:.3f} ms   onnxruntime {o[\"median_ms\"]:.3f} ms   ratio {s[\"median_ms\"] / o[\"median_ms\"]:.2f}')"
done
echo
echo "demo done: models, plans and outputs in $OUT"

# Training: pre-train on the King James Bible, LoRA on fortunes, merge, generate.
scripts/train_demo.sh
