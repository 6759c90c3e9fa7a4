#!/usr/bin/env bash
# Builds and runs the geodesic kernels on the CPU emulator (no GPU needed):
# kernels/geodesic.cu compiled as C++ (tests/emu/gen_modules.py), every CUDA thread a
# coroutine with randomised scheduling at barriers (tests/emu/emu.h), against an f64
# reference of the formulas, fast and generic kernels, f32 and f64.
#   bash tests/emu/run.sh [--quick]
# Needs g++ (C++17) and python3. Build output in ${FK_EMU_BUILD:-target/emu}.
set -euo pipefail
# shellcheck source=../common/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
B="$(build_dir FK_EMU_BUILD target/emu)"
python3 "$HERE/gen_modules.py" "$B/gen"
CXX="${CXX:-g++}"
FLAGS=(-std=c++17 -O1 -g -I"$HERE" -Wno-unused-variable -Wno-unused-but-set-variable)
objs=()
for src in "$HERE/emu.cpp" "$HERE/main.cpp" "$B"/gen/*.cpp; do
  obj="$B/$(basename "$src" .cpp).o"
  if [[ ! -e "$obj" || "$src" -nt "$obj" || "$HERE/emu.h" -nt "$obj" ]]; then
    "$CXX" "${FLAGS[@]}" -c "$src" -o "$obj" &
  fi
  objs+=("$obj")
done
wait
"$CXX" "${objs[@]}" -o "$B/geo_emu"
"$B/geo_emu" "$@"
