#!/usr/bin/env bash
# Diagnosis of the complex128 GEMM crash on CUDA (cuBLAS 13.0 crashed inside
# cublasLtZZZMatmul). Since then fusekit keeps complex128 off cuBLAS's ZGEMM: large
# products run as four f64 GEMMs on split planes, small ones fusekit's own kernel
# (src/cuda/linalg.rs, docs/linalg.md); FK_CUDA_C128_GEMM=1 sends them to cuBLAS
# again, for this diagnosis only. One call on the GPU machine; every case runs so
# that a crash is attributed to it:
#   (a) torch: complex128 matmuls through PyTorch (its own cuBLAS), each case
#       announced before it runs; after a crash the run resumes at the next case;
#   (b) cuBLAS directly (tests/c/diag_c128.cu, built here with nvcc): fusekit's exact
#       argument pattern, workspace and context, the shapes of tests/gpu_linalg.rs,
#       then one hypothesis at a time (workspace set / not set / elsewhere, pointer
#       mode, 8- vs 16-byte aligned operands, broadcast batch stride 0, op C, k = 0,
#       m/n/k = 1, large m, stream kind, an earlier handle, no cuBLASLt handle),
#       both through cublasGemmStridedBatchedEx and cublasZgemmStridedBatched, each
#       case in a forked child; again against torch's cuBLAS wheel when there is one
#       (another build of the same library);
#   (c) fusekit: the gpu_linalg test binary's complex128 cases through cuBLAS
#       (gemm_c128_opt_in_cases, with FK_CUDA_C128_GEMM=1), resumed after each crash,
#       with the cuBLAS files the process loaded; then, without the variable, the
#       default route against the CPU oracle (gemm_oracle_c128).
# Logs go to $OUT (or ./gpu-suite-out/diag-c128, git-ignored); the table of case -> result is printed last
# (also in $OUT/diag_c128_table.txt).
# About 3 to 6 minutes (longer when many cases crash: each crash restarts a process).
#   usage: scripts/diag_c128.sh [torch] [cublas] [fusekit]   (default: all three)
#   FK_BUNDLE: scripts/build_gpu_bundle.sh's bundle (default .dev/bundle); NVCC: the compiler
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${FK_BUNDLE:-$ROOT/.dev/bundle}
OUT=${OUT:-$ROOT/gpu-suite-out/diag-c128}
mkdir -p "$OUT"
TABLE=$OUT/diag_c128_table.txt
: >"$TABLE"
export FK_CACHE_DIR=${FK_CACHE_DIR:-/tmp/fusekit-cache} PYTHONUNBUFFERED=1 FK_REQUIRE_GPU=1
row() { echo "$1|$2|$3|$4" >>"$TABLE"; }
SECTIONS=("$@")
sel() { [ ${#SECTIONS[@]} -eq 0 ] && return 0; for x in "${SECTIONS[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }

# ---------------------------------------------------------------- environment
{
  echo "== nvidia-smi"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  echo "== nvcc"
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  "$NVCC" --version 2>&1 | tail -2
  echo "== cuBLAS files"
  ls -l /usr/local/cuda/lib64/libcublas*.so* 2>&1
  ldconfig -p 2>/dev/null | grep -i cublas
  python3 - <<'EOF' 2>&1
import glob, site, sys
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda)
except Exception as e:
    print("torch unavailable:", e)
for d in site.getsitepackages() + sys.path:
    for f in sorted(glob.glob(d + "/nvidia/**/libcublas*.so*", recursive=True)):
        print("wheel:", f)
EOF
} >"$OUT/env.txt"
cat "$OUT/env.txt"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
# torch's cuBLAS wheel folder (libcublas.so.13 and libcublasLt.so.13), if any
TORCH_CUBLAS_DIR=$(python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
for d in site.getsitepackages() + sys.path:
    for f in sorted(glob.glob(d + "/nvidia/**/libcublasLt.so.13", recursive=True)):
        if os.path.exists(os.path.join(os.path.dirname(f), "libcublas.so.13")):
            print(os.path.dirname(f)); sys.exit(0)
EOF
)

# resumable NAME FROM_VAR CMD...: runs CMD with $FROM_VAR = first case to run; CMD
# prints "... case I/N: DESC ... ok|WRONG ..." per case. A case announced but not
# finished when CMD ends is the culprit: CRASH (killed by a signal), TIMEOUT, or FAIL
# (exit status; the panic or exception quoted); the run then resumes after it.
resumable() {
  local name=$1 var=$2
  shift 2
  local from=0 tries=0 rc log last idx desc what
  while :; do
    log=$OUT/${name}_from${from}.log
    env "$var=$from" timeout 900 "$@" >"$log" 2>&1
    rc=$?
    grep -E "case [0-9]+/[0-9]+: .* \.\.\. (ok|WRONG)" "$log" |
      sed -E "s/^.*case ([0-9]+)\/[0-9]+: (.*) \.\.\. (ok|WRONG)(.*)$/$name|\1|\3\4|\2/" >>"$TABLE"
    [ $rc -eq 0 ] && break
    last=$(grep -oE "case [0-9]+/[0-9]+: .*" "$log" | tail -1)
    if [ -z "$last" ] || echo "$last" | grep -qE " \.\.\. (ok|WRONG)"; then
      row "$name" - "rc=$rc outside any case" "see $log: $(grep -m1 -E 'panicked|Error|error|SKIPPED' "$log" | cut -c1-160)"
      break
    fi
    idx=$(echo "$last" | sed -E 's/^case ([0-9]+)\/.*/\1/')
    desc=$(echo "$last" | sed -E 's/^case [0-9]+\/[0-9]+: (.*) \.\.\..*$/\1/')
    if [ $rc -eq 124 ]; then
      what=TIMEOUT
    elif [ $rc -ge 128 ]; then
      what="CRASH (signal $((rc - 128)))"
    else
      what="FAIL rc=$rc: $(grep -m1 -A2 -E 'panicked|Traceback' "$log" | tr '\n' ' ' | cut -c1-220)"
    fi
    row "$name" "$idx" "$what" "$desc"
    echo "$name: case $idx: $what ($desc); resuming after it"
    from=$((idx + 1))
    tries=$((tries + 1))
    [ $tries -gt 80 ] && break
  done
}

# ---------------------------------------------------------------- (a) torch
cat >"$OUT/torch_c128.py" <<'EOF'
import os, sys
import torch

FROM = int(os.environ.get("TORCH_C128_FROM", "0"))
dev = "cuda"
torch.manual_seed(0)
g = torch.Generator().manual_seed(128)


def rnd(*shape):
    return torch.complex(torch.randn(shape, generator=g, dtype=torch.float64),
                         torch.randn(shape, generator=g, dtype=torch.float64))


def op(x, o):
    return x if o == "N" else x.mT if o == "T" else x.mH


cases = []
for (m, n, k) in [(5, 4, 3), (1, 1, 1), (17, 13, 33), (64, 128, 96), (65, 129, 70), (6, 7, 0), (31, 17, 5),
                  (8192, 64, 64), (1024, 1024, 1024)]:
    for oa in "NTC":
        for ob in "NTC":
            cases.append((f"matmul op_a={oa} op_b={ob} m={m} n={n} k={k}", (m, n, k, oa, ob, None)))
for ba, bb in [(3, 3), (1, 3), (3, 1)]:
    cases.append((f"batched op_a=T op_b=N m=9 n=11 k=13 batch a/b={ba}/{bb}", (9, 11, 13, "T", "N", (ba, bb))))
cases.append(("addmm alpha=0.75-0.5j beta=-0.5+0.25j m=17 n=13 k=33", (17, 13, 33, "N", "N", "addmm")))
cases.append(("non-contiguous (sliced) m=64 n=128 k=96", (64, 128, 96, "N", "N", "slice")))
printed = False
for i, (desc, (m, n, k, oa, ob, extra)) in enumerate(cases):
    if i < FROM:
        continue
    print(f"torch case {i}/{len(cases)}: {desc} ... ", end="", flush=True)
    if isinstance(extra, tuple):
        ba, bb = extra
        a = rnd(ba, k, m) if oa != "N" else rnd(ba, m, k)
        b = rnd(bb, n, k) if ob != "N" else rnd(bb, k, n)
    else:
        a = rnd(k, m) if oa != "N" else rnd(m, k)
        b = rnd(n, k) if ob != "N" else rnd(k, n)
    if extra == "slice":
        a = rnd(m, k + 5)[:, 2:k + 2]
    ref = op(a, oa) @ op(b, ob)
    ga, gb = a.to(dev), b.to(dev)
    if extra == "addmm":
        c = rnd(m, n)
        ref = (0.75 - 0.5j) * ref + (-0.5 + 0.25j) * c
        out = torch.addmm(c.to(dev), op(ga, oa), op(gb, ob), alpha=0.75 - 0.5j, beta=-0.5 + 0.25j)
    else:
        out = op(ga, oa) @ op(gb, ob)
    torch.cuda.synchronize()
    out = out.cpu()
    den = torch.linalg.vector_norm(ref).item()
    err = torch.linalg.vector_norm(out - ref).item() / (den if den else 1.0)
    print(("ok" if err <= 1e-12 else "WRONG") + f" (rel err {err:.1e})", flush=True)
    if not printed:
        printed = True
        libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "cublas" in l})
        print("torch: cuBLAS libraries mapped:", libs, flush=True)
