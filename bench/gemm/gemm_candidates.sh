#!/bin/bash
# Builds gemm_candidates.cc once per GEMM candidate (OpenBLAS, BLIS, libxsmm,
# oneDNN, sdc's own kernels unpacked and with B packed) and runs each on one
# thread: tab-separated candidate, shape, m,n,k,layout, GFLOP/s, max error.
# Needs libdnnl-dev, libxsmm-dev, libblis-dev (scripts/install-deps.sh)
# libxsmm forwards products above its small-GEMM threshold to the BLAS it is
# linked with (OpenBLAS here). Also needs a build of sdc in ${BUILD:-build}. OPENBLAS_CORETYPE=Prescott in the
# environment reproduces OpenBLAS on a CPU model it does not know.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$root/build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cxx="g++ -O2 -std=c++17 -o"
src=$here/gemm_candidates.cc
$cxx "$out/openblas" -DUSE_OPENBLAS "$src" -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas
$cxx "$out/blis" -DUSE_BLIS "$src" -I/usr/include/x86_64-linux-gnu/blis-pthread \
  -L/usr/lib/x86_64-linux-gnu/blis-pthread -Wl,-rpath,/usr/lib/x86_64-linux-gnu/blis-pthread -lblis -lpthread
$cxx "$out/libxsmm" -DUSE_XSMM "$src" -I/usr/include/x86_64-linux-gnu/openblas-pthread -L/usr/lib -lxsmm -lopenblas -lpthread -ldl -lm
$cxx "$out/onednn" -DUSE_DNNL "$src" -ldnnl
for v in SD SD_PACKED; do
  $cxx "$out/$v" -DUSE_$v "$src" -I"$root/kernels/include" "$build/kernels/libsdkernels.a" -lopenblas -lpthread
done
echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), sdc sgemm ISA: ${SD_CPU_ISA:-best}, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-auto}"
for c in openblas blis libxsmm onednn SD SD_PACKED; do
  OMP_NUM_THREADS=1 BLIS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$out/$c"
done
