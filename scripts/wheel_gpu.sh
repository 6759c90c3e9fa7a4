#!/usr/bin/env bash
# The wheel on a GPU machine that reaches no package index (scripts/gpu_suite.sh
# steps wheel_install, wheel_python and wheel_cold_start, each run only when named):
#   install     repack the NVIDIA wheels, torch and the test tools installed in this
#               machine's python (scripts/repack_installed_wheels.py), install
#               dist/fusekit-*.whl[cuda,nccl,torch] from them into a fresh virtual
#               environment (pip --no-index: fails when a [cuda] pin is not what is
#               installed here), with no CUDA toolkit variables; check (compiling every
#               module, no cache) that NVRTC,
#               cuBLAS, cuBLASLt and cuSOLVER load from that environment.
#   python      the Python tests against the package installed by `install`.
#   cold_start  a fresh process with an empty FK_CACHE_DIR in that environment: the
#               first op call (elementwise add on the GPU) must take <= 100 ms (the
#               kernels come prebuilt in the wheel; FK_COLD_START_MS overrides the
#               limit), and a warm-up of every module compiles nothing (the cache
#               folder stays empty) on an architecture the wheel has (sm_80, sm_90).
# Environment: FK_WHEEL (default: the one wheel in dist/), PYTHON (default python3,
# the machine's python with torch and the nvidia wheels), FK_WHEEL_WORK (default
# /tmp/fusekit-wheel-gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODE=${1:?usage: scripts/wheel_gpu.sh install|python|cold_start}
PY=${PYTHON:-python3}
W=${FK_WHEEL_WORK:-/tmp/fusekit-wheel-gpu}
VENV=$W/venv
CUDA_WHEELS=(nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cublas nvidia-cusolver nvidia-nccl-cu13)

# no CUDA toolkit variables, none of the suite's library locations
unset CUDA_HOME CUDA_PATH CUDA_ROOT FK_CUDA_INCLUDE FK_NVRTC_PATH FK_NCCL_PATH \
  FUSEKIT_LIBRARY FUSEKIT_TORCH_LIBRARY FUSEKIT_LIB_DIR PYTHONPATH VIRTUAL_ENV CONDA_PREFIX
if [ -n "${LD_LIBRARY_PATH:-}" ]; then
  LD_LIBRARY_PATH=$(tr ':' '\n' <<<"$LD_LIBRARY_PATH" | grep -v -i -E 'cuda|nvidia' | paste -sd: - || true)
  export LD_LIBRARY_PATH
fi

