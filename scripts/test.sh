#!/usr/bin/env bash
# Runs every test that needs no GPU, on a fresh machine; installs what it needs.
#   - Rust: unit tests, the header staleness check, the C-ABI tests on the CPU
#     backend, and the NVRTC compile of every kernel for sm_80 and sm_90 (the
#     nvidia-cuda-nvrtc / nvidia-cuda-runtime wheels provide libnvrtc and headers);
#     NCCL loaded from the nvidia-nccl-cu13 wheel (a unique id needs no GPU).
#   - C and C++: tests/c/run.sh (C test, C examples, C++ wrapper test, header as C99/C++);
#     tests/cuda_emu/run.sh (kernels/gaussian.cu executed on the CPU by an emulation).
#   - Python: the ctypes package (numpy), cffi, bindings completeness, Julia module check.
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

echo "==> cargo build --release"
cargo build --release
echo "==> cargo test --release (Rust, CPU backend + NVRTC kernel compile + NCCL loading)"
FK_REQUIRE_NVRTC=1 FK_REQUIRE_NCCL=1 cargo test --release -- --test-threads=2

echo "==> CUDA kernel sources run on the CPU (emulated threads, barriers, shuffles)"
bash tests/cuda_emu/run.sh

echo "==> C / C++ tests"
FUSEKIT_LIB_DIR=$ROOT/target/release FK_TEST_DEVICE=cpu bash tests/c/run.sh

echo "==> install prefix: pkg-config and CMake consumers"
bash tests/install/run.sh --no-build

echo "==> Python package, with the compiled torch ops (built against this torch's stable ABI)"
python -m pip install -q wheel "setuptools>=64"
FUSEKIT_REQUIRE_TORCH_EXT=1 python -m pip install -q --no-build-isolation "$ROOT/bindings/python"
# the tests import the package from the source tree; they use the extension the install built
FUSEKIT_TORCH_LIBRARY=$(cd / && python -c 'import fusekit._torch_ext as t; print(t._candidates()[0])')
export FUSEKIT_TORCH_LIBRARY
echo "compiled torch ops: $FUSEKIT_TORCH_LIBRARY"
# the installed package, outside the source tree: torch ops load and run
(cd / && FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so FUSEKIT_TORCH_LIBRARY= python -c '
import torch, fusekit, fusekit.torch_ops
x = torch.randn(8, 16, requires_grad=True); w = torch.randn(4, 16, requires_grad=True)
y = fusekit.torch_ops.linear(x, w, None, "relu"); y.sum().backward()
assert torch.allclose(y, torch.relu(x @ w.T), atol=1e-5) and w.grad is not None
print("installed package: torch ops OK,", fusekit._torch_ext.library_path())')
echo "==> Python tests"
echo "==> Python host time per call (CPU backend; a smoke run of benches/host_overhead.py)"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python benches/host_overhead.py
echo "==> the torch path's benchmark (CPU smoke run of benches/bench_torch_path.py)"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python benches/bench_torch_path.py --smoke --no-compile
echo "==> examples/gaussian_field_fit.py (fusekit.nn.GaussianField + Adam; CPU smoke run, writes its PNG)"
rm -f "$ROOT/target/gaussian_field_fit.png"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python examples/gaussian_field_fit.py --smoke \
  --out "$ROOT/target/gaussian_field_fit.png"
test -s "$ROOT/target/gaussian_field_fit.png"
echo "==> examples/mlp_shampoo.py (FusedLinear MLP + fusekit.optim.Shampoo; CPU run, writes its PNG)"
rm -f "$ROOT/target/mlp_shampoo.png"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python examples/mlp_shampoo.py --steps 60 \
  --out "$ROOT/target/mlp_shampoo.png"
test -s "$ROOT/target/mlp_shampoo.png"
echo "==> benches/bench_shampoo.py --smoke (CPU, small sizes)"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python benches/bench_shampoo.py --smoke
echo "==> examples/dp_sgd_classifier.py (fusekit.privacy.DPSGD vs SGD; CPU run, writes its PNG)"
rm -f "$ROOT/target/dp_sgd_classifier.png"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python examples/dp_sgd_classifier.py --steps 60 \
  --out "$ROOT/target/dp_sgd_classifier.png"
test -s "$ROOT/target/dp_sgd_classifier.png"
echo "==> benches/bench_dpsgd.py --smoke (CPU, small sizes; the Opacus row only where opacus is installed)"
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python benches/bench_dpsgd.py --smoke
FUSEKIT_LIBRARY=$ROOT/target/release/libfusekit.so python -m pytest -q bindings/python/tests tests/*.py
