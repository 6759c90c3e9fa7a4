#!/usr/bin/env bash
# The whole GPU suite in one call, on a machine with a CUDA GPU, from the bundle
# made by scripts/build_gpu_bundle.sh (carried as .dev/bundle):
#   CUDA against the CPU oracle (Rust tests through the C ABI), the C and C++ tests on
#   CUDA, the Python tests (torch, DLPack, streams, the C++ torch extension),
#   compute-sanitizer memcheck and racecheck, and the benchmarks against PyTorch.
# Logs go to $OUT (or ./gpu-suite-out): suite.log for this call, steps/<step>.log per
# step (kept across calls); a short table is printed last.
#   usage: scripts/gpu_suite.sh [step ...]   (default: all steps but "huge", the chunked
#   GEMM larger than GPU memory, which runs only when named)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=$(cd "${FK_BUNDLE:-$ROOT/.dev/bundle}" && pwd)  # absolute: tests symlink to the library
OUT=${OUT:-$ROOT/gpu-suite-out}
mkdir -p "$OUT"
LOG=$OUT/suite.log
: >"$LOG"
export FUSEKIT_LIBRARY=$B/lib/libfusekit.so FUSEKIT_LIB_DIR=$B/lib
export FUSEKIT_TORCH_LIBRARY=$B/lib/_fusekit_torch.so
export FK_CACHE_DIR=${FK_CACHE_DIR:-/tmp/fusekit-cache} FK_REQUIRE_GPU=1 FK_REQUIRE_NVRTC=1
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=()
FAILED=0

step() { # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name: $*" | tee -a "$LOG"
  local steplog=$OUT/.step.log
  timeout "$limit" "$@" >"$steplog" 2>&1
  local rc=$?
  cat "$steplog" >>"$LOG"
  mkdir -p "$OUT/steps" && cp "$steplog" "$OUT/steps/$name.log"  # kept when a later call truncates suite.log
  local dt=$((SECONDS - t0))
  local tail_line
  tail_line=$(grep -E "test result:|passed|failed|ERROR SUMMARY|SKIPPED|warmup|FFMA peak|wheel_cold_start" "$steplog" | tail -1 | cut -c1-70)
  rm -f "$steplog"
  if [ $rc -eq 0 ]; then SUMMARY+=("$(printf '%-28s %-6s %5ss  %s' "$name" PASS "$dt" "$tail_line")")
  else SUMMARY+=("$(printf '%-28s %-6s %5ss  rc=%s %s' "$name" FAIL "$dt" "$rc" "$tail_line")"); FAILED=1; fi
}

