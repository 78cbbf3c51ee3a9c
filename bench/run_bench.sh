#!/usr/bin/env bash
# Times sdrun against ONNX Runtime (PyPI onnxruntime, CPU, ORT_ENABLE_ALL) on the same exported
# models, inputs and thread count, in one run, and prints the ratios.
#   bench/run_bench.sh [--threads N] [--iterations N]
set -euo pipefail
cd "$(dirname "$0")/.."
# sdrun's f32 GEMMs dispatch on cpuid features and ONNX Runtime uses its own
# MLAS kernels, so OpenBLAS's CPU-model table affects neither.
PY=${SD_PYTHON:-.venv/bin/python} # the project venv (scripts/install-deps.sh)
BUILD_DIR=${BUILD_DIR:-build}
THREADS=$(nproc)
ITER=30
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS="$2"; shift 2 ;;
    --iterations) ITER="$2"; shift 2 ;;
    *) echo "run_bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
OUT="$BUILD_DIR/bench"
mkdir -p "$OUT"
SDC="$BUILD_DIR/tools/sdc"
SDRUN="$BUILD_DIR/tools/sdrun"

# name | export args | input name | input shape
CASES=(
  "gpt-small|--only gpt --d-model 128 --layers 2 --heads 4 --seq 64 --batch 1|input_ids|1x64"
  "gpt-medium|--only gpt --d-model 512 --layers 4 --heads 8 --seq 256 --batch 1|input_ids|1x256"
  "cnn-32px|--only cnn --cnn-width 32 --image 32 --batch 8|image|8x3x32x32"
  "cnn-128px|--only cnn --cnn-width 64 --image 128 --batch 4|image|4x3x128x128"
  "mobilenet-224px|--only mobilenet --cnn-width 16 --image 224 --batch 1|image|1x3x224x224"
)

printf "%-12s %8s %12s %12s %8s\n" model threads "sdrun ms" "ORT ms" "ratio"
for c in "${CASES[@]}"; do
  IFS='|' read -r name exportArgs input shape <<<"$c"
  dir="$OUT/$name"
  mkdir -p "$dir"
  "$PY" examples/export_models.py --out "$dir" $exportArgs >/dev/null
  model="$dir/$(echo "$exportArgs" | awk '{print $2}').onnx"
  npy="$dir/$(echo "$exportArgs" | awk '{print $2}')_${input}.npy"
  "$SDC" compile "$model" -o "$dir/plan.sdp" --shapes "$input=$shape"
  mkdir -p "$dir/in"
  "$PY" -c "import numpy as np, onnx; from onnx import numpy_helper as h; onnx.save_tensor(h.from_array(np.load('$npy')), '$dir/in/input_0.pb')"
  sd=$("$SDRUN" bench "$dir/plan.sdp" --input-dir "$dir/in" --iterations "$ITER" --warmup 5 --threads "$THREADS" | tail -1)
  ort=$("$PY" bench/ort_run.py "$model" --input "$input=$npy" --iterations "$ITER" --warmup 5 --threads "$THREADS" | tail -1)
  sdms=$(echo "$sd" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['median_ms'])")
  ortms=$(echo "$ort" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['median_ms'])")
  ratio=$("$PY" -c "print(f'{$sdms/$ortms:.2f}')")
  printf "%-12s %8s %12.3f %12.3f %8s\n" "$name" "$THREADS" "$sdms" "$ortms" "$ratio"
done
