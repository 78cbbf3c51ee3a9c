#!/usr/bin/env bash
# Installs every Debian package sdc needs to build and test. Idempotent: already
# installed packages are skipped, and apt is only refreshed when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  clang-19 libclang-rt-19-dev
  libonnx-dev libonnx-testdata python3-onnx python3-numpy
  libprotobuf-dev protobuf-compiler
  libflatbuffers-dev flatbuffers-compiler
  libopenblas-dev liblapacke-dev
  libgtest-dev libgmock-dev
  python3-torch libopenblas0-pthread
  bible-kjv fortune-mod fortunes-min
  zlib1g-dev libzstd-dev libedit-dev libxml2-dev libcurl4-openssl-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js and npm: use the machine's when present (it may not be Debian's).
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# ONNX Runtime (CPU) from npm: the reference and the peer for benchmarks. The
# skip flag keeps the package's install script from downloading GPU binaries.
cd "$(dirname "$0")/../bench"
if [ ! -d node_modules/onnxruntime-node ]; then
  echo "install-deps: installing onnxruntime-node (npm)"
  ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --silent
fi
echo "install-deps: done"