want() { [ $# -eq 0 ] && return 0; for s in "${SELECTED[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
SELECTED=("$@")
sel() { [ ${#SELECTED[@]} -eq 0 ] || want "$1"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$LOG"
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
# two or more GPUs: the multi-GPU tests must run, not skip
[ "$NGPU" -ge 2 ] && export FK_REQUIRE_MULTI_GPU=1
# NCCL from the Python environment's nvidia-nccl-cu13 wheel (PyTorch's), unless set
if [ -z "${FK_NCCL_PATH:-}" ]; then
  FK_NCCL_PATH=$(python3 -c 'import glob, site, sys; c = [f for d in site.getsitepackages() + sys.path for f in glob.glob(d + "/nvidia/nccl/lib/libnccl.so.2")]; print(c[0] if c else "")' 2>/dev/null)
  if [ -n "$FK_NCCL_PATH" ]; then export FK_NCCL_PATH; else unset FK_NCCL_PATH; fi
fi
echo "GPUs: $NGPU; NCCL: ${FK_NCCL_PATH:-(fusekit search)}" | tee -a "$LOG"

sel warmup && step warmup 600 python3 -c "import fusekit, time; t=time.time(); c=fusekit.Context('cuda'); c.warmup(); print('warmup', round(time.time()-t,1), 's')"
for t in gpu_capture gpu_elementwise gpu_geodesic gpu_gaussian gpu_linalg gpu_mlp gpu_optim gpu_runtime abi_core abi_elementwise abi_geodesic abi_gaussian abi_linalg abi_mlp abi_optim abi_runtime multigpu_runtime nccl_missing stress; do
  [ -x "$B/bin/$t" ] && sel "$t" && step "$t" 600 "$B/bin/$t" --test-threads=1 --nocapture
done
sel c_tests && step c_tests 300 env FK_TEST_DEVICE=cuda bash tests/c/run.sh
# the complex128 crash's root cause in plain C (docs/linalg.md): aligned scalars pass,
# a cuDoubleComplex alpha/beta at 8 mod 16 faults in cuBLAS
sel c128_alignment && step c128_alignment 300 bash -c 'nvcc -O1 -o /tmp/c128_scalar_alignment tests/c/c128_scalar_alignment.cu -lcublas && /tmp/c128_scalar_alignment'
# one cuBLAS per process: FK_CUBLAS_PATH names the nvidia-cublas wheel while the
# toolkit's cuBLAS is on the loader path; only the wheel's pair may be mapped
CUBLAS_WHEEL=$(python3 -c 'import glob, site; c = [f for d in site.getsitepackages() for f in glob.glob(d + "/nvidia/cu13/lib/libcublas.so.13")]; print(c[0] if c else "")' 2>/dev/null)
sel cublas_wheel_pair && [ -n "$CUBLAS_WHEEL" ] && step cublas_wheel_pair 300 env FK_CUBLAS_PATH="$CUBLAS_WHEEL" \
  FK_EXPECT_CUBLAS_DIR="$(dirname "$CUBLAS_WHEEL")" "$B/bin/gpu_linalg" one_cublas_pair_per_process gemm_c128_sequence_that_crashed --test-threads=1 --nocapture
sel python && step python 900 python3 -m pytest -q --maxfail=10 bindings/python/tests tests/test_bindings_complete.py
sel torch_extension && [ -d bindings/cpp/torch_extension ] && \
  step torch_extension 900 python3 -m pytest -q bindings/cpp/torch_extension
# the wheel (dist/fusekit-*.whl from scripts/build_wheel.sh, carried), only when named:
# installed with its [cuda] wheels (repacked from this machine's python) into a fresh
# environment; the GPU Python tests against it; the first op call of a fresh process
want wheel_install && step wheel_install 600 bash scripts/wheel_gpu.sh install
want wheel_python && step wheel_python 900 bash scripts/wheel_gpu.sh python
want wheel_cold_start && step wheel_cold_start 300 bash scripts/wheel_gpu.sh cold_start
# the fused linear layer's activations alone, both GELUs included (gpu_linalg, gpu_capture
# and python run these too): CUDA vs the CPU oracle and f64 (cuBLASLt and fallback paths),
# graph capture, the torch ops against F.gelu / F.gelu(approximate="tanh")
want gelu && step gelu 900 bash -c '"$0/bin/gpu_linalg" linear --test-threads=1 --nocapture &&
  "$0/bin/gpu_capture" capture_linear --test-threads=1 --nocapture &&
  python3 -m pytest -q bindings/python/tests/test_linalg.py bindings/python/tests/test_linalg_torch.py \
    bindings/python/tests/test_torch_graphs.py -k "linear or gelu"' "$B"
# fusekit.jax alone (the "python" step runs it too): the XLA FFI handlers under jit/grad/vmap on
# CUDA jax, CUDA against the CPU handlers, and replay from XLA's CUDA graphs (-s: the counts)
want jax && step jax 600 python3 -m pytest -q -s bindings/python/tests/test_jax.py bindings/python/tests/test_jax_gpu.py \
  bindings/python/tests/test_jax_vmap.py bindings/python/tests/test_jax_mlp.py
# the geodesic precision modes in torch alone (the "python" step runs it too): each torch setting
# and explicit mode on CUDA against the CPU's strict values and gradients
want precision && step precision 600 python3 -m pytest -q bindings/python/tests/test_geodesic_precision.py
# the MLP op alone (the "python" step runs it too): fusekit.mlp_* and FusedMLP on CUDA (the fully
# fused path for f16 / bf16 networks up to width 128, the general path otherwise)
want mlp && step mlp 600 python3 -m pytest -q bindings/python/tests/test_mlp.py bindings/python/tests/test_mlp_torch.py
# other libraries' arrays alone (the "python" step runs it too): CuPy and JAX CUDA arrays through the
# ctypes package, results of the caller's kind
want foreign && step foreign 300 python3 -m pytest -q bindings/python/tests/test_foreign_gpu.py
# fusekit.nn alone (the "python" step runs it too): CUDA values, graph capture, reduce-overhead
want nn && step nn 900 python3 -m pytest -q bindings/python/tests/test_nn.py
# fusekit.optim.Shampoo alone (the "python" step runs it too): the fast root path on CUDA
# (the bench's ill-conditioned statistics, strict and TF32) and the CUDA variants against float64
want shampoo && step shampoo 600 python3 -m pytest -q bindings/python/tests/test_shampoo.py
sel example_gaussian_field && step example_gaussian_field 300 python3 examples/gaussian_field_fit.py --device cuda \
  --gaussians 4096 --points 65536 --steps 500 --out "$OUT/gaussian_field_fit.png"
# the coordinate network in bfloat16: FusedMLP [32, 64 x 4, 3] on the fully fused path, 2^16 pixels a step
sel example_mlp_image && step example_mlp_image 300 python3 examples/mlp_image_fit.py --device cuda \
  --image 512 --batch 65536 --steps 3000 --out "$OUT/mlp_image_fit.png"
sel example_jax_field && step example_jax_field 300 python3 examples/jax_field_fit.py --gaussians 2048 \
  --points 32768 --steps 300 --out "$OUT/jax_field_fit.png"
sel example_mlp_shampoo && step example_mlp_shampoo 300 python3 examples/mlp_shampoo.py --device cuda \
  --steps 300 --out "$OUT/mlp_shampoo.png"
# distributed fusekit.optim.Shampoo under torchrun (two processes, fusekit NCCL) against one GPU
sel shampoo_torchrun && [ "$NGPU" -ge 2 ] && step shampoo_torchrun 600 \
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 tests/dist/shampoo_torchrun.py
# fusekit.privacy alone (the "python" step runs it too): the CUDA variants against torch.func per-sample gradients
want privacy && step privacy 600 python3 -m pytest -q bindings/python/tests/test_privacy.py
sel example_dp_sgd && step example_dp_sgd 300 python3 examples/dp_sgd_classifier.py --device cuda --fused \
  --steps 300 --out "$OUT/dp_sgd_classifier.png"
# the sanitizer steps: all with "sanitizer" (or no selection), each alone when named
# (e.g. scripts/gpu_suite.sh memcheck_linalg)
san() { sel sanitizer || want "$1"; }
export FK_SANITIZE=1   # tests shrink their sizes under the sanitizer
san memcheck && step memcheck 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_elementwise" --test-threads=1
san racecheck && step racecheck 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_elementwise" --test-threads=1
san memcheck_linalg && step memcheck_linalg 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_linalg" --test-threads=1
san racecheck_linalg && step racecheck_linalg 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_linalg" --test-threads=1
san memcheck_mlp && step memcheck_mlp 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_mlp" --test-threads=1
san racecheck_mlp && step racecheck_mlp 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_mlp" --test-threads=1
san memcheck_gaussian && step memcheck_gaussian 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_gaussian" --test-threads=1
san racecheck_gaussian && step racecheck_gaussian 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_gaussian" --test-threads=1
san memcheck_geodesic && step memcheck_geodesic 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_geodesic" --test-threads=1
san racecheck_geodesic && step racecheck_geodesic 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_geodesic" --test-threads=1
san memcheck_optim && step memcheck_optim 900 compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/gpu_optim" --test-threads=1
san racecheck_optim && step racecheck_optim 900 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/bin/gpu_optim" --test-threads=1
# a jitted JAX training step under memcheck: the Gaussian-field fit (field forward and backward
# through the XLA handlers, optax Shampoo on fusekit's roots) at its --smoke size; XLA's own
# allocator not preallocating, so that memcheck sees its buffers as they are made
san memcheck_jax && XLA_PYTHON_CLIENT_PREALLOCATE=false step memcheck_jax 900 compute-sanitizer --tool memcheck \
  --error-exitcode 9 python3 examples/jax_field_fit.py --smoke --out "$OUT/jax_field_fit_memcheck.png"
san memcheck_c && [ -x target/c-tests/test_fusekit ] && \
  step memcheck_c 300 compute-sanitizer --tool memcheck --error-exitcode 9 target/c-tests/test_fusekit cuda
unset FK_SANITIZE
# the concurrency stress (tests/stress.rs: 8 threads on one context, streams destroyed
# with work queued, a context destroyed from another thread, events across threads) on
# CUDA only, under memcheck with its leak check
{ sel sanitizer || sel stress_sanitizer; } && step stress_sanitizer 900 env FK_SANITIZE=1 FK_TEST_DEVICE=cuda \
  compute-sanitizer --tool memcheck --error-exitcode 9 --leak-check full "$B/bin/stress" --test-threads=1 --nocapture
{ sel bench || sel bench_rust; } && step bench_rust 300 "$B/bin/bench_elementwise" --json "$OUT/bench_rust.json"
{ sel bench || sel bench_runtime; } && step bench_runtime 600 "$B/bin/bench_runtime" --json "$OUT/bench_runtime.json"
{ sel bench || sel allreduce_torch; } && [ "$NGPU" -ge 2 ] && step allreduce_torch 600 python3 benches/allreduce_torch.py --gpus "$NGPU" --json "$OUT/allreduce_torch.json" --fusekit-json "$OUT/bench_runtime.json"
{ sel bench || sel bench_torch; } && step bench_torch 900 python3 benches/bench_torch.py --json "$OUT/bench_torch.json"
{ sel bench || sel bench_linalg; } && step bench_linalg 900 python3 benches/bench_linalg.py --json "$OUT/bench_linalg.json"
{ sel bench || sel bench_optim; } && step bench_optim 900 python3 benches/bench_optim.py --json "$OUT/bench_optim.json"
# DP-SGD step: non-private vs fusekit.privacy vs Opacus 1.6 ghost clipping; Opacus from the wheel carried in .whl/
# (pip download --no-deps --only-binary=:all: -d .whl "opacus==1.6.*"; this machine reaches no registry)
{ sel bench || sel bench_dpsgd; } && step bench_dpsgd 900 bash -c 'w=$(ls .whl/opacus-1.6*.whl 2>/dev/null | head -1)
  if [ -n "$w" ] && python3 -m pip install -q --no-deps --no-index --target "$1/opacus-site" "$w"; then
    export PYTHONPATH=$1/opacus-site:$PYTHONPATH; fi
  python3 benches/bench_dpsgd.py --json "$1/bench_dpsgd.json"' _ "$OUT"
{ sel bench || sel bench_shampoo; } && step bench_shampoo 900 python3 benches/bench_shampoo.py --json "$OUT/bench_shampoo.json"
{ sel bench || sel bench_shampoo_dist; } && [ "$NGPU" -ge 2 ] && step bench_shampoo_dist 600 \
  python3 -m torch.distributed.run --standalone --nproc_per_node=2 benches/bench_shampoo.py --dist --json "$OUT/bench_shampoo_dist.json"
{ sel bench || sel peak_ffma; } && command -v nvcc >/dev/null && step peak_ffma 120 bash -c "nvcc -O3 -arch=sm_90 benches/peak_ffma.cu -o '$OUT/peak_ffma' && '$OUT/peak_ffma'"
{ sel bench || sel host_overhead; } && step host_overhead 300 python3 benches/host_overhead.py --json "$OUT/host_overhead.json"
{ sel bench || sel torch_host_breakdown; } && step torch_host_breakdown 300 python3 benches/torch_host_breakdown.py
{ sel bench || sel bench_geodesic; } && step bench_geodesic 900 python3 benches/bench_geodesic.py --json "$OUT/bench_geodesic.json"
{ sel bench || sel bench_gaussian; } && step bench_gaussian 900 python3 benches/bench_gaussian.py --json "$OUT/bench_gaussian.json"
# fusekit.jax training steps against XLA's jit of the same jnp formulas (field, leapfrog, MLP), f32 at "highest"
{ sel bench || sel bench_jax; } && step bench_jax 600 python3 benches/bench_jax.py --large --json "$OUT/bench_jax.json"
{ sel bench || sel bench_torch_path; } && step bench_torch_path 900 python3 benches/bench_torch_path.py --json "$OUT/bench_torch_path.json"
# FK_BENCH_MLP_ARGS: extra arguments (e.g. --cases 'w64' --no-compile); bench_mlp_fused times
# FusedMLP on the fully fused kernels (FK_MLP_FUSED=1) beside the default run's general path
# (per-layer cuBLASLt calls)
{ sel bench || sel bench_mlp; } && step bench_mlp 900 python3 benches/bench_mlp.py --json "$OUT/bench_mlp.json" ${FK_BENCH_MLP_ARGS:-}
{ sel bench || sel bench_mlp_fused; } && step bench_mlp_fused 600 env FK_MLP_FUSED=1 python3 benches/bench_mlp.py \
  --variants '^fk_mlp' --tag fused --json "$OUT/bench_mlp_fused.json" ${FK_BENCH_MLP_ARGS:-}
{ sel scale || sel scale_gaussian; } && step scale_gaussian 900 env FK_SCALE_TEST=1 "$B/bin/gpu_gaussian" scale_field --nocapture
want huge && step chunked_huge 900 env FK_TEST_HUGE=1 "$B/bin/gpu_linalg" chunked_gemm_larger_than_gpu_memory --nocapture

echo
echo "---- benchmark rows"
grep -E "^(device|add|mul|axpby|host|driver|device-to-device|cuda: pooled|overlap|all-reduce|torch.distributed|fusekit busbw|relu|gelu|gemm|chunked|kron|field_|mahalanobis_|christoffel|leapfrog|float64 check|inverse|per-sample|ghost|DP clipped|DP-SGD|  check: fusekit vs Opacus|Shampoo|torch.add|fusekit.add|  fusekit.ops|  torch.ops|  PyTorch eager|torch_path|bench_mlp|bench_jax)" "$LOG" | grep -v "^===" | head -140
echo
echo "---- GPU suite summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
exit $FAILED
