#!/usr/bin/env bash
# The layering the architecture promises, checked on the sources and binaries:
#   format/   includes nothing of ours but sd/format/ (and its generated schema)
#   kernels/  includes no runtime, compiler or tool header
#   runtime/  includes no compiler header and sdrun loads no MLIR/LLVM
#   sdrun     holds no CUDA code: the backend is the plugin libsdcuda.so
#   sdc       holds no runtime Session or Plan (the compiler links format pieces only)
# Usage: check_layering.sh SOURCE_DIR SDRUN [SDC]
set -uo pipefail
src=$1 sdrun=$2 sdc=${3:-}
fail=0
bad() { echo "layering: $*" >&2; fail=1; }

ours_outside() { # dir, allowed include prefix regex
  grep -rnE '^#include "' "$1" | grep -vE "#include \"($2)" || true
}
hits=$(ours_outside "$src/format" 'sd/format/|plan_generated.h')
[ -z "$hits" ] || bad "format/ includes something of ours outside format/:"$'\n'"$hits"
hits=$(grep -rnE '#include "sd/(runtime|train|generate|c)/|#include "(mlir|llvm)/' "$src/kernels" || true)
[ -z "$hits" ] || bad "kernels/ includes runtime or MLIR headers:"$'\n'"$hits"
hits=$(grep -rnE '#include "(mlir|llvm)/|#include "(Pipeline|Driver|PassDetail)\.h"' "$src/runtime" || true)
[ -z "$hits" ] || bad "runtime/ includes compiler headers:"$'\n'"$hits"
if ldd "$sdrun" | grep -iE 'libMLIR|libLLVM'; then bad "sdrun loads MLIR/LLVM"; fi
syms=$(nm "$sdrun" | grep -E ' [TtWw] (cudaMalloc|cudaLaunchKernel|__cudaRegisterFatBinary)\b' | head -3)
[ -z "$syms" ] || bad "sdrun links CUDA code (it belongs in libsdcuda.so):"$'\n'"$syms"
if [ -n "$sdc" ]; then
  syms=$(nm -C "$sdc" | grep -E ' sd::(Session|Plan)::' | head -3)
  [ -z "$syms" ] || bad "sdc links the runtime:"$'\n'"$syms"
fi
[ $fail = 0 ] && echo "layering: format < kernels < runtime, compiler without runtime, sdrun without MLIR or CUDA: ok"
exit $fail
