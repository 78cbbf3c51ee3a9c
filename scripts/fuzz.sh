#!/usr/bin/env bash
# Builds the libFuzzer targets with clang-19 (ASan + UBSan) in build-fuzz/ and
# runs them. Seeds are plans and models compiled from the test inputs.
#   scripts/fuzz.sh                          all targets, 10 minutes each
#   scripts/fuzz.sh --target plan_loader --seconds 60 --no-compiler --seed 1
#   scripts/fuzz.sh --target readers --seconds 15 --no-compiler    the five file readers
# (--seed makes the mutation sequence repeatable, as CTest's smoke run uses.)
# Findings (crash-*, leak-*, timeout-*) land in build-fuzz/findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
READERS="tensor_file safetensors adapter_config checkpoint_manifest jsonl tokenizer chat_template serve_request json_schema"
TARGETS="plan_loader onnx_importer $READERS"
SECONDS_PER_TARGET=600
WITH_COMPILER=ON
SEED_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) SEED_ARGS=(-seed="$2"); shift 2 ;;
    --target) TARGETS="${2/readers/$READERS}"; shift 2 ;;
    --seconds) SECONDS_PER_TARGET="$2"; shift 2 ;;
    --no-compiler) WITH_COMPILER=OFF; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
MAIN_BUILD=${BUILD_DIR:-build}
if [ ! -f "$FUZZ_DIR/build.ninja" ] || ! grep -q "SD_BUILD_COMPILER:BOOL=$WITH_COMPILER" "$FUZZ_DIR/CMakeCache.txt"; then
  CC=clang-19 CXX=clang++-19 cmake -G Ninja -B "$FUZZ_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSD_FUZZ=ON -DSD_BUILD_TESTS=OFF -DSD_BUILD_PYTHON=OFF -DSD_BUILD_COMPILER=$WITH_COMPILER >/dev/null
fi
targets=()
for t in $TARGETS; do targets+=("${t}_fuzzer"); done
ninja -C "$FUZZ_DIR" "${targets[@]}"

# Seed corpora: small plans and models from the test suite.
mkdir -p "$FUZZ_DIR/corpus/plan_loader" "$FUZZ_DIR/corpus/onnx_importer" "$FUZZ_DIR/findings"
for t in $READERS; do
  mkdir -p "$FUZZ_DIR/corpus/$t"
  cp test/fuzz/seeds/$t/* "$FUZZ_DIR/corpus/$t/"
  cp test/fuzz/regressions/$t-* "$FUZZ_DIR/corpus/$t/" 2>/dev/null || true
done
if [ -x "$MAIN_BUILD/tools/sdc" ]; then
  for m in test/lit/import/*.onnxtxt; do
    "$MAIN_BUILD/tools/sdc" compile "$m" -o "$FUZZ_DIR/corpus/plan_loader/$(basename "$m" .onnxtxt).sdp" \
      --dim batch=2 >/dev/null 2>&1 || true
    cp "$m" "$FUZZ_DIR/corpus/onnx_importer/" || true
  done
fi
# Inputs that once crashed a target are replayed by every run.
cp test/fuzz/regressions/plan-loader-* "$FUZZ_DIR/corpus/plan_loader/" 2>/dev/null || true
cp test/fuzz/regressions/importer-* "$FUZZ_DIR/corpus/onnx_importer/" 2>/dev/null || true
cp test/fuzz/seeds/onnx_importer/* "$FUZZ_DIR/corpus/onnx_importer/"
for d in /usr/share/libonnx-testdata/data/node/test_{add,relu,matmul_2d,gather_0,softmax_axis_1,reshape_reduced_dims}; do
  [ -f "$d/model.onnx" ] && cp "$d/model.onnx" "$FUZZ_DIR/corpus/onnx_importer/$(basename "$d").onnx"
done

status=0
for t in $TARGETS; do
  echo "fuzz.sh: running ${t}_fuzzer for ${SECONDS_PER_TARGET}s"
  log="$FUZZ_DIR/${t}.log"
  if ! ASAN_OPTIONS=detect_leaks=0 "$FUZZ_DIR/test/fuzz/${t}_fuzzer" -max_total_time="$SECONDS_PER_TARGET" \
      -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$FUZZ_DIR/findings/${t}-" "${SEED_ARGS[@]}" \
      "$FUZZ_DIR/corpus/$t" >"$log" 2>&1; then
    echo "fuzz.sh: ${t}_fuzzer FOUND A PROBLEM (see $log and $FUZZ_DIR/findings)"
    tail -30 "$log"
    status=1
  else
    grep -E "^#[0-9]+.*(DONE|pulse)" "$log" | tail -1 || true
    echo "fuzz.sh: ${t}_fuzzer ran ${SECONDS_PER_TARGET}s without findings"
  fi
done
exit $status
