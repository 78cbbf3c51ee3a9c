#!/usr/bin/env bash
# Every GPU check and benchmark in one command, results in one folder.
#
#   scripts/gpu-check.sh [OUT]           on a GPU machine with this project's
#                                        dependencies: build, run the GPU tests
#                                        (ops_cuda, cuda_plans), the bundle
#                                        checks and benchmarks below, and
#                                        bench/gpu_train_bench.py (PyTorch peers)
#   scripts/gpu-check.sh --bundle DIR    on any build machine (no GPU needed):
#                                        sdrun with its libraries, the test plans,
#                                        data and CPU reference results, in DIR
#   scripts/gpu-check.sh --run DIR [OUT] on a bare GPU machine (only the NVIDIA
#                                        driver, bash and python3): run the
#                                        bundle on the GPU against the references
#
# SD_GPU_CHECK_DEVICE=cpu runs --run's checks on the CPU instead (a dry run
# of this script: CTest gpu_check_dry_run). SD_GPU_CHECK_PLANS="full lora"
# runs only those plan kinds, in that order; SD_GPU_CHECK_TIMEOUT (300) stops
# any one check after that many seconds; SD_BUNDLE_PYTHON is the Python that
# runs the op harness (the one _sdops was built for, with NumPy, ml_dtypes
# and onnx; default python3).
#
# OUT (default gpu-results/) receives summary.txt (one PASS/FAIL line per
# check), bench.txt (sdrun bench per plan and entry on the GPU),
# train_bench.txt (against PyTorch), nvidia-smi.txt and the logs. The exit
# status is 0 only when every check passed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Tolerances of the GPU runs against the CPU (f32 throughout, no TF32).
LOGITS_RTOL=1e-4 LOGITS_ATOL=1e-5 LOSS_RTOL=1e-3 WEIGHTS_ATOL=1e-3

die() { echo "gpu-check: $*" >&2; exit 2; }

bundle() {
  local dir=$1 build=${BUILD_DIR:-$ROOT/build}
  [ -x "$build/tools/sdrun" ] && [ -x "$build/tools/sdc" ] || die "no build in $build: run scripts/build.sh first"
  "$build/tools/sdrun" inspect --help >/dev/null || die "$build/tools/sdrun does not run"
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" || die "cannot create $dir"
  cp "$build/tools/sdrun" "$dir/bin/" && cp "$ROOT/scripts/gpu-check.sh" "$ROOT/scripts/gpu_compare.py" "$dir/" ||
    die "cannot copy sdrun into $dir"
  # Every shared library sdrun needs except glibc's own (the GPU machine has
  # those); the CUDA runtime is linked in statically and cuBLASLt is optional.
  ldd "$build/tools/sdrun" | awk '/=> \// {print $3}' | while read -r lib; do
    case $(basename "$lib") in libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
      *) cp -L "$lib" "$dir/lib/" ;; esac
  done
  # The NCCL plugin, found beside sdrun's ../lib (one rank's NCCL check).
  [ -f "$build/lib/libsdcomm_nccl.so" ] && cp "$build/lib/libsdcomm_nccl.so" "$dir/lib/"
  "$ROOT/.venv/bin/python" "$ROOT/scripts/gpu_bundle.py" --build "$build" --out "$dir" || die "bundle references failed"
  # The op harness with its cases' inputs and reference outputs computed here
  # (onnx.reference, PyTorch), so the GPU machine needs only NumPy, ml_dtypes,
  # onnx and the Python that _sdops was built for (SD_BUNDLE_PYTHON there).
  mkdir -p "$dir/ops" && cp "$ROOT/test/ops/op_harness.py" "$build"/python/_sdops.*.so "$dir/ops/" ||
    die "cannot copy the op harness into $dir"
  PYTHONPATH="$build/python" "$ROOT/.venv/bin/python" "$ROOT/test/ops/op_harness.py" --backend cuda \
    --write-references "$dir/ops/references.pkl" || die "op harness references failed"
  echo "gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1)); on the GPU machine: $dir/gpu-check.sh --run $dir OUT"
}

