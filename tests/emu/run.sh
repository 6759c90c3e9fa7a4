#!/usr/bin/env bash
# Builds and runs the geodesic kernels on the CPU emulator (no GPU needed):
# every geodesic module's source compiled as C++ (tests/emu/gen_modules.py), every CUDA thread a
# coroutine with randomised scheduling at barriers (tests/emu/emu.h), against an f64
# reference of the formulas, fast and generic kernels, f32 and f64.
#   bash tests/emu/run.sh [--quick]
# Needs g++ (C++17) and python3. Build output in ${FK_EMU_BUILD:-target/emu}.
set -euo pipefail
# shellcheck source=../common/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
B="$(build_dir FK_EMU_BUILD target/emu)"
(cd "$ROOT" && cargo build --release -q --example kernel_source)
python3 "$HERE/gen_modules.py" "$ROOT/target/release/examples/kernel_source" "$B/gen"
CXX="${CXX:-g++}"
FLAGS=(-std=c++17 -O1 -g -I"$HERE" -I"$B/gen" -Wno-unused-variable -Wno-unused-but-set-variable)
objs=()
stale=()
for src in "$HERE/emu.cpp" "$HERE/main.cpp" "$B"/gen/*.cpp; do
  obj="$B/$(basename "$src" .cpp).o"
  if [[ ! -e "$obj" || "$src" -nt "$obj" || "$HERE/emu.h" -nt "$obj" || "$B/gen/args.h" -nt "$obj" ]]; then
    stale+=("$src")
  fi
  objs+=("$obj")
done
# one compiler per core (a module's translation unit takes up to a GB)
if [[ ${#stale[@]} -gt 0 ]]; then
  printf '%s\n' "${stale[@]}" | OUT="$B" xargs -P "$(nproc)" -n 1 \
    bash -c 'src=${!#}; exec "${@:1:$#-1}" -c "$src" -o "$OUT/$(basename "$src" .cpp).o"' _ "$CXX" "${FLAGS[@]}"
fi
"$CXX" "${objs[@]}" -o "$B/geo_emu"
"$B/geo_emu" "$@"
