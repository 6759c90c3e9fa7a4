#!/usr/bin/env bash
# Installs fusekit into a fresh temporary prefix (scripts/install.sh) and uses it the
# way C and C++ projects do:
#   1. the install itself, and its layout (SONAME links, versions in fusekit.pc and
#      the CMake version file = Cargo.toml's);
#   2. app.c built with `cc $(pkg-config --cflags --libs fusekit)`, run with no
#      LD_LIBRARY_PATH (rpath from `pkg-config --variable=libdir fusekit`);
#   3. app.c linked statically against libfusekit.a (`pkg-config --static --libs`);
#   4. app.cpp (fusekit.hpp) built by CMake with find_package(fusekit CONFIG),
#      against fusekit::fusekit and fusekit::static; both run;
#   5. the prefix moved elsewhere: the CMake package still resolves (relocatable).
#
#   tests/install/run.sh              # cargo build --release first
#   tests/install/run.sh --no-build   # the existing target/release build (also FUSEKIT_NO_BUILD=1)
#   FK_INSTALL_KEEP=1 ...             # keep the temporary folder (printed)
#
# Installs cmake and pkg-config with apt-get when missing. The last line is
# "install: N passed, M failed"; exits non-zero when a step fails.
set -uo pipefail

# shellcheck source=../common/paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/paths.sh"
CC="${CC:-cc}"
CXX="${CXX:-c++}"
build_flag=()
[[ "${FUSEKIT_NO_BUILD:-0}" == 1 ]] && build_flag=(--no-build)
for arg in "$@"; do
    case "$arg" in
        --no-build) build_flag=(--no-build) ;;
        *) echo "tests/install/run.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done

need() { command -v "$1" >/dev/null 2>&1; }
missing=()
need cmake || missing+=(cmake)
need pkg-config || missing+=(pkg-config)
need "$CC" && need "$CXX" || missing+=(build-essential)
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing ${missing[*]} (apt-get)"
    if [[ $(id -u) -eq 0 ]] && need apt-get; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
            { echo "tests/install/run.sh: apt-get install ${missing[*]} failed" >&2; exit 2; }
    else
        echo "tests/install/run.sh: need ${missing[*]} (not root or no apt-get: install them)" >&2
        exit 2
    fi
fi

version="$(awk '/^\[/ { p = ($0 == "[package]") } p && /^version[ \t]*=/ { sub(/^[^"]*"/, ""); sub(/".*$/, ""); print; exit }' "$ROOT/Cargo.toml")"
major="${version%%.*}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fusekit-install.XXXXXX")"
if [[ "${FK_INSTALL_KEEP:-0}" == 1 ]]; then
    echo "# keeping $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi
PREFIX="$WORK/prefix"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
unset PKG_CONFIG_LIBDIR
echo "# fusekit $version, prefix $PREFIX"

