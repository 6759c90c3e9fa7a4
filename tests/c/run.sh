#!/usr/bin/env bash
# Builds (gcc/g++) and runs fusekit's C-side checks against the built library:
#   1. include/fusekit.h compiles alone as C99 and as C++17 (syntax, and a link of
#      one call from each language);
#   2. tests/c/test_fusekit.c (the C ABI conformance test);
#   2b. the same test_fusekit binary (cpu device) under valgrind's leak checker:
#      any definitely or indirectly lost block, or any other memcheck error (invalid
#      read/write, use of uninitialised memory, bad free), fails the step. "Possibly
#      lost" and "still reachable" blocks are not counted: on the current code they
#      are all the global rayon pool (its worker threads still run at exit: their
#      glibc TLS blocks show as possibly lost) and once-built tables such as
#      fk_status_string's names, so no suppression file is needed. A handle the test
#      forgets to destroy, or one the library fails to free, is definitely lost
#      (a handle still held in a global at exit, like the test's g_ctx, would only
#      be "still reachable": the test destroys it before returning).
#      About 2 s; skipped with FK_SKIP_LEAK_CHECK=1, and when FK_TEST_DEVICE is cuda
#      or auto (the GPU suite runs compute-sanitizer --leak-check full instead).
#      valgrind is installed with apt-get when missing (as root), else the step fails.
#      On a machine with the NVIDIA driver, even the cpu run loads libcuda (the
#      test's fk_device_count) and valgrind sees the driver's allocations too: if
#      they show up there, set FK_SKIP_LEAK_CHECK=1;
#   3. every examples/*.c program;
#   4. the C++ wrapper test (bindings/cpp/run.sh).
#
#   cargo build --release && tests/c/run.sh
#   FK_TEST_DEVICE=cuda tests/c/run.sh           # cpu (default), cuda or auto
#   FUSEKIT_LIB_DIR=target/debug tests/c/run.sh  # another build of the library
#   FK_SKIP_LEAK_CHECK=1 tests/c/run.sh          # without the valgrind step (2b)
#
# Binaries go to ${FK_C_BUILD_DIR:-target/c-tests}; the library is found through
# an rpath (and LD_LIBRARY_PATH). Exits non-zero when any step fails; the last
# line is "run.sh: N passed, M failed" (one count per step).
set -uo pipefail

# shellcheck source=../common/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
LIB_DIR="${FUSEKIT_LIB_DIR:-$ROOT/target/release}"
LIB_DIR="$(cd "$LIB_DIR" 2>/dev/null && pwd || echo "$LIB_DIR")"
export FK_C_BUILD_DIR="${FK_C_BUILD_DIR:-$ROOT/target/c-tests}"
BUILD_DIR="$FK_C_BUILD_DIR"
CC="${CC:-gcc}"
CXX="${CXX:-g++}"
export FK_TEST_DEVICE="${FK_TEST_DEVICE:-cpu}"
export FUSEKIT_LIB_DIR="$LIB_DIR"
export LD_LIBRARY_PATH="$LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ ! -e "$LIB_DIR/libfusekit.so" ]]; then
    echo "tests/c/run.sh: $LIB_DIR/libfusekit.so not found (run 'cargo build --release' or set FUSEKIT_LIB_DIR)" >&2
    exit 2
fi
mkdir -p "$BUILD_DIR"
echo "# library: $LIB_DIR/libfusekit.so, device: $FK_TEST_DEVICE, build dir: $BUILD_DIR"

# shellcheck source=../common/steps.sh
source "$HERE/../common/steps.sh"

LINK=(-L"$LIB_DIR" -lfusekit -Wl,-rpath,"$LIB_DIR")
CWARN=(-std=c99 -Wall -Wextra -Werror -pedantic)

