// Diagnosis of the complex128 GEMM crash (SIGSEGV inside cublasLtZZZMatmul with
// cuBLAS 13.0 on the H100; since then fusekit keeps complex128 off cuBLAS's ZGEMM,
// see src/cuda/linalg.rs and docs/linalg.md).
// Calls cublasGemmStridedBatchedEx (CUDA_C_64F, CUBLAS_COMPUTE_64F) and
// cublasZgemmStridedBatched directly, with the argument pattern fusekit uses
// (src/cuda/cublas.rs gemm_ex: row-major C = op(A) op(B) as the column-major
// C^T = op(B)^T op(A)^T, so cuBLAS's first operand is B with op_b, its second A
// with op_a, m and n swapped), the workspace fusekit gives cuBLAS (32 MiB from
// cuMemAllocFromPoolAsync on a cuMemPoolCreate pool, stream-ordered on the handle's
// stream, then cublasSetWorkspace), the primary context, and the shapes, ops,
// paddings, batches and scalars of tests/gpu_linalg.rs's complex128 cases; then
// one hypothesis at a time changed from that base.
//
// Every case runs in a forked child (CUDA is initialised only in children), so a
// crash is reported per case: ok / WRONG (rel err) / ERROR (status) / CRASH
// (signal) / TIMEOUT. Built and run by scripts/diag_c128.sh:
//   nvcc -O1 -o diag_c128 tests/c/diag_c128.cu -lcublas -lcublasLt -lcuda
//   ./diag_c128 [--list] [case-substring]
// Each case's line is printed as it completes, then a summary and the table; lines
// "TABLE|<DIAG_SECTION>|case|result|description [detail]" are for the script.
#include <cuComplex.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <library_types.h>

#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <array>
#include <vector>

enum Api { EX = 0, ZGEMM = 1 };
enum Ws { WS_POOL = 0, WS_NONE = 1, WS_MALLOC = 2, WS_POOL_SMALL = 3 };
enum PtrMode { PM_DEFAULT = 0, PM_HOST = 1, PM_DEVICE = 2 };
enum StreamKind { ST_LEGACY = 0, ST_NONBLOCKING = 1 };

struct Case {
    std::string name;
    Api api = EX;
    Ws ws = WS_POOL;
    PtrMode pm = PM_DEFAULT;
    StreamKind stream = ST_LEGACY;  // fk_gemm(..., NULL): the legacy default stream
    int op_a = 0, op_b = 0;         // fusekit's ops of A and B: 0 N, 1 T, 2 C
    int m = 17, n = 13, k = 33;
    int batch_a = 0, batch_b = 0, batch_c = 0;  // 0: 2-D operand (one matrix)
    int pad = 0;                                 // row padding, as GemmCase::pad
    int misalign = 0;        // bytes added to the A, B and C pointers (8: 8-byte aligned)
    int misalign_only_a = 0; // the offset on A only
    bool beta_zero = false;
    bool lt_handle = true;   // a cublasLt handle exists too (fusekit's slot has one)
    bool warm = false;       // a bf16/f64/complex64 GEMM ran on an earlier handle first
    bool math_default = true;
    // products (m, n, k; N,N, through the case's api) run first on the same handle,
    // unchecked: does an earlier call leave state that a later shape trips on?
    std::vector<std::array<int, 3>> prior;
};

static const char* OPN[3] = {"N", "T", "C"};

