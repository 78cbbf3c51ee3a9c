#!/usr/bin/env bash
# Every GPU check and benchmark in one command, results in one folder.
#
#   scripts/gpu-check.sh [OUT]           on a GPU machine with this project's
#                                        dependencies: build, run the GPU tests
#                                        (ops_cuda, cuda_plans), the bundle
#                                        checks and benchmarks below, and
#                                        bench/gpu_train_bench.py (PyTorch peers)
#   scripts/gpu-check.sh --bundle DIR [--pack]
#                                        on any build machine (no GPU needed):
#                                        sdrun with its libraries, the test plans,
#                                        data and CPU reference results, in DIR
#                                        (--pack: also DIR.tar.xz, xz -9, about a
#                                        fifth of DIR's size, to carry; unpack it
#                                        with tar -xJf and run DIR/gpu-check.sh --run)
#   scripts/gpu-check.sh --run DIR [OUT] on a bare GPU machine (only the NVIDIA
#                                        driver, bash and python3): run the
#                                        bundle on the GPU against the references
#
# SD_GPU_CHECK_DEVICE=cpu runs --run's checks on the CPU instead (a dry run
# of this script: CTest gpu_check_dry_run). The bundle also holds a copy of
# the Python the op harness's module was built for (python/run), and the
# training benchmark's plans (SD_BUNDLE_BENCH_CONFIGS, default
# gpt2-small,llama-small; SD_BENCH_PRECISIONS, default fp32,bf16, on both
# sides) and compute-sanitizer where the build machine has it (.venv's
# wheel: requirements-models.txt); --run runs compute-sanitizer (the
# machine's, else the bundle's) and the benchmark against PyTorch where the
# GPU machine's python3 has it (SD_GPU_SANITIZER_PLANS="lora-bf16 ...": the
# plan kinds compute-sanitizer runs, default every training plan). SD_GPU_CHECK_PLANS="full lora"
# runs only those plan kinds, in that order; SD_GPU_CHECK_PARTS (default
# "ops plans sanitizer bench gemms profiles") runs only those parts of --run, so the
# checks can be split over several shorter GPU sessions; SD_GPU_CHECK_TIMEOUT (300) stops
# any one check after that many seconds (SD_GPU_BENCH_TIMEOUT, 900: the
# training benchmark); SD_GPU_CHECK_DEADLINE stops the whole --run after
# that many seconds, the checks it did not start reported SKIP (a lent
# GPU's minutes: parts in the order above); SD_BUNDLE_PYTHON is the Python that
# runs the op harness (the one _sdops was built for, with NumPy and
# ml_dtypes; default: the bundle's copy). --run finds cuDNN, cuBLASLt and
# NCCL in CUDA's folder or in python3's nvidia-* wheels (PyTorch's) when the
# loader does not, and runs the op harness beside the plan checks.
#
# OUT (default gpu-results/) receives summary.txt (one PASS/FAIL line per
# check), bench.txt (sdrun bench per plan and entry on the GPU),
# train_bench.txt (against PyTorch), gemm-PLAN.txt (the benchmark plans'
# GEMMs against raw cuBLASLt's best algorithm), profile-PLAN.txt (their
# training step per op), torch-PEER-CONFIG-MODE-PRECISION.txt (PyTorch's
# per-kernel table of the same step, with the bench and profiles parts),
# nvidia-smi.txt and the logs. The exit
# status is 0 only when every check passed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# Tolerances of the GPU runs against the CPU (f32 throughout, no TF32).
LOGITS_RTOL=1e-4 LOGITS_ATOL=1e-5 LOSS_RTOL=1e-3 WEIGHTS_ATOL=1e-3

die() { echo "gpu-check: $*" >&2; exit 2; }