# shellcheck source=../common/steps.sh
source "$HERE/../common/steps.sh"
# the programs run with no LD_LIBRARY_PATH: they find the library on their own
run_clean() { env -u LD_LIBRARY_PATH "$@"; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p'; }

# --- 1. install, layout
install_prefix() {
    bash "$ROOT/scripts/install.sh" "${build_flag[@]}" "$PREFIX"
}
layout() {
    local ok=0 f
    for f in lib/libfusekit.so.$version lib/libfusekit.a include/fusekit.h include/fusekit.hpp \
        lib/pkgconfig/fusekit.pc lib/cmake/fusekit/fusekitConfig.cmake lib/cmake/fusekit/fusekitConfigVersion.cmake; do
        [[ -f "$PREFIX/$f" ]] || { echo "missing $f"; ok=1; }
    done
    [[ "$(readlink "$PREFIX/lib/libfusekit.so.$major")" == "libfusekit.so.$version" ]] || { echo "libfusekit.so.$major is not a link to libfusekit.so.$version"; ok=1; }
    [[ "$(readlink "$PREFIX/lib/libfusekit.so")" == "libfusekit.so.$major" ]] || { echo "libfusekit.so is not a link to libfusekit.so.$major"; ok=1; }
    local soname
    soname="$(readelf -d "$PREFIX/lib/libfusekit.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')"
    echo "SONAME $soname"
    [[ "$soname" == "libfusekit.so.$major" ]] || { echo "SONAME is '$soname', expected libfusekit.so.$major"; ok=1; }
    local pcv
    pcv="$(pkg-config --modversion fusekit)"
    echo "pkg-config --modversion fusekit: $pcv"
    [[ "$pcv" == "$version" ]] || { echo "fusekit.pc says $pcv, Cargo.toml $version"; ok=1; }
    grep -q "set(PACKAGE_VERSION \"$version\")" "$PREFIX/lib/cmake/fusekit/fusekitConfigVersion.cmake" ||
        { echo "fusekitConfigVersion.cmake does not say $version"; ok=1; }
    echo "pkg-config --cflags --libs fusekit: $(pkg-config --cflags --libs fusekit)"
    echo "pkg-config --static --libs fusekit: $(pkg-config --static --libs fusekit)"
    return $ok
}
step "scripts/install.sh ${build_flag[*]} into a fresh prefix" install_prefix
step "installed layout, SONAME, versions (fusekit.pc, CMake) = Cargo.toml's $version" layout

# --- 2. C, shared, through pkg-config
c_shared() {
    local exe="$WORK/app_c_shared" libdir
    libdir="$(pkg-config --variable=libdir fusekit)"
    # shellcheck disable=SC2046
    "$CC" -std=c99 -Wall -Wextra -Werror "$HERE/app.c" -o "$exe" \
        $(pkg-config --cflags --libs fusekit) -Wl,-rpath,"$libdir" || return 1
    echo "NEEDED: $(needed "$exe" | tr '\n' ' ')"
    needed "$exe" | grep -qx "libfusekit.so.$major" || { echo "not linked against libfusekit.so.$major"; return 1; }
    run_clean "$exe" "$version"
}
step "C, shared: cc \$(pkg-config --cflags --libs fusekit), run without LD_LIBRARY_PATH" c_shared

# --- 3. C, static, through pkg-config --static
c_static() {
    local exe="$WORK/app_c_static" libs
    libs="$(pkg-config --static --libs fusekit)"
    # -l:libfusekit.a picks the archive over libfusekit.so in the same folder
    libs="${libs/-lfusekit/-l:libfusekit.a}"
    # shellcheck disable=SC2046,SC2086
    "$CC" -std=c99 -Wall -Wextra -Werror "$HERE/app.c" -o "$exe" $(pkg-config --cflags fusekit) $libs || return 1
    echo "NEEDED: $(needed "$exe" | tr '\n' ' ')"
    if needed "$exe" | grep -q libfusekit; then echo "depends on the shared library"; return 1; fi
    run_clean "$exe" "$version"
}
step "C, static: libfusekit.a with \$(pkg-config --static --libs fusekit)" c_static

# --- 4. C++ through CMake's find_package(fusekit CONFIG)
cmake_build() { # cmake_build PREFIX BUILD_DIR TARGET...
    local prefix="$1" bdir="$2"
    shift 2
    cmake -S "$HERE" -B "$bdir" -DCMAKE_PREFIX_PATH="$prefix" -DFUSEKIT_EXPECT_VERSION="$version" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$CXX" >"$bdir.log" 2>&1 &&
        grep "fusekit $version" "$bdir.log" &&
        cmake --build "$bdir" --target "$@" -j 2 >>"$bdir.log" 2>&1 || { cat "$bdir.log"; return 1; }
}
cmake_configure_build() {
    cmake_build "$PREFIX" "$WORK/cmake-build" app_shared app_static
}
cmake_shared() {
    local exe="$WORK/cmake-build/app_shared"
    echo "NEEDED: $(needed "$exe" | tr '\n' ' ')"
    needed "$exe" | grep -qx "libfusekit.so.$major" || { echo "not linked against libfusekit.so.$major"; return 1; }
    run_clean "$exe"
}
cmake_static() {
    local exe="$WORK/cmake-build/app_static"
    echo "NEEDED: $(needed "$exe" | tr '\n' ' ')"
    if needed "$exe" | grep -q libfusekit; then echo "depends on the shared library"; return 1; fi
    run_clean "$exe"
}
step "CMake: find_package(fusekit $version CONFIG REQUIRED), build app.cpp twice" cmake_configure_build
step "C++ (fusekit.hpp) linked to fusekit::fusekit, run without LD_LIBRARY_PATH" cmake_shared
step "C++ (fusekit.hpp) linked to fusekit::static" cmake_static

# --- 5. relocatable: the prefix moved, the CMake package follows it
relocated() {
    mv "$PREFIX" "$WORK/moved" || return 1
    cmake_build "$WORK/moved" "$WORK/cmake-moved" app_static || return 1
    grep -q "$WORK/moved/lib/cmake/fusekit" "$WORK/cmake-moved.log" || { echo "fusekit_DIR is not the moved prefix"; return 1; }
    run_clean "$WORK/cmake-moved/app_static"
}
step "the prefix moved: find_package still finds it (relocatable config)" relocated

steps_summary install