EOF
if ! sel torch; then
  :
elif python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "== (a) torch complex128 matmuls"
  resumable torch TORCH_C128_FROM python3 "$OUT/torch_c128.py"
  grep -h "cuBLAS libraries mapped" "$OUT"/torch_from*.log | head -1
else
  row torch - SKIPPED "torch with CUDA unavailable"
fi

# ---------------------------------------------------------------- (b) cuBLAS directly
if ! sel cublas; then
  :
elif echo "== (b) cuBLAS called as fusekit calls it (tests/c/diag_c128.cu)" &&
  "$NVCC" -O1 -o "$OUT/diag_c128" tests/c/diag_c128.cu -lcublas -lcublasLt -lcuda >"$OUT/nvcc.log" 2>&1; then
  DIAG_SECTION=cublas timeout 1800 "$OUT/diag_c128" >"$OUT/cublas.log" 2>&1
  echo "cublas: rc=$? ($(grep -m1 -E '^==== ' "$OUT/cublas.log"))"
  head -3 "$OUT/cublas.log"
  grep -E "^TABLE\|" "$OUT/cublas.log" | cut -d'|' -f2- >>"$TABLE"
  if [ -n "$TORCH_CUBLAS_DIR" ]; then
    echo "== (b') the GemmStridedBatchedEx cases against torch's cuBLAS wheel: $TORCH_CUBLAS_DIR"
    DIAG_SECTION=cublas-torch-wheel LD_LIBRARY_PATH=$TORCH_CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
      timeout 1800 "$OUT/diag_c128" GemmStridedBatchedEx >"$OUT/cublas_torch_wheel.log" 2>&1
    echo "cublas-torch-wheel: rc=$? ($(grep -m1 -E '^==== ' "$OUT/cublas_torch_wheel.log"))"
    head -3 "$OUT/cublas_torch_wheel.log"
    grep -E "^TABLE\|" "$OUT/cublas_torch_wheel.log" | cut -d'|' -f2- >>"$TABLE"
  fi