# A copy of the .venv's interpreter (its binary, standard library, NumPy and
# ml_dtypes: what the op harness needs to replay saved references), run
# through DIR/run.
portable_python() {
  local dir=$1 py site ver
  py=$(readlink -f "$ROOT/.venv/bin/python") || return 1
  ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') || return 1
  site=$("$ROOT/.venv/bin/python" -c 'import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))')
  mkdir -p "$dir/bin" "$dir/lib/site-packages" && cp "$py" "$dir/bin/python" || return 1
  ldd "$py" | awk '/libpython/ {print $3}' | xargs -r cp -L -t "$dir/lib/"
  cp -r "/usr/lib/python$ver" "$dir/lib/" || return 1
  (cd "$dir/lib/python$ver" && rm -rf test idlelib tkinter turtledemo ensurepip lib2to3 pydoc_data config-* \
    site-packages dist-packages)
  for pkg in numpy numpy.libs ml_dtypes; do
    [ -e "$site/$pkg" ] && cp -r "$site/$pkg" "$dir/lib/site-packages/"
  done
  rm -rf "$dir"/lib/site-packages/numpy/*/tests
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  cat > "$dir/run" <<'PY'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
PYTHONHOME=$here PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$here/lib/site-packages" LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/python" "$@"
PY
  chmod +x "$dir/run" && "$dir/run" -c 'import numpy, ml_dtypes'
}

# cuDNN, cuBLASLt and NCCL where this machine has them but its loader does
# not find them: CUDA's own folder, or the nvidia-* wheels of its python3
# (PyTorch's). sdrun loads them at run time; without them it runs GEMM-path
# attention and no NCCL, so checks.log names the path used.
nvidia_libraries() {
  local lib d found dirs="" wheels
  wheels=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
  for lib in libcudnn.so.9 libcublasLt.so.13 libcublasLt.so.12 libnccl.so.2; do
    found=""
    for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$lib" ] && found=$d; done
    [ -n "$found" ] || ldconfig -p 2>/dev/null | grep -q "$lib " && continue
    found=$(find $wheels /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets -name "$lib" \
      2>/dev/null | head -1)
    [ -n "$found" ] && dirs+=":$(dirname "$found")"
  done
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH$dirs"
}

# compute-sanitizer, where this machine has it (CUDA's folder, or the
# nvidia-cuda-sanitizer-api wheel in .venv: requirements-models.txt), into
# DIR/bin and DIR/lib as the wheel lays it out, without its docs, headers and
# 32-bit helpers: a GPU machine with only the driver runs it from there.
bundle_sanitizer() {
  local dir=$1 exe from f
  for exe in "$(command -v compute-sanitizer)" /usr/local/cuda/bin/compute-sanitizer \
    "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu*/bin/compute-sanitizer; do
    [ -x "$exe" ] && break
  done
  [ -x "$exe" ] || { echo "gpu-check: no compute-sanitizer here: the bundle goes without it"; return 0; }
  from=$(dirname "$(readlink -f "$exe")")
  mkdir -p "$dir/bin" "$dir/lib" || return 1
  find "$from" -maxdepth 1 -type f -exec cp -t "$dir/bin/" {} + || return 1
  # The wheel's libraries sit in ../lib, beside other wheels' (cuBLAS ...).
  for f in "$from"/../lib/libsanitizer* "$from"/../lib/libTreeLauncher* "$from"/../lib/libInterceptor*; do
    [ -f "$f" ] || continue
    if cmp -s "$f" "$dir/bin/$(basename "$f")"; then ln -s "../bin/$(basename "$f")" "$dir/lib/"
    else cp "$f" "$dir/lib/"; fi
  done
  "$dir/bin/compute-sanitizer" --version > /dev/null || { rm -rf "$dir"; echo "gpu-check: $exe does not run"; }
}