run_bundle() {
  local dir out=$2 fails=0
  dir=$(cd "$1" && pwd) || die "no bundle at $1"
  mkdir -p "$out" || die "cannot create $out"
  out=$(cd "$out" && pwd)
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local sdrun="$dir/bin/sdrun" cmp="python3 $dir/gpu_compare.py" summary="$out/summary.txt"
  # SD_GPU_CHECK_DEVICE=cpu: a dry run of the whole script on the CPU (CTest
  # gpu_check_dry_run), so the one command a GPU session gets is known to work.
  local device=${SD_GPU_CHECK_DEVICE:-cuda}
  command -v python3 >/dev/null || die "python3 is needed for the comparisons"
  (nvidia-smi || echo "nvidia-smi not found") > "$out/nvidia-smi.txt" 2>&1
  # Each check is stopped after SD_GPU_CHECK_TIMEOUT seconds (a hung kernel
  # fails its check, not the whole run); its full output goes to checks.log.
  check() { # name, command...
    local name=$1; shift
    local detail status=0
    detail=$(timeout "${SD_GPU_CHECK_TIMEOUT:-300}" "$@" 2>&1) || status=$?
    [ $status -eq 124 ] && detail+=$'\n'"timed out after ${SD_GPU_CHECK_TIMEOUT:-300} s"
    printf '== %s (exit %d)\n%s\n' "$name" "$status" "$detail" >> "$out/checks.log"
    if [ $status -eq 0 ]; then echo "PASS  $name: ${detail##*$'\n'}" >> "$summary"
    else echo "FAIL  $name: ${detail##*$'\n'}" >> "$summary"; fails=$((fails + 1)); fi
  }
  # Whether a run with NCCL captured its steps into CUDA graphs (SD_CUDA_GRAPH_DOT=PREFIX
  # wrote some) with no segment left eager (its log, $2). NCCL does no work for an
  # in-place all-reduce over one rank, so a graph holds no NCCL kernel to look for.
  local nccl_graph='n=$(ls "$1"*.dot 2>/dev/null | wc -l); echo "$n graphs captured"; [ "$n" -gt 0 ] &&
    ! grep "runs without a CUDA graph" "$2"'
  : > "$summary"
  : > "$out/checks.log"
  : > "$out/bench.txt"
  local first why
  first=$(ls "$dir"/plans/*.sdp | head -1)
  if ! why=$("$sdrun" bench "$first" --device "$device" --iterations 1 --warmup 0 2>&1); then
    echo "FAIL  a usable GPU: ${why##*$'\n'}" | tee "$summary"
    return 1
  fi
  if [ -f "$dir/ops/references.pkl" ]; then
    check "op harness: every $device kernel against the references" env PYTHONPATH="$dir/ops" \
      "${SD_BUNDLE_PYTHON:-python3}" "$dir/ops/op_harness.py" --backend "$device" --references "$dir/ops/references.pkl"
  fi
  local traced="" plans=()
  # SD_GPU_CHECK_PLANS="full lora ...": only these plan kinds, in this order.
  if [ -n "${SD_GPU_CHECK_PLANS:-}" ]; then
    local k; for k in $SD_GPU_CHECK_PLANS; do plans+=("$dir/plans/$k.sdp"); done
  else plans=("$dir"/plans/*.sdp); fi
  for plan in "${plans[@]}"; do
    local kind ref w logits_rtol logits_atol loss_rtol weights_atol
    kind=$(basename "$plan" .sdp) ref="$dir/ref/$kind" w="$out/$kind"
    mkdir -p "$w"
    read -r logits_rtol logits_atol loss_rtol weights_atol < "$ref/tolerances" 2>/dev/null ||
      { logits_rtol=$LOGITS_RTOL logits_atol=$LOGITS_ATOL loss_rtol=$LOSS_RTOL weights_atol=$WEIGHTS_ATOL; }
    check "$kind: kernel coverage" "$sdrun" inspect "$plan" --kernels cuda
    local input name
    input=$(ls "$dir/inputs/$kind".*.npy | head -1) name=${input#"$dir/inputs/$kind."} name=${name%.npy}
    check "$kind: infer on $device" "$sdrun" infer "$plan" --device "$device" --input "$name=$input" \
      --output-dir "$w/infer" --output-format npy
    check "$kind: outputs match the CPU" $cmp logits "$w/infer/output_0.npy" "$ref-infer.npy" "$logits_rtol" "$logits_atol"
    # Timed runs replay CUDA graphs; --profile runs eagerly (per-op times), so it is a run of its own.
    { echo "== $kind infer ($device)"; "$sdrun" bench "$plan" --device "$device" --iterations 50 --warmup 5 2>&1
      echo "== $kind infer per op ($device)"; "$sdrun" bench "$plan" --device "$device" --iterations 20 --warmup 2 \
        --profile 2>&1
      echo "== $kind infer (cpu)"; "$sdrun" bench "$plan" --device cpu --iterations 50 --warmup 5 2>&1; } \
      >> "$out/bench.txt"
    [ -f "$ref/metrics.jsonl" ] || continue # an inference-only plan
    local train=(train "$plan" --data "$dir/train.jsonl" --steps 20 --lr 1e-3 --weight-decay 0.01 --clip-norm 1.0
                 --no-shuffle --truncate)
    for run in 1 2; do
      check "$kind: train on $device (run $run)" "$sdrun" "${train[@]}" --device "$device" \
        --metrics "$w/metrics$run.jsonl" --save-weights "$w/weights$run.safetensors"
    done
    check "$kind: losses match the CPU" $cmp losses "$w/metrics1.jsonl" "$ref/metrics.jsonl" "$loss_rtol"
    check "$kind: weights match the CPU" $cmp weights "$w/weights1.safetensors" "$ref/weights.safetensors" "$weights_atol"
    check "$kind: two GPU trainings, same losses" $cmp losses "$w/metrics2.jsonl" "$w/metrics1.jsonl" 0
    check "$kind: two GPU trainings, same weights" $cmp same "$w/weights2.safetensors" "$w/weights1.safetensors"
    if [ -z "$traced" ]; then # --profile: one trace event per kernel run (3 steps of train_step's kernels)
      traced=$kind
      check "$kind: --profile writes every kernel run" "$sdrun" train "$plan" --device "$device" --data \
        "$dir/train.jsonl" --steps 3 --truncate --profile "$w/trace.json"
      check "$kind: the trace has 3 steps of train_step's kernels" python3 -c '
import json, re, subprocess, sys
t = json.load(open(sys.argv[1]))
n = sum(e.get("ph") == "X" for e in t["traceEvents"])
per = int(re.search(r"train_step \[[^\]]*\]: (\d+) steps", subprocess.run([sys.argv[2], "inspect", sys.argv[3]],
          capture_output=True, text=True).stdout).group(1))
device = t["otherData"]["device"]
print(f"{n} events for 3 steps of {per} kernels on {device}")
sys.exit(n != 3 * per)' "$w/trace.json" "$sdrun" "$plan"
    fi
    if [ "$device" = cuda ]; then
      # NCCL with one rank (torchrun-style launch): the CPU's losses, and the
      # captured training step holds the all-reduce.
      mkdir -p "$w/nccl"
      check "$kind: NCCL with one rank trains" bash -c 'set -o pipefail; "$@" 2>&1 | tee "$0"' "$w/nccl/log" env WORLD_SIZE=1 RANK=0 \
        LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29500 + RANDOM % 1000)) SD_CUDA_GRAPH_DOT="$w/nccl/graph" \
        "$sdrun" "${train[@]}" --device cuda --metrics "$w/nccl/metrics.jsonl"
      check "$kind: NCCL with one rank, losses match the CPU" $cmp losses "$w/nccl/metrics.jsonl" \
        "$ref/metrics.jsonl" "$loss_rtol"
      check "$kind: NCCL with one rank, the training step is captured" bash -c "$nccl_graph" _ "$w/nccl/graph" \
        "$w/nccl/log"
      case $kind in *bf16|*fp16)
        # Half-precision attention runs cuDNN's fused SDPA; its losses equal the GEMM path's.
        check "$kind: Attention runs cuDNN's SDPA" bash -c '"$@" 2>&1 | grep "^sd: Attention" | sort -u |
          { lines=$(cat); echo "$lines" | tr "\n" ";"; [ -n "$lines" ] && ! echo "$lines" | grep -qv "cuDNN SDPA"; }' _ \
          env SD_CUDNN_SDPA=log "$sdrun" bench "$plan" --device cuda --entry train_step --data "$dir/train.jsonl" \
          --iterations 1 --warmup 0
        check "$kind: GEMM-path attention (SD_CUDNN_SDPA=0) trains" env SD_CUDNN_SDPA=0 "$sdrun" "${train[@]}" \
          --device cuda --metrics "$w/metrics-gemm.jsonl"
        check "$kind: cuDNN SDPA's losses equal the GEMM path's" $cmp losses "$w/metrics-gemm.jsonl" \
          "$w/metrics1.jsonl" "$loss_rtol" ;;
      esac
    fi
    for graphs in "" --no-cuda-graphs; do
      { echo "== $kind train_step ($device $graphs)"; "$sdrun" bench "$plan" --device "$device" --entry train_step \
          --data "$dir/train.jsonl" --iterations 50 --warmup 5 $graphs 2>&1; } >> "$out/bench.txt"
    done
    { echo "== $kind train_step per op ($device)"; "$sdrun" bench "$plan" --device "$device" --entry train_step \
        --data "$dir/train.jsonl" --iterations 20 --warmup 2 --profile 2>&1
      echo "== $kind train_step (cpu)"; "$sdrun" bench "$plan" --device cpu --entry train_step \
        --data "$dir/train.jsonl" --iterations 50 --warmup 5 2>&1; } >> "$out/bench.txt"
  done
  cat "$summary"
  echo "gpu-check: $(grep -c '^PASS' "$summary") passed, $fails failed; results in $out"
  [ "$fails" -eq 0 ]
}

case ${1:-} in
  -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --bundle) [ $# -eq 2 ] || die "usage: gpu-check.sh --bundle DIR"; bundle "$2" ;;
  --run) [ $# -ge 2 ] || die "usage: gpu-check.sh --run DIR [OUT]"; run_bundle "$2" "${3:-gpu-results}" ;;
  -*) die "unknown option $1 (see --help)" ;;
  *)
    out=${1:-gpu-results}
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    cd "$ROOT" || exit 2
    ./scripts/build.sh > "$out/build.log" 2>&1 || die "build failed (see $out/build.log)"
    (cd build && ctest --output-on-failure -R '^(ops_cuda|cuda_plans|cuda_plan_coverage|plan|shared_math)$') \
      > "$out/ctest.log" 2>&1
    tests=$?
    grep -E 'tests passed|Skipped|Failed' "$out/ctest.log"
    bundle "$out/bundle" > "$out/bundle.log" 2>&1 || die "bundle failed (see $out/bundle.log)"
    run_bundle "$out/bundle" "$out"
    checks=$?
    # The training benchmark against PyTorch eager and torch.compile (+ PEFT),
    # where the project's PyTorch sees the GPU.
    if .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      .venv/bin/python bench/gpu_train_bench.py --device cuda > "$out/train_bench.txt" 2>&1 ||
        echo "FAIL  bench/gpu_train_bench.py (see $out/train_bench.txt)" >> "$out/summary.txt"
      grep -E '^(gpt|llama)' "$out/train_bench.txt"
    else
      echo "gpu-check: PyTorch does not see the GPU here: bench/gpu_train_bench.py skipped" | tee -a "$out/summary.txt"
    fi
    [ $tests -eq 0 ] && [ $checks -eq 0 ] && ! grep -q '^FAIL' "$out/summary.txt"
    ;;
esac
