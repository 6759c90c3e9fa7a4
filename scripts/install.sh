#!/usr/bin/env bash
# Installs fusekit for C and C++ users into PREFIX:
#   PREFIX/lib/libfusekit.so.<version>, libfusekit.so.<major> (the SONAME), libfusekit.so
#   PREFIX/lib/libfusekit.a                  (link with -lpthread -ldl -lm)
#   PREFIX/include/fusekit.h, fusekit.hpp    (the C header, the C++ RAII wrapper)
#   PREFIX/lib/pkgconfig/fusekit.pc          (pkg-config fusekit)
#   PREFIX/lib/cmake/fusekit/fusekitConfig.cmake, fusekitConfigVersion.cmake
#                                            (find_package(fusekit CONFIG): fusekit::fusekit, fusekit::static)
#
#   scripts/install.sh PREFIX               # cargo build --release, then install
#   scripts/install.sh --no-build PREFIX    # install the existing build (also FUSEKIT_NO_BUILD=1)
#   DESTDIR=/tmp/stage scripts/install.sh /usr/local   # staged: files under $DESTDIR$PREFIX
#
# The version is Cargo.toml's (package.version); the SONAME major is its major. The
# libraries come from target/release, or FUSEKIT_LIB_DIR. Templates: packaging/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build=1
[[ "${FUSEKIT_NO_BUILD:-0}" == 1 ]] && build=0
prefix=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-build) build=0 ;;
        -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "install.sh: unknown option $1" >&2; exit 2 ;;
        *) [[ -z "$prefix" ]] || { echo "install.sh: one PREFIX only" >&2; exit 2; }; prefix="$1" ;;
    esac
    shift
done
[[ -n "$prefix" ]] || { echo "usage: scripts/install.sh [--no-build] PREFIX" >&2; exit 2; }
# an absolute prefix (it is written into fusekit.pc)
case "$prefix" in
    /*) ;;
    *) prefix="$PWD/$prefix" ;;
esac
prefix="${prefix%/}"
[[ -n "$prefix" ]] || prefix=/

# --- the version: Cargo.toml's [package] version, the one source
version="$(awk '
    /^\[/ { in_pkg = ($0 == "[package]") }
    in_pkg && /^version[ \t]*=/ { sub(/^[^"]*"/, ""); sub(/".*$/, ""); print; exit }
' "$ROOT/Cargo.toml")"
[[ "$version" =~ ^([0-9]+)\.[0-9]+\.[0-9]+ ]] || { echo "install.sh: no version in Cargo.toml's [package] ($version)" >&2; exit 1; }
major="${BASH_REMATCH[1]}"
description="$(awk '
    /^\[/ { in_pkg = ($0 == "[package]") }
    in_pkg && /^description[ \t]*=/ { sub(/^[^"]*"/, ""); sub(/"[ \t]*$/, ""); print; exit }
' "$ROOT/Cargo.toml")"

if [[ $build == 1 ]]; then
    echo "install.sh: cargo build --release"
    (cd "$ROOT" && cargo build --release)
fi
lib_dir="${FUSEKIT_LIB_DIR:-$ROOT/target/release}"
for f in libfusekit.so libfusekit.a; do
    [[ -f "$lib_dir/$f" ]] || { echo "install.sh: $lib_dir/$f not found (run without --no-build, or set FUSEKIT_LIB_DIR)" >&2; exit 1; }
done
soname="libfusekit.so.$major"
if command -v readelf >/dev/null 2>&1; then
    got="$(readelf -d "$lib_dir/libfusekit.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')"
    if [[ "$got" != "$soname" ]]; then
        echo "install.sh: $lib_dir/libfusekit.so has SONAME '${got:-none}', expected $soname (stale build? run cargo build --release)" >&2
        exit 1
    fi
fi

# --- templates: @PREFIX@ @VERSION@ @MAJOR@ @DESCRIPTION@
sed_escape() { printf '%s' "$1" | sed -e 's/[\/&|\\]/\\&/g'; }
render() { # render TEMPLATE OUTPUT
    sed -e "s|@PREFIX@|$(sed_escape "$prefix")|g" \
        -e "s|@VERSION@|$(sed_escape "$version")|g" \
        -e "s|@MAJOR@|$(sed_escape "$major")|g" \
        -e "s|@DESCRIPTION@|$(sed_escape "$description")|g" \
        "$ROOT/packaging/$1" >"$2"
    chmod 644 "$2"
}

dest="${DESTDIR:-}$prefix"
echo "install.sh: fusekit $version into ${dest}"
mkdir -p "$dest/lib/pkgconfig" "$dest/lib/cmake/fusekit" "$dest/include"

install -m 755 "$lib_dir/libfusekit.so" "$dest/lib/libfusekit.so.$version"
ln -sfn "libfusekit.so.$version" "$dest/lib/$soname"
ln -sfn "$soname" "$dest/lib/libfusekit.so"
install -m 644 "$lib_dir/libfusekit.a" "$dest/lib/libfusekit.a"
install -m 644 "$ROOT/include/fusekit.h" "$ROOT/bindings/cpp/fusekit.hpp" "$dest/include/"
render fusekit.pc.in "$dest/lib/pkgconfig/fusekit.pc"
render fusekitConfig.cmake.in "$dest/lib/cmake/fusekit/fusekitConfig.cmake"
render fusekitConfigVersion.cmake.in "$dest/lib/cmake/fusekit/fusekitConfigVersion.cmake"

cat <<MSG
install.sh: done
  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs fusekit
  CMake:      -DCMAKE_PREFIX_PATH=$prefix, then find_package(fusekit CONFIG REQUIRED)
MSG
