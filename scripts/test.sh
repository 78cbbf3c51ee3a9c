#!/usr/bin/env bash
# Runs every test suite through CTest: lit/FileCheck, GoogleTest units, ONNX
# conformance (regressions fail), CLI bad-input checks and a one-minute fuzz
# run of the plan loader.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