in_venv() { # the fresh environment, outside the repository, installed package only
  (cd "$W" && VIRTUAL_ENV=$VENV PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" FUSEKIT_TEST_INSTALLED=1 "$@")
}

install() {
  local wheel=${FK_WHEEL:-}
  if [ -z "$wheel" ]; then
    wheel=$(ls "$ROOT"/dist/fusekit-*-py3-none-manylinux*_x86_64.whl 2>/dev/null | head -1 || true)
  fi
  [ -f "$wheel" ] || { echo "wheel_gpu.sh: no wheel (scripts/build_wheel.sh makes dist/fusekit-*.whl; carry dist)" >&2; exit 1; }
  echo "wheel: $wheel"
  rm -rf "$W"
  mkdir -p "$W"
  echo "--- NVIDIA wheels installed in $("$PY" -c 'import sys; print(sys.prefix)') (the [cuda] pins must match)"
  "$PY" - "${CUDA_WHEELS[@]}" <<'EOF'
import importlib.metadata as md, sys
for n in sys.argv[1:]:
    try:
        print(f"  {n}=={md.version(n)}")
    except md.PackageNotFoundError:
        print(f"  {n}: not installed")
EOF
  echo "--- [cuda] pins of the wheel"
  "$PY" - "$wheel" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" in line:
            print(" ", line.split(":", 1)[1].strip())
EOF
  echo "--- repacking the installed wheels (no index here)"
  "$PY" "$ROOT/scripts/repack_installed_wheels.py" --deps --store -o "$W/wheels" \
    "${CUDA_WHEELS[@]}" torch numpy pytest | sed 's/^/  /'
  if ! "$PY" -m venv "$VENV"; then # no ensurepip here: pip from this python's own
    rm -rf "$VENV"
    "$PY" -m venv --without-pip "$VENV"
    "$PY" "$ROOT/scripts/repack_installed_wheels.py" -o "$W/pip" pip
    "$VENV/bin/python" "$(ls "$W"/pip/pip-*.whl)/pip" install -q --no-index "$(ls "$W"/pip/pip-*.whl)"
  fi
  in_venv python -m pip install -q --no-index --find-links "$W/wheels" "$wheel[cuda,nccl,torch]" pytest
  in_venv python -m pip list 2>/dev/null | grep -i -E '^(fusekit|torch|nvidia-cu(da-nvrtc|da-runtime|blas|solver)|nvidia-nccl)' | sed 's/^/  /' || true
  echo "--- the CUDA libraries come from the fresh environment (every module compiled with its NVRTC)"
  in_venv env FK_CACHE_DISABLE=1 python - "$VENV" <<'EOF'
import sys, numpy as np, fusekit as fk
venv = sys.argv[1]
ctx = fk.Context("cuda")
a = fk.Buffer.empty(ctx, (64, 64), "float32"); a.copy_from(np.eye(64))
fk.add(a, a, out=a)                                   # NVRTC (FK_CACHE_DISABLE=1: no prebuilt image)
fk.ops.linalg.gemm(a, a, op_b="N")                    # cuBLAS / cuBLASLt
fk.matrix_power(a, -0.5, 1e-6, method="eigh")         # cuSOLVER
ctx.warmup()
maps = open("/proc/self/maps").read()
loaded = sorted({l.split()[-1] for l in maps.splitlines() if any(k in l for k in ("libnvrtc", "libcublas", "libcusolver"))})
for p in loaded:
    print("  loaded", p)
outside = [p for p in loaded if not p.startswith(venv)]
assert not outside, f"CUDA libraries loaded from outside {venv}: {outside}"
for lib in ("libnvrtc.so", "libcublas.so", "libcublasLt.so", "libcusolver.so"):
    assert any(p.rsplit("/", 1)[-1].startswith(lib) for p in loaded), f"{lib} was not loaded"
print("  fusekit", fk.__version__, "from", fk.__file__, "library", fk.library_path())
EOF
}

python_tests() {
  [ -x "$VENV/bin/python" ] || install
  echo "--- Python tests against the installed wheel ($VENV)"
  in_venv env FK_CACHE_DIR="$W/cache" python -m pytest -q -x -p no:cacheprovider "$ROOT/bindings/python/tests"
}

cold_start() {
  [ -x "$VENV/bin/python" ] || install >/dev/null
  local cache
  cache=$(mktemp -d "$W/cold-cache.XXXXXX")
  in_venv env FK_CACHE_DIR="$cache" python - "$cache" "${FK_COLD_START_MS:-100}" <<'EOF'
import os, sys, time
t0 = time.perf_counter()
import numpy as np
import fusekit as fk
t_import = time.perf_counter() - t0
cache, limit_ms = sys.argv[1], float(sys.argv[2])
t = time.perf_counter(); ctx = fk.Context("cuda"); t_ctx = time.perf_counter() - t
a = fk.Buffer.empty(ctx, (1 << 20,), "float32"); a.copy_from(np.full(1 << 20, 1.5, np.float32))
o = fk.Buffer.empty(ctx, (1 << 20,), "float32")
a.to_numpy()
t = time.perf_counter(); fk.add(a, a, out=o); first = o.to_numpy(); t_first = time.perf_counter() - t
t = time.perf_counter(); fk.add(a, a, out=o); o.to_numpy(); t_second = time.perf_counter() - t
assert np.all(first == 3.0), "wrong result"
t = time.perf_counter(); ctx.warmup(); t_warm = time.perf_counter() - t
cc = ctx.compute_capability
arch = f"sm_{cc[0]}{cc[1]}"
kernels = os.path.join(os.path.dirname(fk.__file__), "fusekit-kernels")
shipped = any(f.split("-")[1] == arch for f in os.listdir(kernels) if f.endswith(".cubin"))
compiled = [f for f in os.listdir(cache) if f.endswith(".cubin")]
print(f"{ctx.name} ({arch}): import {t_import*1e3:.0f} ms, context {t_ctx*1e3:.0f} ms, "
      f"first op call {t_first*1e3:.1f} ms (second {t_second*1e3:.2f} ms), "
      f"warm-up of every other module {t_warm*1e3:.0f} ms, compiled at run time: {len(compiled)} modules")
print(f"wheel_cold_start first_op_ms={t_first*1e3:.1f} limit_ms={limit_ms:g} prebuilt_for_{arch}={shipped}")
if not shipped:
    sys.exit(f"the wheel has no prebuilt kernels for {arch}: nothing to measure")
assert not compiled, f"modules compiled at run time although the wheel has {arch}: {compiled}"
assert t_first * 1e3 <= limit_ms, f"first op call took {t_first*1e3:.1f} ms > {limit_ms:g} ms"
EOF
}

case $MODE in
  install) install ;;
  python) python_tests ;;
  cold_start) cold_start ;;
  *) echo "usage: scripts/wheel_gpu.sh install|python|cold_start" >&2; exit 2 ;;
esac
