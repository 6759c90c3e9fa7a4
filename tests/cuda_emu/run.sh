#!/usr/bin/env bash
# Compiles kernels/gaussian.cu (the module source NVRTC compiles, with the launcher's
# #defines: examples/kernel_source.rs) with the host C++ compiler against the CUDA emulation
# in emu.cuh and runs every kernel against an f64 reference (no GPU needed):
# catches indexing, reduction, split and synchronisation-order mistakes in the
# kernel source itself. f32 and f64. Last line: "N passed, M failed".
set -euo pipefail
# shellcheck source=../common/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
BUILD="$(build_dir FK_EMU_BUILD_DIR target/cuda-emu)"
cp "$HERE/emu.cuh" "$BUILD/common.cuh"
(cd "$ROOT" && cargo build --release -q --example kernel_source)
passed=0
failed=0
for dt in f32 f64; do
  mkdir -p "$BUILD/$dt"
  "$ROOT/target/release/examples/kernel_source" "gaussian_$dt" > "$BUILD/$dt/gaussian.cu"
  "${CXX:-g++}" -std=c++20 -O1 -pthread -I"$BUILD/$dt" -I"$BUILD" -DFK_GS_$dt "$HERE/gaussian_emu.cpp" -o "$BUILD/gaussian_emu_$dt"
  echo "== gaussian kernels ($dt), emulated"
  if "$BUILD/gaussian_emu_$dt"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