else
  cat "$OUT/nvcc.log"
  row cublas - "BUILD FAILED" "$NVCC: see $OUT/nvcc.log"
fi

# ---------------------------------------------------------------- (c) fusekit
if ! sel fusekit; then
  :
elif echo "== (c) fusekit: gpu_linalg's complex128 cases (FK_CUDA_C128_GEMM=1)" && [ -x "$B/bin/gpu_linalg" ]; then
  # which cuBLAS files the fusekit process opens (before any case can crash)
  env FK_CUDA_C128_GEMM=1 FK_C128_FROM=0 LD_DEBUG=files timeout 300 "$B/bin/gpu_linalg" gemm_c128_opt_in_cases \
    --exact --test-threads=1 --nocapture >"$OUT/fusekit_ld_debug.log" 2>&1
  echo "fusekit opened: $(grep -oE 'file=[^ ]*cublas[^ ]*' "$OUT/fusekit_ld_debug.log" | sort -u | tr '\n' ' ')"
  resumable fusekit FK_C128_FROM env FK_CUDA_C128_GEMM=1 "$B/bin/gpu_linalg" gemm_c128_opt_in_cases --exact \
    --test-threads=1 --nocapture
  if [ -n "$TORCH_CUBLAS_DIR" ]; then
    echo "== (c') fusekit against torch's cuBLAS wheel (FK_CUBLAS_PATH / FK_CUBLASLT_PATH)"
    resumable fusekit-torch-wheel FK_C128_FROM env FK_CUDA_C128_GEMM=1 \
      FK_CUBLAS_PATH="$TORCH_CUBLAS_DIR/libcublas.so.13" FK_CUBLASLT_PATH="$TORCH_CUBLAS_DIR/libcublasLt.so.13" \
      "$B/bin/gpu_linalg" gemm_c128_opt_in_cases --exact --test-threads=1 --nocapture
  fi
  timeout 600 "$B/bin/gpu_linalg" gemm_oracle_c128 --exact --test-threads=1 --nocapture \
    >"$OUT/fusekit_default.log" 2>&1
  rc=$?
  row fusekit default "$([ $rc -eq 0 ] && echo ok || echo "FAIL rc=$rc")" "gemm_oracle_c128 (without FK_CUDA_C128_GEMM: split planes or fusekit's kernel)"
else
  row fusekit - SKIPPED "no $B/bin/gpu_linalg (run scripts/build_gpu_bundle.sh and carry .dev/bundle)"
fi

# ---------------------------------------------------------------- the table
echo
echo "---- all cases (section | case | result | description):"
cat "$TABLE"
echo
echo "---- every case that is not ok:"
awk -F'|' '$3 !~ /^ok/' "$TABLE"
echo
echo "==== complex128 GEMM diagnosis ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)); logs in $OUT"
for s in $(cut -d'|' -f1 "$TABLE" | awk '!seen[$0]++'); do
  n_ok=$(awk -F'|' -v s="$s" '$1 == s && $3 ~ /^ok/' "$TABLE" | wc -l)
  n_all=$(awk -F'|' -v s="$s" '$1 == s' "$TABLE" | wc -l)
  n_crash=$(awk -F'|' -v s="$s" '$1 == s && $3 ~ /CRASH/' "$TABLE" | wc -l)
  printf '%-22s %4d of %4d ok, %4d crashed\n' "$s" "$n_ok" "$n_all" "$n_crash"
done