# --- 1. the header alone, from C99 and C++17
header_c99() {
    "$CC" -std=c99 -pedantic -Werror -Wall -Wextra -fsyntax-only -x c "$ROOT/include/fusekit.h" &&
        printf '#include "fusekit.h"\n#include <stdio.h>\nint main(void) { puts(fk_version_string()); return fk_abi_version() == FK_ABI_VERSION ? 0 : 1; }\n' \
            >"$BUILD_DIR/header_c99.c" &&
        "$CC" "${CWARN[@]}" -I"$ROOT/include" "$BUILD_DIR/header_c99.c" -o "$BUILD_DIR/header_c99" "${LINK[@]}" &&
        "$BUILD_DIR/header_c99"
}
header_cxx() {
    "$CXX" -std=c++17 -pedantic -Werror -Wall -Wextra -fsyntax-only -x c++ "$ROOT/include/fusekit.h" &&
        printf '#include "fusekit.h"\n#include <cstdio>\nint main() { std::puts(fk_status_string(FK_ERROR_ALIASING)); fk_context* c = nullptr; fk_status s = fk_context_create(FK_ABI_VERSION, FK_DEVICE_CPU, 0, &c); fk_context_destroy(c); return s; }\n' \
            >"$BUILD_DIR/header_cxx.cpp" &&
        "$CXX" -std=c++17 -Wall -Wextra -Werror -pedantic -I"$ROOT/include" "$BUILD_DIR/header_cxx.cpp" -o "$BUILD_DIR/header_cxx" "${LINK[@]}" &&
        "$BUILD_DIR/header_cxx"
}
step "fusekit.h compiles as C99 (-std=c99 -pedantic -Werror) and links" header_c99
step "fusekit.h compiles as C++17 (g++ -std=c++17 -x c++) and links" header_cxx

# --- 2. the C ABI test
c_test() {
    rm -f "$BUILD_DIR/test_fusekit" # a failed build must not leave step 2b an old binary
    "$CC" "${CWARN[@]}" -O1 -I"$ROOT/include" "$HERE/test_fusekit.c" -o "$BUILD_DIR/test_fusekit" "${LINK[@]}" -lm &&
        "$BUILD_DIR/test_fusekit" "$FK_TEST_DEVICE"
}
step "tests/c/test_fusekit.c ($FK_TEST_DEVICE)" c_test

# --- 2b. the C ABI test (cpu) under valgrind: leaks and memory errors fail it
leak_check() {
    local log="$BUILD_DIR/test_fusekit.valgrind.log" rc
    if ! command -v valgrind >/dev/null 2>&1; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            echo "installing valgrind (apt-get)"
            { apt-get update -qq && apt-get install -y -qq valgrind >/dev/null; } || return 1
        else
            echo "valgrind not found: install it (apt-get install valgrind) or set FK_SKIP_LEAK_CHECK=1" >&2
            return 1
        fi
    fi
    if [[ ! -x "$BUILD_DIR/test_fusekit" ]]; then
        echo "$BUILD_DIR/test_fusekit was not built (step 2 failed)" >&2
        return 1
    fi
    # the test's own lines go to $log; valgrind's reports (stderr) are shown
    valgrind --quiet --error-exitcode=99 --leak-check=full \
        --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \
        --num-callers=40 "$BUILD_DIR/test_fusekit" cpu >"$log"
    rc=$?
    tail -n 1 "$log"
    case $rc in
    0) return 0 ;;
    99) echo "valgrind: leaks or memory errors above (test output: $log)" >&2 ;;
    *) echo "test_fusekit failed under valgrind (exit $rc; output: $log)" >&2 ;;
    esac
    return 1
}
leak_name="valgrind leak check: tests/c/test_fusekit.c (cpu)"
if [[ -n "${FK_SKIP_LEAK_CHECK:-}" && "$FK_SKIP_LEAK_CHECK" != 0 ]]; then
    echo "== $leak_name: skipped (FK_SKIP_LEAK_CHECK=$FK_SKIP_LEAK_CHECK)"
elif [[ "$FK_TEST_DEVICE" != cpu ]]; then
    echo "== $leak_name: skipped (FK_TEST_DEVICE=$FK_TEST_DEVICE: it runs with cpu only; on CUDA the GPU suite runs compute-sanitizer --leak-check full)"
else
    step "$leak_name" leak_check
fi

# --- 3. the examples (they pick the device themselves: FK_DEVICE_AUTO)
example() {
    local src="$1" exe
    exe="$BUILD_DIR/example_$(basename "$src" .c)"
    # run inside the build dir: files an example writes (gaussian_fit.png) land there
    "$CC" "${CWARN[@]}" -O2 -I"$ROOT/include" "$src" -o "$exe" "${LINK[@]}" -lm && (cd "$BUILD_DIR" && "$exe")
}
for src in "$ROOT"/examples/*.c; do
    [[ -e "$src" ]] || continue
    step "examples/$(basename "$src")" example "$src"
done

# --- 4. the C++ wrapper
step "bindings/cpp (C++17 RAII wrapper test)" bash "$ROOT/bindings/cpp/run.sh"

steps_summary run.sh
