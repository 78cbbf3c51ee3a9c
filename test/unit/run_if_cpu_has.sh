#!/bin/sh
# Runs a test binary when this CPU has instruction set $1, else exits 77
# (CTest: skipped). "generic" is every CPU.
isa=$1; shift
case $isa in
  avx512) grep -qw avx512f /proc/cpuinfo || { echo "skipped: this CPU has no AVX-512F"; exit 77; } ;;
  avx2) grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo || { echo "skipped: this CPU has no AVX2+FMA"; exit 77; } ;;
esac
exec "$@"