static std::string describe(const Case& c) {
    char b[512];
    snprintf(b, sizeof b, "%s %s ws=%s pm=%s stream=%s op_a=%s op_b=%s m=%d n=%d k=%d batch a/b/c=%d/%d/%d pad=%d offset=%d%s%s%s%s",
             c.api == EX ? "GemmStridedBatchedEx" : "ZgemmStridedBatched",
             c.name.c_str(),
             c.ws == WS_POOL ? "pool32MiB" : c.ws == WS_NONE ? "none" : c.ws == WS_MALLOC ? "cuMemAlloc32MiB" : "pool4MiB",
             c.pm == PM_DEFAULT ? "default" : c.pm == PM_HOST ? "host" : "device",
             c.stream == ST_LEGACY ? "legacy" : "nonblocking", OPN[c.op_a], OPN[c.op_b], c.m, c.n, c.k, c.batch_a,
             c.batch_b, c.batch_c, c.pad, c.misalign, c.misalign_only_a ? " (A only)" : "", c.beta_zero ? " beta=0" : "",
             c.lt_handle ? "" : " no-Lt-handle", c.warm ? " warm" : "");
    return b;
}

// ---------------------------------------------------------------- child side
static int g_msg_fd = -1;
static void say(const char* fmt, ...) {
    char b[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (g_msg_fd >= 0) {
        ssize_t w = write(g_msg_fd, b, strlen(b));
        (void)w;
    }
}

#define CU(x)                                                                       \
    do {                                                                            \
        CUresult r_ = (x);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                   \
            const char* s_ = 0;                                                     \
            cuGetErrorName(r_, &s_);                                                \
            say("%.*s: %s", (int)strcspn(#x, "("), #x, s_ ? s_ : "?");             \
            _exit(3);                                                               \
        }                                                                           \
    } while (0)
#define BL(x)                                                                       \
    do {                                                                            \
        cublasStatus_t s_ = (x);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                          \
            say("%.*s: %s", (int)strcspn(#x, "("), #x, cublasGetStatusName(s_));   \
            _exit(2);                                                               \
        }                                                                           \
    } while (0)

static unsigned long long g_rng = 12345;
static double urand() {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((g_rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0 - 1.0;
}

// A row-major operand as tests/linalg_ref padded(): [batch, rows, cols], row stride
// cols + pad, matrices rows * ld + bpad apart.
struct Host {
    int batch, rows, cols, ld;
    long long stride, len;
    std::vector<cuDoubleComplex> v;
};
static Host make(int batch, int rows, int cols, int pad, int bpad) {
    Host h;
    h.batch = batch ? batch : 1;
    h.rows = rows;
    h.cols = cols;
    h.ld = (rows <= 1 ? (cols > 1 ? cols : 1) : cols + pad);
    if (h.ld < 1) h.ld = 1;
    h.stride = (batch > 1) ? (long long)rows * h.ld + bpad : 0;
    long long n = (long long)(h.batch - 1) * ((long long)rows * h.ld + bpad) + (long long)rows * h.ld + 1;
    h.len = n;
    h.v.resize(n);
    for (auto& z : h.v) z = make_cuDoubleComplex(urand(), urand());
    return h;
}

static CUdeviceptr upload(CUmemoryPool pool, CUstream st, const Host& h, int offset) {
    CUdeviceptr p = 0;
    size_t bytes = h.len * sizeof(cuDoubleComplex) + 64;
    if (pool) CU(cuMemAllocFromPoolAsync(&p, bytes, pool, st));
    else CU(cuMemAlloc(&p, bytes));
    CU(cuStreamSynchronize(st));
    CU(cuMemcpyHtoD(p + offset, h.v.data(), h.len * sizeof(cuDoubleComplex)));
    return p + offset;
}

static cuDoubleComplex opel(const Host& h, int b, int op, int i, int l) {
    // element (i, l) of op(X) for matrix b
    long long base = (h.batch > 1 ? b : 0) * h.stride;
    cuDoubleComplex z = op == 0 ? h.v[base + (long long)i * h.ld + l] : h.v[base + (long long)l * h.ld + i];
    return op == 2 ? cuConj(z) : z;
}

static void warm_up(CUmemoryPool pool, CUstream st) {
    // an earlier handle (as an earlier fusekit context's slot) runs bf16-sized and
    // f64 / complex64 products, then goes away with its workspace
    cublasHandle_t h;
    BL(cublasCreate(&h));
    BL(cublasSetStream(h, (cudaStream_t)st));
    CUdeviceptr ws;
    CU(cuMemAllocFromPoolAsync(&ws, 32 << 20, pool, st));
    BL(cublasSetWorkspace(h, (void*)ws, 32 << 20));
    CUdeviceptr buf;
    CU(cuMemAllocFromPoolAsync(&buf, 3 * 128 * 128 * 16, pool, st));
    CU(cuMemsetD8Async(buf, 0, 3 * 128 * 128 * 16, st));
    double one[2] = {1, 0}, zero[2] = {0, 0};
    float onef[2] = {1, 0}, zerof[2] = {0, 0};
    void* a = (void*)buf;
    void* b = (void*)(buf + 128 * 128 * 16);
    void* c = (void*)(buf + 2 * 128 * 128 * 16);
    BL(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 128, 128, 128, onef, a, CUDA_R_16BF, 128, 0, b,
                                  CUDA_R_16BF, 128, 0, zerof, c, CUDA_R_16BF, 128, 0, 1, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    BL(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 128, 128, 128, one, a, CUDA_R_64F, 128, 0, b,
                                  CUDA_R_64F, 128, 0, zero, c, CUDA_R_64F, 128, 0, 1, CUBLAS_COMPUTE_64F,
                                  CUBLAS_GEMM_DEFAULT));
    BL(cublasGemmStridedBatchedEx(h, CUBLAS_OP_C, CUBLAS_OP_N, 64, 64, 64, onef, a, CUDA_C_32F, 64, 0, b,
                                  CUDA_C_32F, 64, 0, zerof, c, CUDA_C_32F, 64, 0, 1, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    CU(cuStreamSynchronize(st));
    BL(cublasDestroy(h));
    CU(cuMemFreeAsync(ws, st));
    CU(cuMemFreeAsync(buf, st));
    CU(cuStreamSynchronize(st));
}

static int run_case(const Case& c) {
    CU(cuInit(0));
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU(cuCtxSetCurrent(ctx));
    // fusekit's pool: pinned device memory, release threshold "never"
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool;
    CU(cuMemPoolCreate(&pool, &props));
    cuuint64_t thr = ~0ULL;
    CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
    CUstream st = 0;
    if (c.stream == ST_NONBLOCKING) CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    if (c.warm) warm_up(pool, st);

    cublasHandle_t h;
    BL(cublasCreate(&h));
    cublasLtHandle_t lt = 0;
    if (c.lt_handle) BL(cublasLtCreate(&lt));
    BL(cublasSetStream(h, (cudaStream_t)st));
    if (c.ws == WS_POOL || c.ws == WS_POOL_SMALL) {
        size_t bytes = c.ws == WS_POOL ? (32u << 20) : (4u << 20);
        CUdeviceptr ws;
        CU(cuMemAllocFromPoolAsync(&ws, bytes, pool, st));
        BL(cublasSetWorkspace(h, (void*)ws, bytes));
    } else if (c.ws == WS_MALLOC) {
        CUdeviceptr ws;
        CU(cuMemAlloc(&ws, 32u << 20));
        BL(cublasSetWorkspace(h, (void*)ws, 32u << 20));
    }
    if (c.pm == PM_HOST) BL(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
    if (c.pm == PM_DEVICE) BL(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_DEVICE));

    // GemmCase::data: A [ar, ac] (pad, 3 pad), B (pad, 1), C [m, n] (pad, 2 pad)
    int ar = c.op_a == 0 ? c.m : c.k, ac = c.op_a == 0 ? c.k : c.m;
    int br = c.op_b == 0 ? c.k : c.n, bc = c.op_b == 0 ? c.n : c.k;
    Host A = make(c.batch_a, ar, ac, c.pad, c.pad * 3);
    Host B = make(c.batch_b, br, bc, c.pad, 1);
    Host C = make(c.batch_c, c.m, c.n, c.pad, 2 * c.pad);
    int batch = C.batch;
    long long sa = A.batch > 1 ? A.stride : 0, sb = B.batch > 1 ? B.stride : 0, sc = C.batch > 1 ? C.stride : 0;
    cuDoubleComplex alpha = make_cuDoubleComplex(0.75, -0.5);
    cuDoubleComplex beta = c.beta_zero ? make_cuDoubleComplex(0, 0) : make_cuDoubleComplex(-0.5, 0.25);
    int off_a = c.misalign, off_bc = c.misalign_only_a ? 0 : c.misalign;
    CUdeviceptr da = upload(pool, st, A, off_a), db = upload(pool, st, B, off_bc), dc = upload(pool, st, C, off_bc);
    const void* pa = &alpha;
    const void* pb = &beta;
    if (c.pm == PM_DEVICE) {
        CUdeviceptr s;
        CU(cuMemAlloc(&s, 32));
        CU(cuMemcpyHtoD(s, &alpha, 16));
        CU(cuMemcpyHtoD(s + 16, &beta, 16));
        pa = (const void*)s;
        pb = (const void*)(s + 16);
    }
    cublasOperation_t ops[3] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
    for (auto& s : c.prior) {
        Host pa_ = make(0, s[0], s[2], 0, 0), pb_ = make(0, s[2], s[1], 0, 0), pc_ = make(0, s[0], s[1], 0, 0);
        CUdeviceptr qa = upload(pool, st, pa_, 0), qb = upload(pool, st, pb_, 0), qc = upload(pool, st, pc_, 0);
        fprintf(stderr, "[child] prior %dx%dx%d\n", s[0], s[1], s[2]);
        if (c.api == EX) {
            BL(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s[1], s[0], s[2], pa, (const void*)qb,
                                          CUDA_C_64F, pb_.ld, 0, (const void*)qa, CUDA_C_64F, pa_.ld, 0, pb,
                                          (void*)qc, CUDA_C_64F, pc_.ld, 0, 1, CUBLAS_COMPUTE_64F,
                                          CUBLAS_GEMM_DEFAULT));
        } else {
            BL(cublasZgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, s[1], s[0], s[2], (const cuDoubleComplex*)pa,
                                         (const cuDoubleComplex*)qb, pb_.ld, 0, (const cuDoubleComplex*)qa, pa_.ld, 0,
                                         (const cuDoubleComplex*)pb, (cuDoubleComplex*)qc, pc_.ld, 0, 1));
        }
        CU(cuStreamSynchronize(st));
    }
    fprintf(stderr, "[child] calling cuBLAS\n");
    if (c.api == EX) {
        BL(cublasGemmStridedBatchedEx(h, ops[c.op_b], ops[c.op_a], c.n, c.m, c.k, pa, (const void*)db, CUDA_C_64F,
                                      B.ld, sb, (const void*)da, CUDA_C_64F, A.ld, sa, pb, (void*)dc, CUDA_C_64F,
                                      C.ld, sc, batch, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT));
    } else {
        BL(cublasZgemmStridedBatched(h, ops[c.op_b], ops[c.op_a], c.n, c.m, c.k, (const cuDoubleComplex*)pa,
                                     (const cuDoubleComplex*)db, B.ld, sb, (const cuDoubleComplex*)da, A.ld, sa,
                                     (const cuDoubleComplex*)pb, (cuDoubleComplex*)dc, C.ld, sc, batch));
    }
    CU(cuStreamSynchronize(st));
    CU(cuCtxSynchronize());
    std::vector<cuDoubleComplex> got(C.len);
    CU(cuMemcpyDtoH(got.data(), dc, C.len * sizeof(cuDoubleComplex)));
    double num = 0, den = 0;
    for (int b = 0; b < batch; ++b)
        for (int i = 0; i < c.m; ++i)
            for (int j = 0; j < c.n; ++j) {
                cuDoubleComplex s = make_cuDoubleComplex(0, 0);
                for (int l = 0; l < c.k; ++l) s = cuCadd(s, cuCmul(opel(A, b, c.op_a, i, l), opel(B, b, c.op_b, l, j)));
                long long o = (C.batch > 1 ? b : 0) * C.stride + (long long)i * C.ld + j;
                cuDoubleComplex w = cuCmul(alpha, s);
                if (!c.beta_zero) w = cuCadd(w, cuCmul(beta, C.v[o]));
                cuDoubleComplex g = got[o];
                double dr = cuCreal(g) - cuCreal(w), di = cuCimag(g) - cuCimag(w);
                num += dr * dr + di * di;
                den += cuCreal(w) * cuCreal(w) + cuCimag(w) * cuCimag(w);
            }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    if (c.lt_handle) cublasLtDestroy(lt);
    cublasDestroy(h);
    if (!(err <= 1e-12)) {
        say("rel err %.3e", err);
        return 1;
    }
    say("rel err %.1e", err);
    return 0;
}

// ---------------------------------------------------------------- cases
static std::vector<Case> cases() {
    std::vector<Case> v;
    auto add = [&](Case c) { v.push_back(c); };
    // 1. tests/gpu_linalg.rs's complex128 cases, exactly as fusekit calls cuBLAS
    {
        Case c;
        c.name = "refused-test 5x4x3";
        c.m = 5, c.n = 4, c.k = 3;
        add(c);
    }
    int sizes[4][3] = {{1, 1, 1}, {17, 13, 33}, {64, 128, 96}, {65, 129, 70}};
    for (int oa = 0; oa < 3; ++oa)
        for (int ob = 0; ob < 3; ++ob)
            for (auto& s : sizes) {
                Case c;
                c.name = "sweep";
                c.op_a = oa, c.op_b = ob, c.m = s[0], c.n = s[1], c.k = s[2];
                add(c);
            }
    int bat[4][3] = {{3, 3, 0}, {0, 3, 2}, {1, 3, 5}, {3, 0, 1}};
    for (auto& b : bat) {
        Case c;
        c.name = "sweep-batch";
        c.op_a = 1, c.op_b = 0, c.m = 9, c.n = 11, c.k = 13;
        c.batch_a = b[0], c.batch_b = b[1], c.batch_c = 3, c.pad = b[2];
        add(c);
    }
    {
        Case c;
        c.name = "sweep-beta0";
        c.op_a = 0, c.op_b = 2, c.m = 31, c.n = 17, c.k = 5, c.beta_zero = true;
        add(c);
        Case d;
        d.name = "sweep-k0";
        d.m = 6, d.n = 7, d.k = 0;
        add(d);
    }
    // 2. the same through cublasZgemmStridedBatched
    size_t n1 = v.size();
    for (size_t i = 0; i < n1; ++i) {
        Case c = v[i];
        c.api = ZGEMM;
        add(c);
    }
    // 3. one hypothesis at a time, from the base 64x128x96 N,N (and 17x13x33 C,T)
    for (int api = 0; api < 2; ++api) {
        Case base;
        base.api = (Api)api;
        base.m = 64, base.n = 128, base.k = 96;
        auto var = [&](const char* name, auto f) {
            Case c = base;
            c.name = name;
            f(c);
            add(c);
        };
        var("H-ws-none", [](Case& c) { c.ws = WS_NONE; });
        var("H-ws-cuMemAlloc", [](Case& c) { c.ws = WS_MALLOC; });
        var("H-ws-pool-4MiB", [](Case& c) { c.ws = WS_POOL_SMALL; });
        var("H-ptrmode-host", [](Case& c) { c.pm = PM_HOST; });
        var("H-ptrmode-device", [](Case& c) { c.pm = PM_DEVICE; });
        var("H-8B-aligned-ABC", [](Case& c) { c.misalign = 8; });
        var("H-8B-aligned-A", [](Case& c) { c.misalign = 8, c.misalign_only_a = 1; });
        var("H-16B-offset-ABC", [](Case& c) { c.misalign = 16; });
        var("H-bcast-A", [](Case& c) { c.batch_a = 1, c.batch_b = 4, c.batch_c = 4; });
        var("H-bcast-B", [](Case& c) { c.batch_a = 4, c.batch_b = 0, c.batch_c = 4; });
        var("H-opC-A", [](Case& c) { c.op_a = 2; });
        var("H-opC-B", [](Case& c) { c.op_b = 2; });
        var("H-opC-both", [](Case& c) { c.op_a = 2, c.op_b = 2; });
        var("H-k0", [](Case& c) { c.k = 0; });
        var("H-m1", [](Case& c) { c.m = 1; });
        var("H-n1", [](Case& c) { c.n = 1; });
        var("H-k1", [](Case& c) { c.k = 1; });
        var("H-mnk1", [](Case& c) { c.m = c.n = c.k = 1; });
        var("H-large-m", [](Case& c) { c.m = 8192, c.n = 64, c.k = 64; });
        var("H-large-mnk", [](Case& c) { c.m = 1024, c.n = 1024, c.k = 1024; });
        var("H-stream-nonblocking", [](Case& c) { c.stream = ST_NONBLOCKING; });
        var("H-no-Lt-handle", [](Case& c) { c.lt_handle = false; });
        var("H-warm-process", [](Case& c) { c.warm = true; });
        var("H-beta0", [](Case& c) { c.beta_zero = true; });
        var("H-padded", [](Case& c) { c.pad = 3; });
        var("H-ws-none-8B-aligned", [](Case& c) { c.ws = WS_NONE, c.misalign = 8; });
        var("H-ws-none-opC", [](Case& c) { c.ws = WS_NONE, c.op_a = 2, c.op_b = 1, c.m = 17, c.n = 13, c.k = 33; });
    }
    // 4. sequences on one handle (fusekit crashed on 1x1x1 only after other products
    //    in the same process, while every case above runs in a fresh process)
    for (int api = 0; api < 2; ++api) {
        auto seq = [&](const char* name, std::vector<std::array<int, 3>> prior, int m, int n, int k, bool lt = true) {
            Case c;
            c.api = (Api)api;
            c.name = name;
            c.prior = prior;
            c.m = m, c.n = n, c.k = k;
            c.lt_handle = lt;
            add(c);
        };
        seq("S-5x4x3-then", {{5, 4, 3}}, 1, 1, 1);
        seq("S-1x1x1-then", {{1, 1, 1}}, 1, 1, 1);
        seq("S-64x128x96-then", {{64, 128, 96}}, 1, 1, 1);
        seq("S-5x4x3-then-noLt", {{5, 4, 3}}, 1, 1, 1, false);
        seq("S-5x4x3-then", {{5, 4, 3}}, 1, 2, 1);
        seq("S-5x4x3-then", {{5, 4, 3}}, 2, 1, 1);
        seq("S-5x4x3-then", {{5, 4, 3}}, 1, 1, 2);
        seq("S-5x4x3-then", {{5, 4, 3}}, 2, 2, 2);
        seq("S-5x4x3-then", {{5, 4, 3}}, 1, 64, 64);
        seq("S-5x4x3-then", {{5, 4, 3}}, 64, 1, 64);
        seq("S-5x4x3-then", {{5, 4, 3}}, 64, 64, 1);
        seq("S-5x4x3-then", {{5, 4, 3}}, 1, 1, 64);
        seq("S-5x4x3-then", {{5, 4, 3}}, 4, 3, 2);
        seq("S-17x13x33-then", {{17, 13, 33}}, 5, 4, 3);
    }
    return v;
}

// ---------------------------------------------------------------- parent side
static void versions() {
    int pipefd[2];
    if (pipe(pipefd) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        g_msg_fd = pipefd[1];
        int maj = 0, min = 0, pat = 0, drv = 0;
        cublasGetProperty(MAJOR_VERSION, &maj);
        cublasGetProperty(MINOR_VERSION, &min);
        cublasGetProperty(PATCH_LEVEL, &pat);
        cuInit(0);
        cuDriverGetVersion(&drv);
        char name[256] = "?";
        CUdevice d;
        if (cuDeviceGet(&d, 0) == CUDA_SUCCESS) cuDeviceGetName(name, sizeof name, d);
        say("cuBLAS %d.%d.%d (cublasLt %zu), driver API %d, device %s\n", maj, min, pat, cublasLtGetVersion(), drv,
            name);
        FILE* f = fopen("/proc/self/maps", "r");
        char line[1024];
        std::vector<std::string> seen;
        while (f && fgets(line, sizeof line, f)) {
            char* p = strstr(line, "/");
            if (!p || !strstr(p, "cublas")) continue;
            std::string s(p);
            if (!s.empty() && s.back() == '\n') s.pop_back();
            bool dup = false;
            for (auto& x : seen) dup |= x == s;
            if (!dup) {
                seen.push_back(s);
                say("  mapped: %s\n", s.c_str());
            }
        }
        if (f) fclose(f);
        _exit(0);
    }
    close(pipefd[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof buf - 1)) > 0) {
        buf[n] = 0;
        fputs(buf, stdout);
    }
    close(pipefd[0]);
    int status;
    waitpid(pid, &status, 0);
}

int main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    std::vector<Case> all = cases();
    bool list = argc > 1 && !strcmp(argv[1], "--list");
    const char* filter = (argc > 1 && !list) ? argv[1] : (argc > 2 ? argv[2] : NULL);
    if (list) {
        for (size_t i = 0; i < all.size(); ++i) printf("%3zu %s\n", i, describe(all[i]).c_str());
        return 0;
    }
    versions();
    std::vector<std::string> table, rows;
    const char* section = getenv("DIAG_SECTION") ? getenv("DIAG_SECTION") : "cublas";
    int crashes = 0, wrong = 0, errors = 0, oks = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        const Case& c = all[i];
        std::string d = describe(c);
        if (filter && !strstr(d.c_str(), filter)) continue;
        int pipefd[2];
        if (pipe(pipefd) != 0) return 1;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            close(pipefd[0]);
            g_msg_fd = pipefd[1];
            alarm(120);
            _exit(run_case(c));
        }
        close(pipefd[1]);
        std::string msg;
        char buf[1024];
        ssize_t n;
        while ((n = read(pipefd[0], buf, sizeof buf - 1)) > 0) {
            buf[n] = 0;
            msg += buf;
        }
        close(pipefd[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        std::string res;
        if (WIFSIGNALED(status)) {
            int sig = WTERMSIG(status);
            res = sig == SIGALRM ? "TIMEOUT" : std::string("CRASH (") + strsignal(sig) + ")";
            if (sig != SIGALRM) ++crashes;
        } else {
            int rc = WEXITSTATUS(status);
            res = rc == 0 ? "ok" : rc == 1 ? "WRONG" : "ERROR";
            (rc == 0 ? oks : rc == 1 ? wrong : errors)++;
        }
        char line[1400];
        snprintf(line, sizeof line, "%3zu %-28s %s  [%s]", i, res.c_str(), d.c_str(), msg.c_str());
        printf("%s\n", line);
        table.push_back(line);
        snprintf(line, sizeof line, "TABLE|%s|%zu|%s|%s [%s]", section, i, res.c_str(), d.c_str(), msg.c_str());
        rows.push_back(line);
    }
    printf("\n==== cuBLAS complex128 cases (%s): %d ok, %d crash, %d wrong, %d error\n", section, oks, crashes, wrong,
           errors);
    for (auto& l : table) printf("%s\n", l.c_str());
    for (auto& l : rows) printf("%s\n", l.c_str());
    return crashes || wrong || errors ? 1 : 0;
}
