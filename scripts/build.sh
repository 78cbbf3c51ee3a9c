#!/usr/bin/env bash
# Configures and builds sdc, sdrun, sd-opt and the tests into ./build (Ninja + ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -G Ninja -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD_DIR" -j "$JOBS"