bundle() {
  local dir=$1 build=${BUILD_DIR:-$ROOT/build}
  [ -x "$build/tools/sdrun" ] && [ -x "$build/tools/sdc" ] || die "no build in $build: run scripts/build.sh first"
  "$build/tools/sdrun" inspect --help >/dev/null || die "$build/tools/sdrun does not run"
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib" || die "cannot create $dir"
  cp "$build/tools/sdrun" "$dir/bin/" && cp "$ROOT/scripts/gpu-check.sh" "$ROOT/scripts/gpu_compare.py" "$dir/" ||
    die "cannot copy sdrun into $dir"
  # The CUDA backend plugin, which sdrun loads from its ../lib.
  [ -f "$build/lib/libsdcuda.so" ] || die "no $build/lib/libsdcuda.so: this build has no CUDA backend"
  cp "$build/lib/libsdcuda.so" "$dir/lib/" || die "cannot copy libsdcuda.so into $dir"
  # Every shared library sdrun and the plugin need except glibc's own (the GPU
  # machine has those); the CUDA runtime is linked in statically and cuBLASLt is optional.
  ldd "$build/tools/sdrun" "$build/lib/libsdcuda.so" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
      *) cp -L "$lib" "$dir/lib/" ;; esac
  done
  # The NCCL plugin, found beside sdrun's ../lib (one rank's NCCL check).
  [ -f "$build/lib/libsdcomm_nccl.so" ] && cp "$build/lib/libsdcomm_nccl.so" "$dir/lib/"
  bundle_sanitizer "$dir/sanitizer"
  "$ROOT/.venv/bin/python" "$ROOT/scripts/gpu_bundle.py" --build "$build" --out "$dir" || die "bundle references failed"
  # The op harness with its cases' inputs and reference outputs computed here
  # (onnx.reference, PyTorch), so the GPU machine needs only NumPy, ml_dtypes
  # and the Python that _sdops was built for (the bundle's python/run, below).
  mkdir -p "$dir/ops" && cp "$ROOT/test/ops/op_harness.py" "$build"/python/_sdops.*.so "$dir/ops/" ||
    die "cannot copy the op harness into $dir"
  PYTHONPATH="$build/python" "$ROOT/.venv/bin/python" "$ROOT/test/ops/op_harness.py" --backend cuda \
    --write-references "$dir/ops/references.pkl" || die "op harness references failed"
  # The Python _sdops was built for, with the op harness's two packages, so
  # a GPU machine with another python3 (or none) runs the harness too.
  portable_python "$dir/python" || die "cannot copy a Python into $dir"
  # The training benchmark's plans (weights: small tensors and the large ones'
  # headers; the GPU machine draws the large ones) and its scripts.
  mkdir -p "$dir/bench" "$dir/examples" && cp "$ROOT/bench/gpu_train_bench.py" "$ROOT/bench/train_bench.py" \
    "$dir/bench/" && cp "$ROOT/examples/export_models.py" "$dir/examples/" || die "cannot copy the benchmark"
  "$ROOT/.venv/bin/python" "$ROOT/bench/gpu_train_bench.py" --build "$build" \
    --configs "${SD_BUNDLE_BENCH_CONFIGS:-gpt2-small,llama-small}" --precisions "${SD_BENCH_PRECISIONS:-fp32,bf16}" \
    --write-plans "$dir/bench/plans" \
    > "$dir/bench/write-plans.log" 2>&1 || die "benchmark plans failed (see $dir/bench/write-plans.log)"
  echo "gpu-check: bundle in $dir ($(du -sh "$dir" | cut -f1)); on the GPU machine: $dir/gpu-check.sh --run $dir OUT"
}

