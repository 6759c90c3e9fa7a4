#!/usr/bin/env bash
# Builds and runs the C++ wrapper test (bindings/cpp/tests/test_fusekit.cpp).
#
#   bindings/cpp/run.sh                     # CPU, library from target/release
#   FK_TEST_DEVICE=cuda bindings/cpp/run.sh
#   FUSEKIT_LIB_DIR=/path/to/lib bindings/cpp/run.sh
#
# Exits non-zero when the build or a check fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
LIB_DIR="${FUSEKIT_LIB_DIR:-$ROOT/target/release}"
BUILD_DIR="${FK_C_BUILD_DIR:-$ROOT/target/c-tests}"
CXX="${CXX:-g++}"
DEVICE="${FK_TEST_DEVICE:-cpu}"

if [[ ! -e "$LIB_DIR/libfusekit.so" ]]; then
    echo "bindings/cpp/run.sh: $LIB_DIR/libfusekit.so not found (run 'cargo build --release' or set FUSEKIT_LIB_DIR)" >&2
    exit 2
fi
mkdir -p "$BUILD_DIR"

echo "== build bindings/cpp/tests/test_fusekit.cpp (C++17)"
"$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -O1 \
    -I"$ROOT/include" -I"$HERE" \
    "$HERE/tests/test_fusekit.cpp" -o "$BUILD_DIR/test_fusekit_cpp" \
    -L"$LIB_DIR" -lfusekit -Wl,-rpath,"$LIB_DIR"

echo "== run test_fusekit_cpp ($DEVICE)"
"$BUILD_DIR/test_fusekit_cpp" "$DEVICE"
