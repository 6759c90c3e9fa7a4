#!/usr/bin/env bash
# Shows that a change left the kernels' generated code alone: compiles the kernel
# modules with NVRTC at BASE_REV and in the working tree (uncommitted edits
# included) and compares the images module by module.
#
#   usage: scripts/kernel_compare.sh BASE_REV [FAMILIES] [--rename OLD=NEW ...]
#     FAMILIES  modules to compare, as FK_KERNELS of tests/kernels_compile.rs: names
#               or families (default gaussian,geodesic)
#     --rename  module OLD at BASE_REV is module NEW in the tree
#
# Both sides run tests/kernels_compile.rs with FK_PREBUILT_OUT, FK_KERNELS and
# FK_ARCHS (the tree's harness is copied over BASE_REV's; BASE_REV's own serves
# when the copy does not build there), with the same NVRTC and CUDA headers (those
# of PYTHON's nvidia wheels). BASE_REV is checked out in a git worktree
# $KC_DIR/base-<rev> with its own target folder $KC_DIR/target-base (a first run
# builds the crate there: minutes; `git worktree remove --force` it when done).
# Images are named <module>-<arch>-<key>.cubin, the key a hash over the source, so
# scripts/kernel_compare.py pairs them by module name and prints a table:
#   identical bytes | same SASS | same SASS, renamed | DIFFERENT ... | only in base/tree
# "same SASS": the bytes differ (e.g. section order) but cuobjdump -sass lists the
# same instructions with the same encodings per function (addresses left out) and
# cuobjdump -res-usage the same registers, stack, shared and constant memory;
# "renamed": the same up to the functions' names. cuobjdump and nvdisasm are taken
# from PATH, or from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels
# installed into $KC_DIR/tools. Diffs of
# DIFFERENT modules go to $KC_DIR/diffs. Exit status 1 when a module is DIFFERENT
# or unpaired, 2 when a build or compile fails.
#
# Environment: KC_ARCH (default sm_90), KC_DIR (default ${TMPDIR:-/tmp}/fusekit-kc),
# PYTHON (default .venv-test/bin/python, made by scripts/test.sh: the environment
# with the nvidia-cuda-nvrtc and nvidia-cuda-runtime wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

usage() { sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
BASE_REV=$1
shift
FAMILIES=gaussian,geodesic
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then FAMILIES=$1; shift; fi
RENAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --rename) [ $# -ge 2 ] || usage; RENAMES+=(--rename "$2"); shift 2 ;;
    *) usage ;;
  esac
done
ARCH=${KC_ARCH:-sm_90}
KC_DIR=${KC_DIR:-${TMPDIR:-/tmp}/fusekit-kc}
PY=${PYTHON:-$ROOT/.venv-test/bin/python}
base=$(git rev-parse --verify -q "$BASE_REV^{commit}") || { echo "kernel_compare.sh: $BASE_REV is not a commit" >&2; exit 2; }
mkdir -p "$KC_DIR"

# one NVRTC and one set of CUDA headers for both sides
NV=$("$PY" -c '
import os, nvidia
for p in nvidia.__path__:
    if os.path.isfile(os.path.join(p, "cu13", "lib", "libnvrtc.so.13")):
        print(os.path.join(p, "cu13")); break
') || true
[ -n "$NV" ] || { echo "kernel_compare.sh: no nvidia/cu13/lib/libnvrtc.so.13 in $PY's environment (run scripts/test.sh's pip step)" >&2; exit 2; }
export FK_NVRTC_PATH=$NV/lib/libnvrtc.so.13 FK_CUDA_INCLUDE=$NV/include FK_REQUIRE_NVRTC=1
export FK_KERNELS=$FAMILIES FK_ARCHS=$ARCH

# images SRC_DIR OUT_DIR [VAR=VALUE...]: the compile test of SRC_DIR writing into OUT_DIR
images() {
  local src=$1 out=$2
  shift 2
  rm -rf "$out"
  (cd "$src" && env "$@" FK_PREBUILT_OUT="$out" cargo test --release --test kernels_compile) >"$out.log" 2>&1
}

# BASE_REV's images are kept (per revision, families and architecture) and reused
WT=$KC_DIR/base-${base:0:7}
BASE_OUT=$KC_DIR/images-${base:0:12}-$ARCH-${FAMILIES//,/+}
if [ -f "$BASE_OUT.done" ] && [ -d "$BASE_OUT" ]; then
  echo "==> images of $BASE_REV (${base:0:12}): kept in $BASE_OUT"
else
  echo "==> images of $BASE_REV (${base:0:12}; worktree $WT)"
  rm -f "$BASE_OUT.done"
  if [ ! -e "$WT/.git" ]; then
    git worktree add -q --detach "$WT" "$base"
  else
    git -C "$WT" checkout -q -f --detach "$base"
  fi
  cp tests/kernels_compile.rs "$WT/tests/kernels_compile.rs"
  if ! images "$WT" "$BASE_OUT" CARGO_TARGET_DIR="$KC_DIR/target-base"; then
    echo "    (the tree's tests/kernels_compile.rs failed there; $BASE_REV's own, every architecture)"
    git -C "$WT" checkout -q -f -- tests/kernels_compile.rs
    images "$WT" "$BASE_OUT" CARGO_TARGET_DIR="$KC_DIR/target-base" || {
      tail -30 "$BASE_OUT.log" >&2
      echo "kernel_compare.sh: $BASE_REV's kernels did not build or compile (log: $BASE_OUT.log)" >&2
      exit 2
    }
  fi
  git -C "$WT" checkout -q -f -- tests/kernels_compile.rs
  touch "$BASE_OUT.done"
fi

echo "==> images of the working tree ($FAMILIES, $ARCH)"
images "$ROOT" "$KC_DIR/tree" || {
  tail -30 "$KC_DIR/tree.log" >&2
  echo "kernel_compare.sh: the working tree's kernels did not build or compile (log: $KC_DIR/tree.log)" >&2
  exit 2
}

# cuobjdump -sass runs nvdisasm (found on PATH)
CUOBJDUMP=$(command -v cuobjdump || true)
if [ -z "$CUOBJDUMP" ] || ! command -v nvdisasm >/dev/null; then
  TOOLS=$KC_DIR/tools/nvidia/cu13/bin
  [ -x "$TOOLS/nvdisasm" ] || "$PY" -m pip install -q --no-deps --upgrade --target "$KC_DIR/tools" \
    "nvidia-cuda-cuobjdump==13.2.86" "nvidia-cuda-nvdisasm==13.2.86" >&2 || true
  if [ -x "$TOOLS/nvdisasm" ]; then
    export PATH=$TOOLS:$PATH
    CUOBJDUMP=$TOOLS/cuobjdump
  else
    echo "    (no cuobjdump/nvdisasm: bytes only)"
    CUOBJDUMP=
  fi
fi

echo "==> comparison"
rm -rf "$KC_DIR/diffs"
"$PY" scripts/kernel_compare.py "$BASE_OUT" "$KC_DIR/tree" --arch "$ARCH" --diffs "$KC_DIR/diffs" \
  ${CUOBJDUMP:+--cuobjdump "$CUOBJDUMP"} ${RENAMES[@]+"${RENAMES[@]}"}