run_bundle() {
  local dir out=$2 fails=0
  dir=$(cd "$1" && pwd) || die "no bundle at $1"
  mkdir -p "$out" || die "cannot create $out"
  out=$(cd "$out" && pwd)
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia_libraries
  local sdrun="$dir/bin/sdrun" cmp="python3 $dir/gpu_compare.py" summary="$out/summary.txt"
  # SD_GPU_CHECK_DEVICE=cpu: a dry run of the whole script on the CPU (CTest
  # gpu_check_dry_run), so the one command a GPU session gets is known to work.
  local device=${SD_GPU_CHECK_DEVICE:-cuda}
  command -v python3 >/dev/null || die "python3 is needed for the comparisons"
  (nvidia-smi || echo "nvidia-smi not found") > "$out/nvidia-smi.txt" 2>&1
  # SD_GPU_CHECK_DEADLINE=SECONDS: the whole run's time (a lent GPU's
  # minutes): checks that would start later are reported SKIP, timing runs
  # are left out, and none runs past it. time_left: the seconds left.
  local started=$SECONDS
  time_left() { echo $(( ${SD_GPU_CHECK_DEADLINE:-999999} - (SECONDS - started) )); }
  # Each check is stopped after SD_GPU_CHECK_TIMEOUT seconds (check_limit=S
  # before the call: S; a hung kernel fails its check, not the whole run), or
  # at the deadline; its full output goes to checks.log.
  check() { # name, command...
    local name=$1; shift
    local detail status=0 limit=${check_limit:-${SD_GPU_CHECK_TIMEOUT:-300}} left
    left=$(time_left)
    if [ "$left" -le 5 ]; then
      echo "SKIP  $name: not run, past SD_GPU_CHECK_DEADLINE (${SD_GPU_CHECK_DEADLINE:-} s)" >> "$summary"
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    detail=$(timeout "$limit" "$@" 2>&1) || status=$?
    [ $status -eq 124 ] && detail+=$'\n'"timed out after $limit s"
    printf '== %s (exit %d)\n%s\n' "$name" "$status" "$detail" >> "$log"
    if [ $status -eq 0 ]; then echo "PASS  $name: ${detail##*$'\n'}" >> "$summary"
    else echo "FAIL  $name: ${detail##*$'\n'}" >> "$summary"; fails=$((fails + 1)); fi
  }
  # Whether a run with NCCL captured its steps into CUDA graphs (SD_CUDA_GRAPH_DOT=PREFIX
  # wrote some) with no segment left eager (its log, $2). NCCL does no work for an
  # in-place all-reduce over one rank, so a graph holds no NCCL kernel to look for.
  local nccl_graph='n=$(ls "$1"*.dot 2>/dev/null | wc -l); echo "$n graphs captured"; [ "$n" -gt 0 ] &&
    ! grep "runs without a CUDA graph" "$2"'
  # A command whose output also goes to a file (LOG, then the command).
  local tee_to='set -o pipefail; "$@" 2>&1 | tee "$0"'
  local log="$out/checks.log"
  : > "$summary"
  : > "$log"
  echo "libraries: LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$log"
  : > "$out/bench.txt"
  local first why ops_pid="" parts=" ${SD_GPU_CHECK_PARTS:-ops plans sanitizer bench gemms profiles} "
  part() { [[ $parts == *" $1 "* ]]; }
  first=$(ls "$dir"/plans/*.sdp | head -1)
  if ! why=$("$sdrun" bench "$first" --device "$device" --iterations 1 --warmup 0 2>&1); then
    echo "FAIL  a usable GPU: ${why##*$'\n'}" | tee "$summary"
    return 1
  fi
  if part ops && [ -f "$dir/ops/references.pkl" ]; then
    local harness_python=${SD_BUNDLE_PYTHON:-python3}
    [ -z "${SD_BUNDLE_PYTHON:-}" ] && [ -x "$dir/python/run" ] && harness_python=$dir/python/run
    # Beside the plan checks (both check results, neither times anything):
    # its own summary and log, folded into the run's after the plans.
    ( summary="$out/ops-summary.txt" log="$out/ops-checks.log" fails=0
      : > "$summary"; : > "$log"
      check "op harness: every $device kernel against the references" env PYTHONPATH="$dir/ops" \
        "$harness_python" "$dir/ops/op_harness.py" --backend "$device" --references "$dir/ops/references.pkl" \
        --saved-only
      exit $fails ) &
    ops_pid=$!
  fi
  local traced="" plans=()
  # SD_GPU_CHECK_PLANS="full lora ...": only these plan kinds, in this order.
  if [ -n "${SD_GPU_CHECK_PLANS:-}" ]; then
    local k; for k in $SD_GPU_CHECK_PLANS; do plans+=("$dir/plans/$k.sdp"); done
  else plans=("$dir"/plans/*.sdp); fi
  part plans || plans=()
  for plan in "${plans[@]}"; do
    local kind ref w logits_rtol logits_atol loss_rtol weights_atol
    kind=$(basename "$plan" .sdp) ref="$dir/ref/$kind" w="$out/$kind"
    mkdir -p "$w"
    read -r logits_rtol logits_atol loss_rtol weights_atol < "$ref/tolerances" 2>/dev/null ||
      { logits_rtol=$LOGITS_RTOL logits_atol=$LOGITS_ATOL loss_rtol=$LOSS_RTOL weights_atol=$WEIGHTS_ATOL; }
    check "$kind: kernel coverage" "$sdrun" inspect "$plan" --kernels cuda
    # inputs/KIND.NAME.npy: the infer entry's input NAME; data/KIND: a
    # tensor-data plan's training arrays (its own loss) or a preference plan's
    # pairs (a JSON Lines file), else train.jsonl.
    local input name inputs=() data=$dir/train.jsonl
    for input in "$dir/inputs/$kind".*.npy; do
      [ -e "$input" ] || continue # none: the pattern itself
      name=${input#"$dir/inputs/$kind."} name=${name%.npy} inputs+=(--input "$name=$input")
    done
    [ -e "$dir/data/$kind" ] && data=$dir/data/$kind
    if [ -f "$ref/generate.txt" ]; then # a decoding plan: greedy text through the key/value cache
      local prompt prompts=()
      while IFS= read -r prompt; do prompts+=(--prompt "$prompt"); done < "$ref/prompts"
      check "$kind: greedy decoding on $device gives the CPU's text" bash -c '"$@" | cmp - "$0"' "$ref/generate.txt" \
        "$sdrun" generate "$plan" --device "$device" --temperature 0 --max-new-tokens 8 "${prompts[@]}"
    fi
    [ ${#inputs[@]} -gt 0 ] || continue # no infer entry: a decoding plan's prefill and decode only
    check "$kind: infer on $device" "$sdrun" infer "$plan" --device "$device" "${inputs[@]}" \
      --output-dir "$w/infer" --output-format npy
    check "$kind: outputs match the CPU" $cmp logits "$w/infer/output_0.npy" "$ref-infer.npy" "$logits_rtol" "$logits_atol"
    if [ -f "$ref/cpu-ops" ]; then # the session's CPU fallback on a GPU: these ops' steps on host copies
      local cpu_ops; read -r cpu_ops < "$ref/cpu-ops"
      check "$kind: infer on $device with --cpu-ops $cpu_ops" "$sdrun" infer "$plan" --device "$device" "${inputs[@]}" \
        --cpu-ops "$cpu_ops" --output-dir "$w/infer-cpu-ops" --output-format npy
      check "$kind: outputs with --cpu-ops $cpu_ops match the CPU" $cmp logits "$w/infer-cpu-ops/output_0.npy" \
        "$ref-infer.npy" "$logits_rtol" "$logits_atol"
    fi
    # Timed runs replay CUDA graphs; --profile runs eagerly (per-op times), so it is a run of its own.
    [ "$(time_left)" -gt 60 ] && { echo "== $kind infer ($device)"; "$sdrun" bench "$plan" --device "$device" --iterations 50 --warmup 5 2>&1
      echo "== $kind infer per op ($device)"; "$sdrun" bench "$plan" --device "$device" --iterations 20 --warmup 2 \
        --profile 2>&1
      echo "== $kind infer (cpu)"; "$sdrun" bench "$plan" --device cpu --iterations 50 --warmup 5 2>&1; } \
      >> "$out/bench.txt"
    [ -f "$ref/metrics.jsonl" ] || continue # an inference-only plan
    local train=(train "$plan" --data "$data" --steps 20 --lr 1e-3 --weight-decay 0.01 --clip-norm 1.0
                 --no-shuffle --truncate)
    for run in 1 2; do
      check "$kind: train on $device (run $run)" "$sdrun" "${train[@]}" --device "$device" \
        --metrics "$w/metrics$run.jsonl" --save-weights "$w/weights$run.safetensors"
    done
    check "$kind: losses match the CPU" $cmp losses "$w/metrics1.jsonl" "$ref/metrics.jsonl" "$loss_rtol"
    check "$kind: weights match the CPU" $cmp weights "$w/weights1.safetensors" "$ref/weights.safetensors" "$weights_atol"
    check "$kind: two GPU trainings, same losses" $cmp losses "$w/metrics2.jsonl" "$w/metrics1.jsonl" 0
    check "$kind: two GPU trainings, same weights" $cmp same "$w/weights2.safetensors" "$w/weights1.safetensors"
    # Losses read one step behind (the default) against waiting for each
    # step, and graph replay against eager launches: the same bits.
    check "$kind: train with --sync-steps" "$sdrun" "${train[@]}" --device "$device" --sync-steps \
      --metrics "$w/metrics-sync.jsonl" --save-weights "$w/weights-sync.safetensors"
    check "$kind: run ahead = --sync-steps, losses" $cmp losses "$w/metrics-sync.jsonl" "$w/metrics1.jsonl" 0
    check "$kind: run ahead = --sync-steps, weights" $cmp same "$w/weights-sync.safetensors" "$w/weights1.safetensors"
    check "$kind: train eagerly (--no-cuda-graphs)" "$sdrun" "${train[@]}" --device "$device" --no-cuda-graphs \
      --metrics "$w/metrics-eager.jsonl" --save-weights "$w/weights-eager.safetensors"
    check "$kind: graph replay = eager, losses" $cmp losses "$w/metrics-eager.jsonl" "$w/metrics1.jsonl" 0
    check "$kind: graph replay = eager, weights" $cmp same "$w/weights-eager.safetensors" "$w/weights1.safetensors"
    if [ -z "$traced" ]; then # --profile: one trace event per kernel run (3 steps of train_step's kernels)
      traced=$kind
      check "$kind: --profile writes every kernel run" "$sdrun" train "$plan" --device "$device" --data \
        "$data" --steps 3 --truncate --profile "$w/trace.json"
      check "$kind: the trace has 3 steps of train_step's kernels" python3 -c '
import json, re, subprocess, sys
t = json.load(open(sys.argv[1]))
n = sum(e.get("ph") == "X" for e in t["traceEvents"])
per = int(re.search(r"train_step(?: \[[^\]]*\])?: (\d+) steps", subprocess.run([sys.argv[2], "inspect", sys.argv[3]],
          capture_output=True, text=True).stdout).group(1))
device = t["otherData"]["device"]
print(f"{n} events for 3 steps of {per} kernels on {device}")
sys.exit(n != 3 * per)' "$w/trace.json" "$sdrun" "$plan"
    fi
    if [ "$device" = cuda ]; then
      # NCCL with one rank (torchrun-style launch): the CPU's losses, and the
      # training step with its all-reduce calls captured into a graph.
      mkdir -p "$w/nccl"
      check "$kind: NCCL with one rank trains" bash -c "$tee_to" "$w/nccl/log" env WORLD_SIZE=1 RANK=0 \
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
          env SD_CUDNN_SDPA=log "$sdrun" bench "$plan" --device cuda --entry train_step --data "$data" \
          --iterations 1 --warmup 0
        check "$kind: GEMM-path attention (SD_CUDNN_SDPA=0) trains" env SD_CUDNN_SDPA=0 "$sdrun" "${train[@]}" \
          --device cuda --metrics "$w/metrics-gemm.jsonl"
        check "$kind: cuDNN SDPA's losses equal the GEMM path's" $cmp losses "$w/metrics-gemm.jsonl" \
          "$w/metrics1.jsonl" "$loss_rtol" ;;
      esac
    fi
    for graphs in "" --no-cuda-graphs; do
      [ "$(time_left)" -gt 60 ] && { echo "== $kind train_step ($device $graphs)"; "$sdrun" bench "$plan" --device "$device" --entry train_step \
          --data "$data" --iterations 50 --warmup 5 $graphs 2>&1; } >> "$out/bench.txt"
    done
    [ "$(time_left)" -gt 60 ] && { echo "== $kind train_step per op ($device)"; "$sdrun" bench "$plan" --device "$device" --entry train_step \
        --data "$data" --iterations 20 --warmup 2 --profile 2>&1
      echo "== $kind train_step (cpu)"; "$sdrun" bench "$plan" --device cpu --entry train_step \
        --data "$data" --iterations 50 --warmup 5 2>&1; } >> "$out/bench.txt"
  done
  if [ -n "$ops_pid" ]; then
    wait "$ops_pid" || fails=$((fails + 1))
    cat "$out/ops-summary.txt" >> "$summary" && cat "$out/ops-checks.log" >> "$log" &&
      rm -f "$out/ops-summary.txt" "$out/ops-checks.log"
  fi
  # compute-sanitizer (the machine's, else the bundle's): memcheck over two
  # eager training steps of every training plan, racecheck over one.
  command -v compute-sanitizer > /dev/null || [ ! -x "$dir/sanitizer/bin/compute-sanitizer" ] ||
    PATH=$PATH:$dir/sanitizer/bin
  if ! part sanitizer || [ "$device" != cuda ]; then :
  elif ! command -v compute-sanitizer > /dev/null; then
    echo "SKIP  compute-sanitizer: not on this machine's PATH nor in the bundle" >> "$summary"
  else
    echo "compute-sanitizer: $(command -v compute-sanitizer)" >> "$log"
    # SD_GPU_SANITIZER_PLANS="lora-bf16 ...": only these plan kinds (each
    # run under a sanitizer takes tens of seconds), else every training plan.
    local tool kind tools="memcheck racecheck" checked=()
    if [ -n "${SD_GPU_SANITIZER_PLANS:-}" ]; then
      for kind in $SD_GPU_SANITIZER_PLANS; do checked+=("$dir/plans/$kind.sdp"); done
    else checked=("$dir"/plans/*.sdp); fi
    for plan in "${checked[@]}"; do
      kind=$(basename "$plan" .sdp)
      if [ ! -f "$plan" ]; then check "compute-sanitizer: plan kind $kind is in the bundle" false; continue; fi
      [ -f "$dir/ref/$kind/metrics.jsonl" ] || continue
      local data=$dir/train.jsonl
      [ -e "$dir/data/$kind" ] && data=$dir/data/$kind
      for tool in $tools; do
        check "$kind: compute-sanitizer $tool, 2 eager steps" compute-sanitizer --tool "$tool" --error-exitcode 3 \
          "$sdrun" train "$plan" --device cuda --data "$data" --steps 2 --truncate --no-cuda-graphs
      done
      tools=memcheck # racecheck on the first training plan only
    done
  fi
  # The training benchmark against PyTorch, where this machine's python3 has it.
  # SD_BENCH_PYTHON (python3) runs it; SD_GPU_BENCH_PEERS picks the PyTorch peers.
  local bench_python=${SD_BENCH_PYTHON:-python3}
  if ! part bench; then :
  elif [ -f "$dir/bench/plans/manifest.json" ] && "$bench_python" -c 'import torch, peft, transformers' 2>/dev/null; then
    local configs
    configs=$(python3 -c 'import json, sys; print(",".join(json.load(open(sys.argv[1]))))' "$dir/bench/plans/manifest.json")
    check_limit=${SD_GPU_BENCH_TIMEOUT:-900} check "training benchmark against PyTorch ($configs)" bash -c "$tee_to" \
      "$out/train_bench.txt" "$bench_python" "$dir/bench/gpu_train_bench.py" \
      --device "$device" --configs "$configs" --plans "$dir/bench/plans" --sdrun "$sdrun" --iterations 10 --warmup 3 \
      --peers "${SD_GPU_BENCH_PEERS:-eager,compiled}" --precisions "${SD_BENCH_PRECISIONS:-fp32,bf16}" \
      $(part profiles && echo --torch-profile "$out")
  else
    echo "gpu-check: no PyTorch with PEFT and transformers in $bench_python here: the training benchmark did not run" |
      tee -a "$log"
  fi
  # On the benchmark plans (their weights drawn by the training benchmark
  # above): our GEMMs against raw cuBLASLt's best algorithm on their shapes,
  # and where a training step's time goes, per op (eager launches).
  if { part gemms && [ "$device" = cuda ]; } || part profiles; then
    local gplan name
    for gplan in "$dir"/bench/plans/*.sdp; do
      [ -f "$gplan" ] || continue
      name=$(basename "$gplan" .sdp)
      if [ ! -f "${gplan%.sdp}.safetensors" ]; then
        echo "gpu-check: $name has no weights (the training benchmark draws them): no GEMM comparison or profile" |
          tee -a "$log"
        continue
      fi
      if part gemms && [ "$device" = cuda ]; then
        check "$name: GEMMs against raw cuBLASLt" bash -c "$tee_to" "$out/gemm-$name.txt" \
          "$sdrun" bench "$gplan" --entry train_step --gemms --tune "$out/gemm-tuning.tsv"
      fi
      if part profiles; then
        check "$name: train_step per op" bash -c "$tee_to" "$out/profile-$name.txt" "$sdrun" bench "$gplan" \
          --device "$device" --entry train_step --data "$dir/bench/plans/${name%-*-*}.jsonl" --iterations 3 \
          --warmup 1 --profile
      fi
    done
  fi
  # The GEMM tuning file the comparisons wrote (each shape's fastest
  # algorithm): the GEMMs again with it, and each training step timed with
  # and without it in the same run.
  if part gemms && [ "$device" = cuda ] && [ -s "$out/gemm-tuning.tsv" ]; then
    local tplan tname
    for tplan in "$dir"/bench/plans/*.sdp; do
      [ -f "${tplan%.sdp}.safetensors" ] || continue
      tname=$(basename "$tplan" .sdp)
      check "$tname: GEMMs with the tuning file" bash -c "$tee_to" "$out/gemm-tuned-$tname.txt" \
        env SD_GEMM_TUNING="$out/gemm-tuning.tsv" "$sdrun" bench "$tplan" --entry train_step --gemms
      check "$tname: train_step, heuristic GEMMs" bash -c "$tee_to" "$out/step-untuned-$tname.txt" "$sdrun" bench \
        "$tplan" --device cuda --entry train_step --data "$dir/bench/plans/${tname%-*-*}.jsonl" --iterations 20
      check "$tname: train_step, tuned GEMMs" bash -c "$tee_to" "$out/step-tuned-$tname.txt" \
        env SD_GEMM_TUNING="$out/gemm-tuning.tsv" "$sdrun" bench "$tplan" --device cuda --entry train_step \
        --data "$dir/bench/plans/${tname%-*-*}.jsonl" --iterations 20
    done
  fi
  cat "$summary"
  local skipped
  skipped=$(grep -c '^SKIP' "$summary")
  echo "gpu-check: $(grep -c '^PASS' "$summary") passed, $fails failed, $skipped skipped; results in $out"
  [ "$fails" -eq 0 ] && [ "$skipped" -eq 0 ]
}

case ${1:-} in
  -h|--help) sed -n '2,/^[^#]/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  --bundle)
    [ $# -eq 2 ] || { [ $# -eq 3 ] && [ "$3" = --pack ]; } || die "usage: gpu-check.sh --bundle DIR [--pack]"
    bundle "$2" || exit
    if [ $# -eq 3 ]; then
      dir=$(cd "$2" && pwd)
      tar -C "$(dirname "$dir")" -cf - "$(basename "$dir")" | xz -T0 -9 > "$dir.tar.xz.part" &&
        mv "$dir.tar.xz.part" "$dir.tar.xz" || { rm -f "$dir.tar.xz.part"; die "cannot write $dir.tar.xz"; }
      echo "gpu-check: packed into $dir.tar.xz ($(du -h "$dir.tar.xz" | cut -f1))"
    fi ;;
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
    # The bundle's checks, the training benchmark with the project's PyTorch.
    SD_BENCH_PYTHON=${SD_BENCH_PYTHON:-$ROOT/.venv/bin/python} run_bundle "$out/bundle" "$out"
    checks=$?
    [ $tests -eq 0 ] && [ $checks -eq 0 ]
    ;;
esac
