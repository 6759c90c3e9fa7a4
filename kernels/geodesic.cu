// fusekit: the geodesic flow family (docs/ops.md section 5). docs/geodesic.md explains
// the design; the short version:
//
//   Gamma(v) = clamp((v U)^2 W^T, -c, c),  v [B, D],  U, W [D, R].
//
// Per row this is two small products, p = v U (a reduction over D) and
// gamma_raw = s W^T (a reduction over R). Over a tile of M rows they are GEMMs
// [M, D] x [D, R] and [M, R] x [R, D], so the fast kernels are register-tiled GEMM
// kernels with U and W resident in shared memory for the whole (persistent) block:
//
// - 256 threads = 8 warps per block, one block per SM (the smem holds U and W); the
//   TF32 Christoffel forward runs two such groups per block (chr_fwd_tc), the FFMA
//   one (chr_fwd_simt) one group with tiles of twice the rows.
//   Features are split into 8 warp slices of KW = 8*DJ columns (D padded to
//   DP = 64*DJ). Rows: tiles of M = 4*MB rows, grid-stride over tiles.
// - "Row layout" (elementwise work, state, phase B outputs): lane = (g, dg), thread
//   owns rows g + 4i (i < MB) and features w*KW + j*8 + dg (j < DJ). The leapfrog
//   keeps x, v (and the backward its adjoints) in these registers for all T steps.
// - Phase A, P[M, RP] = X[M, D] . U[D, RP]: split-K over the 8 warps (each warp its
//   own feature slice, read from its smem slice), lane tile MB rows x RA = RP/8
//   columns, then the 8 partial tiles are summed in warp order (deterministic) by
//   the whole block.
// - Phase B, raw[M, D] = S[M, RP] . W^T: row layout, K = RP, 4-wide vector loads.
// - Parameter gradients dU, dW (sums over rows): per-thread register accumulators
//   over a fixed (d, r) block, written once per block as a partial [D, R]; a second
//   kernel (geo_reduce) adds the partials in block order. No atomics: results are
//   bit-reproducible for a given device and launch configuration.
// - Shared-memory row strides are padded (RP + 4, KW + 4) so that the 16-byte
//   loads of all three access patterns are free of bank conflicts; in the vector row
//   layout (Cfg::VL) W (and the backwards' U) are unpadded with their
//   16-byte chunks XOR-swizzled instead (w_swz).
//
// The generic kernels (any D, any R; used when the fast configuration does not fit
// the device's shared memory, e.g. R > 32 or D > 1024 or f64 with large D*R) keep
// every per-row vector in a per-block global workspace (L1/L2 resident) and read U
// and W from global memory; slower, simple, unlimited sizes.
//
// The host (src/cuda/geodesic/names.rs) prepends `#define GEO_T float|double`, one of
// `GEO_MODULE_CHR_FWD`, `_CHR_BWD`, `_LF_FWD`, `_LF_BWD`, and the configuration (see
// the end of the file): one module per op, dtype and fast configuration, so a
// program compiles only the kernels it uses. It mirrors the shared-memory sizes (the
// kernels check them and trap on a mismatch).
#include "common.cuh"

#define GEO_NT 256
#define GEO_NW 8
#define GEO_GROUPS 2  // thread groups of the Christoffel forward's TF32 kernel (chr_fwd_tc)
#define GEN_RG 4

#define GEO_WANT_DV 1
#define GEO_WANT_DU 2
#define GEO_WANT_DW 4
#define GEO_WANT_DF 8
#define GEO_WANT_DX 16

// struct GeoArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source

// struct ReduceArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source

extern __shared__ __align__(32) unsigned char geo_smem[];

template <typename T> __device__ __forceinline__ T clampc(T x, T c) {
    return x < -c ? -c : (x > c ? c : x);  // NaN passes through, as torch.clamp
}
// The same with PTX max.NaN/min.NaN (sm_80+, f32): 2 instructions instead of 4.
// Same results: NaN propagates, c >= 0 (the host checks it; +inf disables the clamp).
template <typename T> __device__ __forceinline__ T clampc_fast(T x, T c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (sizeof(T) == 4) {
        float lo, r;
        asm("max.NaN.f32 %0, %1, %2;" : "=f"(lo) : "f"(x), "f"(-c));
        asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(lo), "f"(c));
        return r;
    } else {
        return clampc(x, c);
    }
#else
    return clampc(x, c);
#endif
}
// One leapfrog kick, v + h (f - clamp(raw) - mu v), evaluated as
// v + ((hf - hmu v) - h clamp(raw)) with hf = h f and hmu = h mu computed once per
// tile and feature: 2 FFMA, 1 FADD and the 2-instruction clamp per element instead
// of 7 instructions. (Folding v into a = 1 - h mu saves one more but rounds a once
// for all steps: 3x the error after 8 steps, measured.)
template <typename T> __device__ __forceinline__ T kick(T v, T hf, T hmu, T h, T raw, T c) {
    return v + ((hf - hmu * v) - h * clampc_fast(raw, c));
}
// The TF32 leapfrog's kick, v a + hf - h clamp(raw) with a = 1 - h mu: 2 FFMA and the
// clamp. Rounding a once costs ~1e-7 relative over 8 steps, far below TF32's ~1e-4.
template <typename T> __device__ __forceinline__ T kick_folded(T v, T hf, T a, T h, T raw, T c) {
    return fma(-h, clampc_fast(raw, c), fma(v, a, hf));
}
template <typename T> __device__ __forceinline__ bool passc(T x, T c) {
    return x >= -c && x <= c;  // the clamp's derivative: inclusive, 0 for NaN
}

__device__ __forceinline__ unsigned dyn_smem_size() {
    unsigned r;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

// Threads per block of the fast kernels (the host launches with the same count):
// every kernel runs one group of GEO_NT threads per block except the Christoffel
// forward's TF32 kernel (chr_fwd_tc), which runs GEO_GROUPS groups that work on
// different tiles and synchronise with named barriers (geo_group_sync). The FFMA
// kernels are launched with GEO_SIMT_NT = GEO_NT threads.
#if defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST_NT (GEO_GROUPS * GEO_NT)
#else
#define GEO_FAST_NT GEO_NT
#endif
// The thread's index in its group; the shared helpers index by it. Outside the
// Christoffel forward's module it is plain threadIdx.x.
// The index's type steers the register allocation of the register-bound backwards
// (255 registers with spills), measured on the H100: an int made the Christoffel
// backward 19% faster (0.75 -> 0.60 ms) and the leapfrog backward 8% slower
// (9.4 -> 10.1 ms), so the leapfrog backward keeps the unsigned threadIdx.x.
#if defined(GEO_MODULE_LF_BWD)
#define geo_tid() (threadIdx.x)
#else
__device__ __forceinline__ int geo_tid() {
    return GEO_FAST_NT == GEO_NT ? (int)threadIdx.x : (int)(threadIdx.x & (GEO_NT - 1));
}
#endif

// Barrier of the GEO_NT threads of group `grp` (named barrier 1 + grp; barrier 0 is
// __syncthreads). A host compilation (the CPU emulator) provides its own.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ void geo_group_sync(int grp) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(grp + 1), "n"(GEO_NT) : "memory");
}
#endif

// ---------------------------------------------------------------- vector loads
template <typename T, int N> struct __align__(sizeof(T) * N) GVec { T x[N]; };

// Loads N consecutive elements (N in {1, 2, 4, 8}); `p` is aligned to min(N, 4) elements.
template <int N, typename T> __device__ __forceinline__ void ldv(const T* p, T (&o)[N]) {
    if constexpr (N >= 4) {
#pragma unroll
        for (int k = 0; k < N; k += 4) {
            GVec<T, 4> v = *reinterpret_cast<const GVec<T, 4>*>(p + k);
#pragma unroll
            for (int e = 0; e < 4; ++e) o[k + e] = v.x[e];
        }
    } else if constexpr (N == 2) {
        GVec<T, 2> v = *reinterpret_cast<const GVec<T, 2>*>(p);
        o[0] = v.x[0];
        o[1] = v.x[1];
    } else {
        o[0] = p[0];
    }
}

// Stores N consecutive elements (N in {1, 2, 4}); `p` is aligned to N elements.
template <int N, typename T> __device__ __forceinline__ void stv(T* p, const T (&o)[N]) {
    if constexpr (N == 4 || N == 2) {
        GVec<T, N> v;
#pragma unroll
        for (int e = 0; e < N; ++e) v.x[e] = o[e];
        *reinterpret_cast<GVec<T, N>*>(p) = v;
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) p[e] = o[e];
    }
}

// ---------------------------------------------------------------- cp.async
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<uint4*>(smem) = *reinterpret_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem) : "memory");
#else
    *reinterpret_cast<uint2*>(smem) = *reinterpret_cast<const uint2*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Asks L2 for the rows [row0, row0 + M) of a [B, D] tensor (NULL or row0 >= B: no-op),
// one 128-byte line per thread and step, for a tile that a later iteration reads:
// its DRAM traffic then overlaps this tile's arithmetic, and the later loads hit L2.
// Addresses stay inside the tensor. (A hint: a no-op in host compilations.)
template <typename T>
__device__ __forceinline__ void prefetch_rows_l2(const T* p, i64 row0, int M, i64 B, i64 D) {
#if __CUDA_ARCH__ >= 800
    if (p == nullptr || row0 >= B) return;
    const char* base = reinterpret_cast<const char*>(p + row0 * D);
    const i64 bytes = (min(B, row0 + M) - row0) * D * (i64)sizeof(T);
    for (i64 off = (i64)threadIdx.x * 128; off < bytes; off += (i64)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + off));
#endif
}

// ---------------------------------------------------------------- fast path
#if defined(GEO_MODULE_CHR_FWD) || defined(GEO_MODULE_LF_FWD) || defined(GEO_MODULE_CHR_BWD) || \
    defined(GEO_MODULE_LF_BWD)
#define GEO_VL_MODULE 1
#else
#define GEO_VL_MODULE 0
#endif
// The leapfrog forward's strict f32 kernel with U and W in registers (lf_fwd_rs)
#if defined(GEO_MODULE_LF_FWD)
#define GEO_RS_MODULE 1
#else
#define GEO_RS_MODULE 0
#endif
// The backwards' phase B also runs with U (dv = dp U^T): with VL their U is swizzled
// as W, and phase A reads both swizzled (Cfg::UZ).
#if defined(GEO_MODULE_CHR_BWD) || defined(GEO_MODULE_LF_BWD)
#define GEO_UZ_MODULE 1
#else
#define GEO_UZ_MODULE 0
#endif
template <typename T_, int RP_, int DJ_, int MB_, bool TC_ = false, bool X3_ = false> struct Cfg {
    typedef T_ T;
    // TF32 tensor cores (mma.sync.m16n8k8) for phases A and B: f32 forwards only,
    // M = 16, D <= 512; the row layout follows the MMA accumulator layout
    static constexpr bool TC = TC_;
    // 3xTF32 (`FK_GEO_ALLOW_TF32X3`, the leapfrog forward): each product as
    // hi*hi + hi*lo + lo*hi of TF32 parts, f32-level accuracy on the tensor cores
    static constexpr bool X3 = X3_;
    static constexpr int RP = RP_;  // R padded (8, 16, 32)
    static constexpr int DJ = DJ_;  // feature groups of 8 per thread (D padded to 64*DJ)
    static constexpr int MB = MB_;  // rows per thread (tile = 4*MB rows)
    static constexpr int M = 4 * MB;
    static constexpr int KW = 8 * DJ;          // features per warp slice
    static constexpr int DP = GEO_NW * KW;     // padded D
    static constexpr int SU = RP + 4;          // row stride of W, P, S, DP (and U) in smem
    static constexpr int SV = KW + 4;          // row stride of a warp slice
    static constexpr int SLICE = M * (SV > SU ? SV : SU);  // a warp slice (also holds a [M][SU] partial)
    static constexpr int PSL = X3 ? M * SU : SLICE;        // a warp's partial in the gamma_regs of X3
    static constexpr int RA = RP / 8;          // phase A: columns per lane
    static constexpr int PV = DJ >= 4 ? 4 : DJ;  // parameter layout: features per vector
    static constexpr int NB = DJ / PV;
    static constexpr int RQ = RP / 4;          // parameter layout: columns per lane
    static constexpr int NPAR = DJ * RP / 4;   // parameter accumulators per thread
    // The vector row layout (the FFMA kernels: both forwards and both backwards, f32,
    // RP = 32, DJ = 4 or 8): a thread's features are float4 groups (Rows, phase_b_v),
    // W swizzled in smem (w_swz; in the backward U too, UZ)
    static constexpr bool VL = GEO_VL_MODULE && !TC && sizeof(T) == 4 && RP == 32 && (DJ == 4 || DJ == 8);
    static constexpr int TI = TC ? 2 : MB;     // row-layout tile per thread: rows
    static constexpr int TJ = TC ? 2 * DJ : DJ;  // and columns
    // shared memory of each fast kernel, in elements (src/cuda/geodesic/plan.rs mirrors these)
    // the FFMA forwards (chr_fwd_simt: one group, one tile buffer and S); with VL, W
    // as [DP][RP] (swizzled, w_swz) instead of [DP][SU]
    static constexpr int SW = VL ? RP : SU;
    static constexpr bool UZ = VL && GEO_UZ_MODULE;  // U in w_swz order too
    static constexpr int SUZ = UZ ? RP : SU;         // U's row stride
    static constexpr int SMEM_CHR_FWD = DP * SU + DP * SW + GEO_NW * SLICE + M * SU;
    static constexpr int SMEM_LF_FWD = DP * SU + DP * SW + GEO_NW * SLICE + M * SU;
    static constexpr int SMEM_LF_FWD_TC = GEO_NW * SLICE + M * SU + 2 * M * DP + DP;  // U, W in registers (RegFrags); x, hf stashed, 1 - h mu
    static constexpr int SMEM_LF_STAGE = GEO_NW * SLICE;  // the leapfrog's optional v stage (lf_fwd_fast)
    // the strict f32 leapfrog forward with U and W in registers (lf_fwd_rs:
    // 16 < R <= 32, 256 < D <= 512): two buffers of the tile's v, x, f, the warps'
    // partials and S
    static constexpr bool RS = GEO_RS_MODULE && !TC && sizeof(T) == 4 && RP == 32 && DJ == 8;
    static constexpr int SMEM_LF_FWD_RS = 6 * M * DP + GEO_NW * M * RP + M * RP;
    // X3: the partials, S's hi and lo parts, the stash, and U's and W's lo parts in
    // fragment order (no v stage)
    static constexpr int SMEM_LF_FWD_TC3 = GEO_NW * M * SU + 2 * M * SU + 2 * M * DP + DP + 2 * DP * RP;
    // the TF32 Christoffel forward (chr_fwd_tc): U and W in fragment order, per group
    // the warps' partials and S
    static constexpr int SMEM_CHR_FWD_TC = 2 * DP * RP + GEO_GROUPS * (GEO_NW + 1) * M * SU;
    static constexpr int SMEM_CHR_BWD = DP * SUZ + DP * SW + 2 * GEO_NW * SLICE + 3 * M * SU;
    static constexpr int SMEM_LF_BWD = DP * SUZ + DP * SW + 2 * GEO_NW * SLICE + 5 * M * SU + 2 * M * DP;
    static_assert(!TC || (MB == 4 && DJ <= 8 && sizeof(T) == 4), "TF32 configurations: f32, M = 16, D <= 512");
    static_assert(!X3 || TC, "3xTF32 is a TF32 configuration");
};

// Largest opt-in shared memory per block of the supported GPUs (227 KB on sm_90);
// configurations above it are compiled as stubs and never chosen by the host.
#define GEO_SMEM_MAX 232448

// TF32 helpers: round to TF32 (cvt.rna: nearest, ties away) and the warp-wide
// D += A B of mma.sync.m16n8k8 (A 16x8 row-major, B 8x8 column-major, f32 accumulate).
// A host compilation (the CPU emulator, tests/emu/emu.h) provides its own.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float geo_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}
// An mma operand rounded to TF32 by one integer add: half a TF32 ulp on the bit
// pattern. The mma ignores the 13 low bits, so finite values round to nearest, ties
// away from zero, as cvt.rna (which takes 3 instructions on sm_90); +-inf becomes NaN.
__device__ __forceinline__ float geo_tf32_op(float x) { return __uint_as_float(__float_as_uint(x) + 0x1000u); }
// 3xTF32: x = hi + lo with hi exactly x rounded to TF32 (nearest, ties away: the same
// add, then the 13 low bits cleared) and lo = x - hi (exact in f32) as an mma operand
__device__ __forceinline__ void geo_split(float x, float& hi, float& lo) {
    hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    lo = geo_tf32_op(x - hi);
}
__device__ __forceinline__ void geo_mma_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
                   "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#else
    __trap();
#endif
}
#endif

// The fast kernels' prologue, U and W into shared memory once per block: element i
// (i < NTOT, i = threadIdx.x + k NTH for the block's NTH threads) of both is read by
// `ld(i, u, w)` and written by `st(i, u, w)`. The loads of GEO_FILL_KB consecutive k
// are all issued before their stores, so a thread waits one global-memory latency per
// batch: as a load-then-store loop (unrolled by 4 by the compiler) the prologue took
// 10-18 us per launch, the time of 10-20 tiles (H100, D = 512, R = 32; measured).
// Element (f, r) of W in the vector layout's smem order (Cfg::VL, RP = 32): row f of 32,
// its 16-byte chunks permuted by (f >> 2) & 7 (phase_b_v says why).
__device__ __forceinline__ constexpr int w_swz(int f, int r) { return f * 32 + ((((r >> 2) ^ (f >> 2)) & 7) << 2) + (r & 3); }

#define GEO_FILL_KB 24
template <int NTOT, int NTH, typename V, typename Ld, typename St>
__device__ __forceinline__ void fill_uw(Ld ld, St st) {
    constexpr int N = (NTOT + NTH - 1) / NTH, KB = GEO_FILL_KB;
#pragma unroll 1
    for (int k0 = 0; k0 < N; k0 += KB) {
        V u[KB], w[KB];
#pragma unroll
        for (int k = 0; k < KB; ++k) {
            const int i = (int)threadIdx.x + (k0 + k) * NTH;
            if (k0 + k < N && (NTOT % NTH == 0 || i < NTOT)) ld(i, u[k], w[k]);
        }
#pragma unroll
        for (int k = 0; k < KB; ++k) {
            const int i = (int)threadIdx.x + (k0 + k) * NTH;
            if (k0 + k < N && (NTOT % NTH == 0 || i < NTOT)) st(i, u[k], w[k]);
        }
    }
}

// U and W [D, R] (global) into smem [DP][LD] each, zero padded (the FFMA kernels; the
// TF32 ones use load_frags), by the NTH threads of the block; with Cfg::VL, W as
// [DP][RP] in w_swz order (U too with Cfg::UZ).
template <class C, int LD, int NTH = GEO_FAST_NT>
__device__ void load_uw(typename C::T* Us, typename C::T* Ws, const typename C::T* U, const typename C::T* W,
                        i64 D, i64 R) {
    typedef typename C::T T;
    fill_uw<C::DP * LD, NTH, T>(
        [&](int idx, T& u, T& w) {
            const int d = idx / LD, r = idx - d * LD;
            const bool in = d < D && r < R;
            const i64 at = in ? (i64)d * R + r : 0;
            u = in ? U[at] : T(0);
            w = in ? W[at] : T(0);
        },
        [&](int idx, T u, T w) {
            if constexpr (C::VL) {
                const int d = idx / LD, r = idx - d * LD;
                if constexpr (C::UZ) {
                    if (r < C::RP) Us[w_swz(d, r)] = u;
                } else {
                    Us[idx] = u;
                }
                if (r < C::RP) Ws[w_swz(d, r)] = w;
            } else {
                Us[idx] = u;
                Ws[idx] = w;
            }
        });
}

// Row layout (FFMA kernels): rows row0 + g + 4i, features w*KW + 8j + dg, with
// lane = 8g + dg; with Cfg::VL (the vector layout) features w*KW + 32(j/4) + 4dg +
// (j%4). TC kernels: the mma accumulator layout, lane = 4g + t, rows row0 + g + 8i
// (i < 2), features w*KW + 8(j/2) + 2t + (j%2). Element (i, j) of a [B, D] matrix is
// at `off + roff(i)*D + coff(j)`: one base offset per thread and immediate offsets, so
// that hoisted addresses cost few registers.
template <class C> struct Rows {
    typedef typename C::T T;
    typedef T Tile[C::TI][C::TJ];
    int g, c, w;  // first row in the tile, first column in the warp slice, warp
    i64 row0, off, D;
    i64 rlim;  // rows left from this thread's first row
    int dlim;  // features left from this thread's first feature
    static constexpr int roff(int i) { return C::TC ? 8 * i : 4 * i; }
    static constexpr int coff(int j) { return C::TC ? 8 * (j >> 1) + (j & 1) : C::VL ? 32 * (j >> 2) + (j & 3) : 8 * j; }
    static constexpr int JS = C::TC ? 2 : C::VL ? 4 : 1;  // adjacent columns of a vector
    __device__ Rows(i64 r0, i64 B, i64 D_) {
        const int lane = geo_tid() & 31;
        w = geo_tid() >> 5;
        g = C::TC ? lane >> 2 : lane >> 3;
        c = C::TC ? 2 * (lane & 3) : C::VL ? 4 * (lane & 7) : lane & 7;
        row0 = r0;
        D = D_;
        const i64 c0 = w * C::KW + c;
        off = (r0 + g) * D + c0;
        rlim = B - (r0 + g);
        dlim = (int)min(D - c0, (i64)(8 * C::DJ));
    }
    __device__ __forceinline__ int col(int j) const { return w * C::KW + c + coff(j); }
    __device__ __forceinline__ bool colok(int j) const { return coff(j) < dlim; }
    __device__ __forceinline__ bool ok(int i, int j) const { return roff(i) < rlim && coff(j) < dlim; }
    // src [B, D] (NULL: zeros). With `pair`, the JS adjacent columns j .. j + JS - 1
    // (j a multiple of JS) move as one vector where all are in range: TC layout 8
    // bytes, VL 16 (the caller checks that the tensors and rows are aligned to it);
    // the row layout (JS = 1): ignored.
    __device__ __forceinline__ void load(Tile& o, const T* src, bool pair = false) const {
#pragma unroll
        for (int i = 0; i < C::TI; ++i) {
            const T* p = src + off + roff(i) * D;
            const bool rok = src != nullptr && roff(i) < rlim;
#pragma unroll
            for (int j = 0; j < C::TJ; j += JS) {
                if (JS > 1 && pair && rok && coff(j + JS - 1) < dlim) {
                    T pr[JS];
                    ldv<JS>(p + coff(j), pr);
#pragma unroll
                    for (int e = 0; e < JS; ++e) o[i][j + e] = pr[e];
                } else {
#pragma unroll
                    for (int e = 0; e < JS; ++e) o[i][j + e] = (rok && colok(j + e)) ? p[coff(j + e)] : T(0);
                }
            }
        }
    }
    __device__ __forceinline__ void store(const Tile& o, T* dst, bool pair = false) const {
#pragma unroll
        for (int i = 0; i < C::TI; ++i) {
            T* p = dst + off + roff(i) * D;
            if (roff(i) >= rlim) continue;
#pragma unroll
            for (int j = 0; j < C::TJ; j += JS) {
                if (JS > 1 && pair && coff(j + JS - 1) < dlim) {
                    T pr[JS];
#pragma unroll
                    for (int e = 0; e < JS; ++e) pr[e] = o[i][j + e];
                    stv<JS>(p + coff(j), pr);
                } else {
#pragma unroll
                    for (int e = 0; e < JS; ++e)
                        if (colok(j + e)) p[coff(j + e)] = o[i][j + e];
                }
            }
        }
    }
    // store() without per-element bounds checks where the whole tile is in range
    __device__ __forceinline__ void store_fast(const Tile& o, T* dst, bool pair = false) const {
        if (rlim > roff(C::TI - 1) && dlim > coff(C::TJ - 1) && (JS == 1 || pair)) {
#pragma unroll
            for (int i = 0; i < C::TI; ++i) {
                T* p = dst + off + roff(i) * D;
#pragma unroll
                for (int j = 0; j < C::TJ; j += JS) {
                    T pr[JS];
#pragma unroll
                    for (int e = 0; e < JS; ++e) pr[e] = o[i][j + e];
                    stv<JS>(p + coff(j), pr);
                }
            }
        } else {
            store(o, dst, pair);
        }
    }
    // A tile parked in shared memory, private to its thread (`st` = stash + 4 * thread):
    // element q = i TJ + j at st + (q / 4) 4 NT + q % 4, so 4 consecutive elements are one
    // conflict-free 16-byte vector and no barriers are needed.
    static __device__ __forceinline__ T* stash_at(T* st, int q) { return st + (q >> 2) * 4 * GEO_NT + (q & 3); }
    // src [B, D] (NULL: zeros) into the stash: cp.async for the JS = 2 pairs of the TC
    // layout where `pair` allows (the caller waits for them), plain copies elsewhere
    __device__ __forceinline__ void stash_async(T* st, const T* src, bool pair) const {
        static_assert(C::TC, "the TC row layout");
#pragma unroll
        for (int i = 0; i < C::TI; ++i) {
            const T* p = src + off + roff(i) * D;
            const bool rok = src != nullptr && roff(i) < rlim;
#pragma unroll
            for (int j = 0; j < C::TJ; j += 2) {
                T* d = stash_at(st, i * C::TJ + j);
                if (pair && rok && coff(j + 1) < dlim) {
                    cp_async8(d, p + coff(j));
                } else {
#pragma unroll
                    for (int e = 0; e < 2; ++e) d[e] = (rok && colok(j + e)) ? p[coff(j + e)] : T(0);
                }
            }
        }
    }
    __device__ __forceinline__ void from_stash(Tile& o, T* st) const {
#pragma unroll
        for (int q = 0; q < C::TI * C::TJ; q += 4) {
            T q4[4];
            ldv<4>(stash_at(st, q), q4);
#pragma unroll
            for (int e = 0; e < 4; ++e) o[(q + e) / C::TJ][(q + e) % C::TJ] = q4[e];
        }
    }
    // into the warp's own smem slice [M][SV] (FFMA kernels: the TF32 ones take their A
    // fragments from registers); the __syncwarp orders the write after every earlier
    // read of the slice by the warp's lanes (they need not be converged)
    __device__ __forceinline__ void to_slice(const Tile& o, T* slice) const {
        __syncwarp();
        if constexpr (C::VL) {
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; j += 4) {
                    const T q4[4] = {o[i][j], o[i][j + 1], o[i][j + 2], o[i][j + 3]};
                    stv<4>(slice + (g + roff(i)) * C::SV + c + coff(j), q4);
                }
        } else {
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) slice[(g + roff(i)) * C::SV + c + coff(j)] = o[i][j];
        }
    }
    // from the warp's own slice [M][SV] (to_slice's inverse; load_tile's layout)
    __device__ __forceinline__ void from_slice(Tile& o, const T* slice) const {
#pragma unroll
        for (int i = 0; i < C::TI; ++i)
#pragma unroll
            for (int j = 0; j < C::TJ; ++j) o[i][j] = slice[(g + roff(i)) * C::SV + c + coff(j)];
    }
};

// Phase A over the warp's feature slice: acc[i][j] = sum_k X[am + 4i][k] M[k][ar*RA + j].
// `xs`: the warp's slice [M][SV]; `mat`: the first of the slice's rows of U or W ([KW][SU];
// with Cfg::UZ [KW][RP] in w_swz order).
template <class C>
__device__ __forceinline__ void phase_a(const typename C::T* xs, const typename C::T* mat, int lane,
                                        typename C::T (&acc)[C::MB][C::RA]) {
    typedef typename C::T T;
    const int am = lane >> 3, ar = lane & 7;
#pragma unroll
    for (int i = 0; i < C::MB; ++i)
#pragma unroll
        for (int j = 0; j < C::RA; ++j) acc[i][j] = T(0);
    const T* mrow = mat + (C::UZ ? 0 : ar * C::RA);
#pragma unroll 2
    for (int k = 0; k < C::KW; k += 4) {
        T xv[C::MB][4];
#pragma unroll
        for (int i = 0; i < C::MB; ++i) ldv<4>(xs + (am + 4 * i) * C::SV + k, xv[i]);
        // UZ: the matrix in w_swz order, chunk ar of rows k .. k + 3 at chunk ar ^ (k/4)
        // (the slice starts at a multiple of 32 rows)
        const int co = C::UZ ? ((ar ^ (k >> 2)) & 7) << 2 : 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            T mv[C::RA];
            ldv<C::RA>(mrow + (k + q) * C::SUZ + co, mv);
#pragma unroll
            for (int i = 0; i < C::MB; ++i)
#pragma unroll
                for (int j = 0; j < C::RA; ++j) acc[i][j] = fma(xv[i][q], mv[j], acc[i][j]);
        }
    }
}

// Phase A of the FFMA Christoffel forward for M = 32, RP = 32: the warp's partial
// [32][32] over its slice, straight into the (consumed) slice `xs` as [M][SU]. The
// lanes form two halves h that take alternate 4-column k chunks (8t + 4h); lane
// (h, am, ar) = (lane >> 4, (lane >> 2) & 3, lane & 3) accumulates 8 rows x 8 columns
// (8ar .. 8ar + 7): 12 floats from shared memory per 4 x 64 FFMA (0.25 per FFMA; the
// 8 x 4 tile of phase_a: 0.375). Accumulator row i is row am + 16h + 4i (i < 4), else
// am + 16(1 - h) + 4(i - 4), so one xor-16 shuffle adds the partner's half of the
// rows to the rows this lane keeps (am + 16h + 4i, i < 4): no selects.
template <class C>
__device__ __forceinline__ void phase_a_w(typename C::T* xs, const typename C::T* mat, int lane) {
    typedef typename C::T T;
    static_assert(C::M == 32 && C::RP == 32 && C::KW % 8 == 0, "phase_a_w: M = RP = 32");
    const int h = lane >> 4, am = (lane >> 2) & 3, ar = lane & 3;
    T acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = T(0);
    const T* xa = xs + (am + 16 * h) * C::SV + 4 * h;         // rows i < 4
    const T* xb = xs + (am + 16 * (1 - h)) * C::SV + 4 * h;   // rows i >= 4
    const T* mrow = mat + 4 * h * C::SU + 8 * ar;
#pragma unroll 2
    for (int k = 0; k < C::KW; k += 8) {
        T xv[8][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            ldv<4>(xa + 4 * i * C::SV + k, xv[i]);
            ldv<4>(xb + 4 * i * C::SV + k, xv[4 + i]);
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            T mv[8];
            ldv<8>(mrow + (k + q) * C::SU, mv);
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fma(xv[i][q], mv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[4 + i][j], 16);
    __syncwarp();  // every lane's reads of the slice are done
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        T* p = xs + (am + 16 * h + 4 * i) * C::SU + 8 * ar;
        const T lo[4] = {acc[i][0], acc[i][1], acc[i][2], acc[i][3]};
        const T hi[4] = {acc[i][4], acc[i][5], acc[i][6], acc[i][7]};
        stv<4>(p, lo);
        stv<4>(p + 4, hi);
    }
}

// A warp's partial [M][RP] tile (stride SU) into its slice `part`.
template <class C>
__device__ __forceinline__ void store_part(typename C::T* part, const typename C::T (&acc)[C::MB][C::RA], int lane) {
    const int am = lane >> 3, ar = lane & 7;
#pragma unroll
    for (int i = 0; i < C::MB; ++i) stv<C::RA>(part + (am + 4 * i) * C::SU + ar * C::RA, acc[i]);
}

// Sums the 8 warps' partials (warp w's [M][SU] at parts + w * WS) in warp order:
// epi(m, r, sum). Unrolled over a compile-time count with one base pointer, so that
// every load is base + immediate (RP is a power of two: m and r are a shift and a
// mask); as a loop with index arithmetic it cost ~68 instructions per element (H100:
// TF32 leapfrog T = 8 -4%, strict -2%). The backwards kept the loop while their register
// allocation spilled more unrolled; in the vector layout (and, in the Christoffel
// backward, with g loaded after the Gamma recompute) unrolled is faster there too
// (H100 b2b: leapfrog backward 9.08 -> 8.85 ms, Christoffel backward 0.4426 -> 0.4373).
template <class C, int WS = C::SLICE, typename Epi>
__device__ __forceinline__ void reduce_parts(const typename C::T* parts, Epi epi) {
    typedef typename C::T T;
    constexpr int N = C::M * C::RP, K = (N + GEO_NT - 1) / GEO_NT;
    constexpr int DM = GEO_NT / C::RP;  // rows per k
    static_assert((C::RP & (C::RP - 1)) == 0 && GEO_NT % C::RP == 0, "RP a power of two dividing GEO_NT");
    const int tid = geo_tid();
    const int m0 = tid / C::RP, r = tid % C::RP;
    const T* p = parts + m0 * C::SU + r;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        if (N % GEO_NT == 0 || tid + k * GEO_NT < N) {
            T s = p[k * DM * C::SU];
#pragma unroll
            for (int w = 1; w < GEO_NW; ++w) s += p[w * WS + k * DM * C::SU];
            epi(m0 + k * DM, r, s);
        }
    }
}

// Phase B, row layout: acc[i][j] = sum_r S[g + 4i][r] M[w*KW + j*8 + dg][r].
template <class C>
__device__ __forceinline__ void phase_b(const typename C::T* S, const typename C::T* mat, int lane,
                                        typename C::T (&acc)[C::MB][C::DJ]) {
    typedef typename C::T T;
    const int w = geo_tid() >> 5, g = lane >> 3, dg = lane & 7;
#pragma unroll
    for (int i = 0; i < C::MB; ++i)
#pragma unroll
        for (int j = 0; j < C::DJ; ++j) acc[i][j] = T(0);
    const T* mbase = mat + (w * C::KW + dg) * C::SU;
#pragma unroll 2
    for (int r0 = 0; r0 < C::RP; r0 += 4) {
        T sv[C::MB][4];
#pragma unroll
        for (int i = 0; i < C::MB; ++i) ldv<4>(S + (g + 4 * i) * C::SU + r0, sv[i]);
#pragma unroll
        for (int j = 0; j < C::DJ; ++j) {
            T mv[4];
            ldv<4>(mbase + j * 8 * C::SU + r0, mv);
#pragma unroll
            for (int i = 0; i < C::MB; ++i)
#pragma unroll
                for (int q = 0; q < 4; ++q) acc[i][j] = fma(sv[i][q], mv[q], acc[i][j]);
        }
    }
}

// Phase B in the vector layout (Cfg::VL): lane (g, dg) = (lane >> 3, lane & 7) owns
// rows g + 4i (i < MB) and features w*KW + 32h + 4dg + q (h < KW/32, q < 4), Rows' VL
// layout, so that rows leave as 16-byte vectors (in the row layout, features 8j + dg,
// the FFMA Christoffel forward took 4 times the store instructions: ncu put ~10% of its
// stall samples on them, LG throttle). W is [DP][RP] in w_swz order: the 8 lanes of a
// quarter warp (one g, dg = 0..7) read rows 4dg + q, which a plain row stride would put
// on 2 bank groups (4-way conflicts); swizzled they hit 8. Per 4 r: MB + DJ LDS.128
// feed 4 MB DJ FFMA (as phase_b).
template <class C>
__device__ __forceinline__ void phase_b_v(const typename C::T* S, const typename C::T* Wz, int lane,
                                          typename C::T (&acc)[C::MB][C::DJ]) {
    typedef typename C::T T;
    static_assert(C::VL && C::KW == 8 * C::DJ && C::KW % 32 == 0, "phase_b_v: the vector layout");
    constexpr int NH = C::KW / 32;
    const int w = geo_tid() >> 5, g = lane >> 3, dg = lane & 7;
#pragma unroll
    for (int i = 0; i < C::MB; ++i)
#pragma unroll
        for (int j = 0; j < C::DJ; ++j) acc[i][j] = T(0);
    // (f >> 2) & 7 = dg for every feature of this lane (KW/4 is a multiple of 8)
    const T* wrow = Wz + (w * C::KW + 4 * dg) * 32;
    const T* srow = S + g * C::SU;
#pragma unroll 2
    for (int r0 = 0; r0 < 32; r0 += 4) {
        T sv[C::MB][4];
#pragma unroll
        for (int i = 0; i < C::MB; ++i) ldv<4>(srow + 4 * i * C::SU + r0, sv[i]);
        const int co = (((r0 >> 2) ^ dg) & 7) << 2;
#pragma unroll
        for (int h = 0; h < NH; ++h)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                T mv[4];
                ldv<4>(wrow + (32 * h + q) * 32 + co, mv);
#pragma unroll
                for (int i = 0; i < C::MB; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[i][4 * h + q] = fma(sv[i][e], mv[e], acc[i][4 * h + q]);
            }
    }
}

// Parameter gradient: acc[(b*PV + jj)*RQ + k] += sum_m X[m][b*8*PV + dq*PV + jj] Y[m][rq*RQ + k]
// (X: the warp's slice, Y: [M][SU]); the thread's (d, r) block is fixed for the kernel.
template <class C>
__device__ __forceinline__ void param_acc(const typename C::T* xs, const typename C::T* Y, int lane,
                                          typename C::T (&acc)[C::NPAR]) {
    typedef typename C::T T;
    const int dq = lane & 7, rq = lane >> 3;
#pragma unroll 2
    for (int m = 0; m < C::M; ++m) {
        T xv[C::NB][C::PV];
#pragma unroll
        for (int b = 0; b < C::NB; ++b) ldv<C::PV>(xs + m * C::SV + b * 8 * C::PV + dq * C::PV, xv[b]);
        T yv[C::RQ];
        ldv<C::RQ>(Y + m * C::SU + rq * C::RQ, yv);
#pragma unroll
        for (int b = 0; b < C::NB; ++b)
#pragma unroll
            for (int jj = 0; jj < C::PV; ++jj)
#pragma unroll
                for (int k = 0; k < C::RQ; ++k)
                    acc[(b * C::PV + jj) * C::RQ + k] = fma(xv[b][jj], yv[k], acc[(b * C::PV + jj) * C::RQ + k]);
    }
}

// This block's partial of dU or dW, coalesced: in the parameter layout's order,
// `GEO_NT` consecutive elements per accumulator index, DP x RP elements, padding
// included; geo_reduce maps it back to [D][R]. Stored as [D][R] directly, a warp's
// store wrote 4 useful bytes per 32-byte sector: ~25 us per block (H100, D = 512,
// R = 32: dU and dW cost the Christoffel backward 46 - 18 = 28 us at one tile); the
// Christoffel backward ran 4.7% faster coalesced (0.526 -> 0.501 ms b2b), the leapfrog
// backward, once in the vector layout and with the reduction unrolled, 4.5% (9.08 ->
// 8.67 ms b2b; before the vector layout its register allocation made it 0.5-1% slower).
// `param_part`: the block's slot among the grid's partials; the host mirrors the
// layout (PartLayout in src/cuda/geodesic/plan.rs).
template <class C> __device__ __forceinline__ typename C::T* param_part(u64 parts, const GeoArgs& a) {
    return reinterpret_cast<typename C::T*>(parts) + (i64)blockIdx.x * C::DP * C::RP;
}
template <class C> __device__ __forceinline__ void param_store(const typename C::T (&acc)[C::NPAR], typename C::T* out) {
#pragma unroll
    for (int q = 0; q < C::NPAR; ++q) out[q * GEO_NT + threadIdx.x] = acc[q];
}

// ---------------------------------------------------------------- TF32 tensor-core phases
// Lane = 4g + t. U and W live in shared memory in mma fragment order (TF32-rounded
// once), so that B fragments are conflict-free vector loads:
//   U: fragment (o = w*KS + s, n) of lane: U[kmap(w, s, t, e)][8n + g]    (phase A, n < NR)
//   W: fragment (o = w*NR + s, n) of lane: W[w*KW + 8n + g][8s + t + 4e]  (phase B, n < KS)
// with a lane's fragments of n-tiles 2m and 2m + 1 side by side where the n count is
// even (`Frags`: one 16-byte load for two mma), else one 8-byte load each.
// `kmap` is the kernel's order of the k positions t (e = 0) and t + 4 (e = 1) of
// k-step s within warp w's feature slice: a permutation of the summation order that
// lets each lane supply its A fragments from the values it already holds (registers).
template <int NIN> struct Frags {
    static constexpr int P = NIN % 2 == 0 ? 2 : 1;  // fragments per load
    // element e of fragment (o, n) of `lane`, in floats
    static __device__ __forceinline__ constexpr int off(int o, int n, int lane, int e) {
        return (((o * NIN + n) / P * 32 + lane) * P + n % P) * 2 + e;
    }
    // off's inverse: the (o, n, lane, e) stored at float `idx`
    static __device__ __forceinline__ void at(int idx, int& o, int& n, int& lane, int& e) {
        e = idx & 1;
        lane = (idx >> P) & 31;
        const int blk = (idx >> (P + 5)) * P + (P == 2 ? (idx >> 1) & 1 : 0);  // o * NIN + n
        o = blk / NIN;
        n = blk % NIN;
    }
    // the B fragments of n-tiles n, n + P - 1 (n a multiple of P) of outer index o
    static __device__ __forceinline__ void load(const float* base, int o, int n, float (&b)[P][2]) {
        float q[2 * P];
        ldv<2 * P>(base + off(o, n, 0, 0), q);
#pragma unroll
        for (int k = 0; k < P; ++k) b[k][0] = q[2 * k], b[k][1] = q[2 * k + 1];
    }
};
// (LO: the 3xTF32 low parts x - tf32(x) instead, TF32-rounded)
template <class C, bool LO = false, class KMap>
__device__ void load_frags(float* Uf, float* Wf, const float* U, const float* W, i64 D, i64 R, KMap kmap) {
    constexpr int KS = C::KW / 8, NR = C::RP / 8;
    fill_uw<C::DP * C::RP, GEO_FAST_NT, float>(
        [&](int idx, float& u, float& w) {
            int o, n, ln, e;
            Frags<NR>::at(idx, o, n, ln, e);  // o = w*KS + s
            const int k = kmap(o / KS, o % KS, ln & 3, e), r = 8 * n + (ln >> 2);
            u = (k < D && r < R) ? U[(i64)k * R + r] : 0.f;
            Frags<KS>::at(idx, o, n, ln, e);  // o = w*NR + s
            const int d = (o / NR) * C::KW + 8 * n + (ln >> 2), rw = 8 * (o % NR) + (ln & 3) + 4 * e;
            w = (d < D && rw < R) ? W[(i64)d * R + rw] : 0.f;
        },
        [&](int idx, float u, float w) {
            Uf[idx] = LO ? geo_tf32(u - geo_tf32(u)) : geo_tf32(u);
            Wf[idx] = LO ? geo_tf32(w - geo_tf32(w)) : geo_tf32(w);
        });
}

// Where the B fragments of a phase come from: `SmemFrags` (Frags<NIN> order in shared
// memory, offset by the lane: P fragments per 8- or 16-byte load) or `RegFrags` (the
// TF32 leapfrog: the warp's fragments of U and W held in registers for the launch).
// `load(o, n, b)`: fragments (o, n .. n + P - 1), o the k-step.
template <int NIN> struct SmemFrags {
    static constexpr int P = Frags<NIN>::P;
    static constexpr bool LO = true;  // as the low parts of a 3xTF32 phase
    const float* base;
    __device__ __forceinline__ void load(int o, int n, float (&b)[P][2]) const { Frags<NIN>::load(base, o, n, b); }
};
// The B-side low parts of a phase without 3xTF32.
struct NoLo {
    static constexpr int P = 1;
    static constexpr bool LO = false;
    __device__ __forceinline__ void load(int, int, float (&)[1][2]) const {}
};
// Fragments (o, n .. n + Q - 1) of source `bs`, whose loads move BS::P of them.
template <int Q, class BS> __device__ __forceinline__ void frags_q(const BS& bs, int o, int n, float (&b)[Q][2]) {
    if constexpr (BS::P == Q) {
        bs.load(o, n, b);
    } else {
        static_assert(BS::P == 1, "frags_q: one fragment per load");
#pragma unroll
        for (int k = 0; k < Q; ++k) {
            float t[1][2];
            bs.load(o, n + k, t);
            b[k][0] = t[0][0];
            b[k][1] = t[0][1];
        }
    }
}
template <class C> struct RegFrags {
    static constexpr int KS = C::KW / 8, NR = C::RP / 8;
    float u[KS][NR][2];  // phase A: k-step s (of the warp's feature slice), n-tile n (of RP)
    float w[NR][KS][2];  // phase B: k-step s (of RP), n-tile n (of the warp's features)
    // 3xTF32 (C::X3): the warp's low parts of U and W in shared memory (load_frags<C, true>)
    SmemFrags<NR> ulo{nullptr};
    SmemFrags<KS> wlo{nullptr};
    // warp wp's fragments of U [D, R] (k order `kmap`, as load_frags) and W from global
    // memory, TF32-rounded; all loads issued before the first is used
    template <class KMap>
    __device__ __forceinline__ void load(const float* U, const float* W, i64 D, i64 R, int wp, int lane, KMap kmap) {
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
            for (int n = 0; n < NR; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int k = kmap(wp, s, t, e), r = 8 * n + g;
                    u[s][n][e] = (k < D && r < R) ? U[(i64)k * R + r] : 0.f;
                }
#pragma unroll
        for (int s = 0; s < NR; ++s)
#pragma unroll
            for (int n = 0; n < KS; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d = wp * C::KW + 8 * n + g, r = 8 * s + t + 4 * e;
                    w[s][n][e] = (d < D && r < R) ? W[(i64)d * R + r] : 0.f;
                }
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
            for (int n = 0; n < NR; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) u[s][n][e] = geo_tf32(u[s][n][e]);
#pragma unroll
        for (int s = 0; s < NR; ++s)
#pragma unroll
            for (int n = 0; n < KS; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) w[s][n][e] = geo_tf32(w[s][n][e]);
    }
    template <int O, int N> struct Src {
        static constexpr int P = 1;
        const float (&f)[O][N][2];
        __device__ __forceinline__ void load(int o, int n, float (&b)[1][2]) const {
            b[0][0] = f[o][n][0];
            b[0][1] = f[o][n][1];
        }
    };
    __device__ __forceinline__ Src<KS, NR> a_src() const { return {u}; }
    __device__ __forceinline__ Src<NR, KS> b_src() const { return {w}; }
};

// One k-step o of a TF32 phase: acc[n] += A B(o, n) for the n-tiles n < NN, one
// m16n8k8 each, A given as its TF32 operand `ah`; with 3xTF32 (`bl` the B fragments'
// low parts, BL::LO) also A's low part `al`: acc += al bh + ah bl + ah bh, in that order.
template <int NN, class BH, class BL>
__device__ __forceinline__ void mma_kstep(float (&acc)[NN][4], const float (&ah)[4], const float (&al)[4],
                                          const BH& bh, const BL& bl, int o) {
    constexpr int Q = BL::LO ? BL::P : BH::P;
#pragma unroll
    for (int n = 0; n < NN; n += Q) {
        float b[Q][2], bq[Q][2];
        frags_q<Q>(bh, o, n, b);
        if constexpr (BL::LO) bl.load(o, n, bq);
#pragma unroll
        for (int k = 0; k < Q; ++k) {
            if constexpr (BL::LO) {
                geo_mma_tf32(acc[n + k], al, b[k]);
                geo_mma_tf32(acc[n + k], ah, bq[k]);
            }
            geo_mma_tf32(acc[n + k], ah, b[k]);
        }
    }
}

// Phase A over the warp's feature slice: acc = P[16][RP] partial = X[16][KW] U[KW][RP].
// `af(s, ah, al)` writes k-step s's A fragment (TF32: rows g, g + 8 at k position t,
// then at t + 4) to `ah`, and with 3xTF32 its low parts to `al`; `bh`: this warp's U
// fragments (SmemFrags<NR> or RegFrags::a_src, outer index the k-step), `bl` their low
// parts (3xTF32) or NoLo.
template <class C, class BH, class BL, class AF>
__device__ __forceinline__ void phase_a_frag(const BH& bh, const BL& bl, AF af, float (&acc)[C::RP / 8][4]) {
#pragma unroll
    for (int n = 0; n < C::RP / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
    for (int s = 0; s < C::KW / 8; ++s) {
        float ah[4], al[4];
        af(s, ah, al);
        mma_kstep(acc, ah, al, bh, bl, s);
    }
}

// The warp's partial [16][RP] (accumulator layout) into its slice `part` (stride SU).
template <class C> __device__ __forceinline__ void store_part_tc(float* part, const float (&acc)[C::RP / 8][4], int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < C::RP / 8; ++n) {
        const float lo[2] = {acc[n][0], acc[n][1]}, hi[2] = {acc[n][2], acc[n][3]};
        stv<2>(part + g * C::SU + 8 * n + 2 * t, lo);
        stv<2>(part + (g + 8) * C::SU + 8 * n + 2 * t, hi);
    }
}

// S [16][RP] in A-fragment order for phase B: element (m, r) at s_frag(m, r), lane
// 4 (m % 8) + r % 4 of k-step r / 8 holding its 4 values side by side (one 16-byte
// load per k-step; M * RP floats).
__device__ __forceinline__ constexpr int s_frag(int m, int r) {
    return ((r >> 3) * 32 + 4 * (m & 7) + (r & 3)) * 4 + (m >> 3) + 2 * ((r >> 2) & 1);
}

// Phase B: acc = raw[16][the warp's KW features] = S[16][RP] W^T, S TF32-rounded in
// smem (s_frag order; with 3xTF32 its low parts in the same order at `Sl`), `bh` this
// warp's W fragments (SmemFrags<KS> or RegFrags::b_src, outer index the k-step), `bl`
// their low parts or NoLo (as phase_a_frag). Accumulator n holds rows g, g + 8 and
// features w*KW + 8n + 2t, + 1 (the TC row layout: tile (i, 2n + e) is element 2i + e).
template <class C, class BH, class BL>
__device__ __forceinline__ void phase_b_frag(const float* S, const float* Sl, const BH& bh, const BL& bl, int lane,
                                             float (&acc)[C::KW / 8][4]) {
#pragma unroll
    for (int n = 0; n < C::KW / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
    for (int s2 = 0; s2 < C::RP / 8; ++s2) {
        float ah[4], al[4];
        ldv<4>(S + (s2 * 32 + lane) * 4, ah);
        if constexpr (BL::LO) ldv<4>(Sl + (s2 * 32 + lane) * 4, al);
        mma_kstep(acc, ah, al, bh, bl, s2);
    }
}

// The leapfrog's TF32 k order: k-step s of warp w's slice takes features 8s + 2t and
// 8s + 2t + 1 as k positions t and t + 4, so that the A fragment of k-step s is the
// lane's own row-layout values (i, 2s) and (i, 2s + 1).
struct KmapRows {
    int kw;
    __device__ int operator()(int w, int s, int t, int e) const { return w * kw + 8 * s + 2 * t + e; }
};

__device__ __forceinline__ void check_smem(unsigned needed_bytes, const GeoArgs& a) {
    if (needed_bytes > a.smem_bytes || a.smem_bytes > dyn_smem_size()) __trap();
}

// U and W for gamma_regs: the FFMA kernels' in shared memory ([DP][SUZ], [DP][SW]);
// the TF32 leapfrog passes its RegFrags instead.
template <class C> struct SmemUW {
    const typename C::T* U;
    const typename C::T* W;
};
template <bool B, class X, class Y> struct GeoIf { typedef X type; };
template <class X, class Y> struct GeoIf<false, X, Y> { typedef Y type; };
template <bool V> struct GeoBool {
    static constexpr bool value = V;
};

// Gamma of a row-layout tile: writes it to the warp's slice of `vb` (FFMA; the TC
// kernels take their A fragments from `vin` itself and U, W from the RegFrags `uw`,
// KmapRows k order), phase A with the partials in the slices of `pb` (may be
// `vb`; stride C::PSL with 3xTF32), P (optional) and S = P^2 into smem (3xTF32: its
// low parts M SU elements after it), phase B into `raw` (unclamped).
// Contains two __syncthreads.
template <class C, class UW>
__device__ __forceinline__ void gamma_regs(const typename Rows<C>::Tile& vin, const Rows<C>& rl, typename C::T* vb,
                                           typename C::T* pb, typename C::T* P, typename C::T* S, const UW& uw,
                                           i64 R, typename Rows<C>::Tile& raw) {
    typedef typename C::T T;
    const int lane = threadIdx.x & 31;
    constexpr int KS = C::KW / 8, NR = C::RP / 8;
    if constexpr (C::TC) {
        float acc[NR][4];
        // A fragment element e of k-step st: row layout (e & 1, 2 st + (e >> 1))
        auto af = [&](int st, float (&ah)[4], float (&al)[4]) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float x = vin[e & 1][2 * st + (e >> 1)];
                if constexpr (C::X3) geo_split(x, ah[e], al[e]);
                else ah[e] = geo_tf32_op(x);
            }
        };
        if constexpr (C::X3) phase_a_frag<C>(uw.a_src(), uw.ulo, af, acc);
        else phase_a_frag<C>(uw.a_src(), NoLo{}, af, acc);
        store_part_tc<C>(pb + rl.w * C::PSL, acc, lane);
    } else {
        T* vs = vb + rl.w * C::SLICE;
        rl.to_slice(vin, vs);
        __syncwarp();
        T acc[C::MB][C::RA];
        phase_a<C>(vs, uw.U + rl.w * C::KW * C::SUZ, lane, acc);
        __syncwarp();
        store_part<C>(pb + rl.w * C::SLICE, acc, lane);
    }
    __syncthreads();
    T* const Sl = S + C::M * C::SU;  // 3xTF32: S's low parts
    reduce_parts<C, C::PSL>(pb, [&](int m, int r, T s) {
        bool in = r < R;
        if (P != nullptr) P[m * C::SU + r] = in ? s : T(0);
        if constexpr (C::X3) geo_split(in ? s * s : T(0), S[s_frag(m, r)], Sl[s_frag(m, r)]);
        else if constexpr (C::TC) S[s_frag(m, r)] = geo_tf32_op(in ? s * s : T(0));
        else S[m * C::SU + r] = in ? s * s : T(0);
    });
    __syncthreads();
    if constexpr (C::TC) {
        float acc[KS][4];
        if constexpr (C::X3) phase_b_frag<C>(S, Sl, uw.b_src(), uw.wlo, lane, acc);
        else phase_b_frag<C>(S, nullptr, uw.b_src(), NoLo{}, lane, acc);
#pragma unroll
        for (int n = 0; n < KS; ++n) {
            raw[0][2 * n] = acc[n][0];
            raw[0][2 * n + 1] = acc[n][1];
            raw[1][2 * n] = acc[n][2];
            raw[1][2 * n + 1] = acc[n][3];
        }
    } else if constexpr (C::VL) {
        phase_b_v<C>(S, uw.W, lane, raw);
    } else {
        phase_b<C>(S, uw.W, lane, raw);
    }
}

// The tail of a Christoffel vector-Jacobian product: with g' in the warp's slice of
// `gb`, Q = g' W (phase A, partials in `gb`), DP = 2 P Q into smem, and (if
// `want_dv`) dv = DP U^T in row layout. Contains two __syncthreads.
template <class C>
__device__ __forceinline__ void vjp_tail(typename C::T* gb, const typename C::T* P, typename C::T* DPs,
                                         const typename C::T* Us, const typename C::T* Ws, bool want_dv,
                                         typename Rows<C>::Tile& dv) {
    typedef typename C::T T;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    T* gs = gb + w * C::SLICE;
    T acc[C::MB][C::RA];
    phase_a<C>(gs, Ws + w * C::KW * C::SW, lane, acc);
    __syncwarp();
    store_part<C>(gs, acc, lane);
    __syncthreads();
    reduce_parts<C>(gb, [&](int m, int r, T s) { DPs[m * C::SU + r] = T(2) * P[m * C::SU + r] * s; });
    __syncthreads();
    if constexpr (C::VL) {
        static_assert(C::UZ, "vjp_tail: a vector layout needs U swizzled");
        if (want_dv) phase_b_v<C>(DPs, Us, lane, dv);
    } else {
        if (want_dv) phase_b<C>(DPs, Us, lane, dv);
    }
}

// Tile of v rows into the (warp-sliced) smem buffer `vb`: cp.async (16-byte chunks)
// when rows are 16-byte aligned, else plain loads. Padding is zero.
template <class C>
__device__ void load_tile(typename C::T* vb, const typename C::T* v, i64 row0, i64 B, i64 D, bool vec) {
    typedef typename C::T T;
    if (vec) {
        // 16-byte chunks; NCH per row, a power of two dividing GEO_NT or a multiple of it,
        // so every thread copies one fixed chunk column of rows m0, m0 + RS, ...
        constexpr int CH = 16 / sizeof(T);
        constexpr int NCH = C::DP / CH;
        constexpr int RS = NCH >= GEO_NT ? 1 : GEO_NT / NCH;  // rows per pass
        constexpr int CPT = NCH > GEO_NT ? NCH / GEO_NT : 1;  // chunk columns per thread
        static_assert(NCH % GEO_NT == 0 || GEO_NT % NCH == 0, "chunks per row");
#pragma unroll
        for (int cc = 0; cc < CPT; ++cc) {
            const int idx = geo_tid() + cc * GEO_NT;
            const int m0 = idx / NCH, d = (idx % NCH) * CH;
            const int w = d / C::KW, kk = d - w * C::KW;
            T* dst = vb + w * C::SLICE + m0 * C::SV + kk;
            const bool dok = d < D;
            const T* src = v + (row0 + m0) * D + d;
            i64 rows_left = B - (row0 + m0);
#pragma unroll
            for (int m = 0; m < C::M; m += RS) {
                if (m0 + m < C::M) {
                    if (dok && m < rows_left) {
                        cp_async16(dst + m * C::SV, src + m * D);
                    } else {
#pragma unroll
                        for (int e = 0; e < CH; ++e) dst[m * C::SV + e] = T(0);
                    }
                }
            }
        }
    } else {
        for (int idx = geo_tid(); idx < C::M * C::DP; idx += GEO_NT) {
            int m = idx / C::DP, d = idx - m * C::DP;
            int w = d / C::KW, kk = d - w * C::KW;
            i64 row = row0 + m;
            vb[w * C::SLICE + m * C::SV + kk] = (row < B && d < D) ? v[row * D + d] : T(0);
        }
    }
}

// ---------------------------------------------------------------- U and W in registers
// The strict f32 leapfrog forward with U and W in registers (`Cfg::RS`: 16 < R <= 32,
// 256 < D <= 512, T >= 2, every [B, D] tensor 16-byte aligned, where the host gives the
// kernel its shared memory; else the register-state kernel runs). Each warp keeps, for
// the launch, U for its 64 features x 32 columns and W for its 64 features (64 + 64
// registers per lane); the tile's rows sit in shared memory, double-buffered so that
// the next tile streams in (cp.async) during this one. (The same scheme for the
// Christoffel forward, `chr_fwd_rs` with 32-row tiles of v double-buffered, was 12%
// slower than chr_fwd_simt on the H100, 0.168 against 0.150 ms b2b, and was not kept.)
// Per Gamma (gamma_rs):
// - phase A: lane (g = lane / 4, t = lane % 4) of warp w accumulates P[m][4g + (j ^ t)]
//   over features 64w + 16q + 4t + e (q, e < 4) for every row m: one 16-byte load of
//   v per 16 FFMA, shared by the 8 lanes of equal t; two xor-shuffle levels reduce over
//   t and leave P[m][lane] (the xor in the column order makes them select-free); the 8
//   warps' partials are summed in warp order (deterministic);
// - phase B: lane L owns features 64w + 2L, +1 and all 32 columns of W: S rows are
//   broadcast 16-byte loads, no reduction; the epilogue (the kicks) takes the lane's
//   two raw values per row.
// Shared-memory loads per FFMA drop from 0.5 / 0.375 (the register-state leapfrog's
// lane tiles) to 1/16 and 1/8 (docs/geodesic.md, "U and W in registers").
__device__ __forceinline__ bool rs_ok(const GeoArgs& a, int smem_elems) {
    return a.smem_bytes >= smem_elems * sizeof(float) &&
           ((a.x0 | a.v0 | a.f | a.x_out | a.v_out | a.traj | a.gamma | (u64)(a.D * sizeof(float))) & 15) == 0;
}

// The warp's slices of U (phase A) and W (phase B) and the lane's features d0, d0 + 1
struct RsUW {
    float Ua[4][4][4], Wb[2][32];
    int d0;
    __device__ __forceinline__ void load(const GeoArgs& a) {
        const int w = geo_tid() >> 5, L = geo_tid() & 31, t = L & 3, g = L >> 2, D = (int)a.D, R = (int)a.R;
        const float* U = reinterpret_cast<const float*>(a.u);
        const float* W = reinterpret_cast<const float*>(a.w);
        d0 = 64 * w + 2 * L;
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int k = 64 * w + 16 * q + 4 * t + e, r = 4 * g + (j ^ t);
                    Ua[q][e][j] = (k < D && r < R) ? U[k * R + r] : 0.f;
                }
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
            for (int r = 0; r < 32; ++r) Wb[k][r] = (d0 + k < D && r < R) ? W[(d0 + k) * R + r] : 0.f;
    }
};

// raw = (v U)^2 W^T for the M rows of Vs ([M][DP]); epi(m, raw[2]) gets the lane's
// features d0, d0 + 1 of row m. Partials [NW][M][RP], S [M][RP].
template <class C, class Epi>
__device__ __forceinline__ void gamma_rs(const float* Vs, float* Part, float* S, const RsUW& uw, Epi epi) {
    constexpr int M = C::M, DP = C::DP, RP = C::RP, RA = 8, RB = 8;
    static_assert(DP == 512 && RP == 32 && M % 8 == 0, "the register kernels' configuration");
    const int tid = geo_tid(), w = tid >> 5, L = tid & 31, t = L & 3;
    const float* vb = Vs + 64 * w + 4 * t;
#pragma unroll 1
    for (int m0 = 0; m0 < M; m0 += RA) {
        float acc[RA][4];
#pragma unroll
        for (int i = 0; i < RA; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float v4[RA][4];
#pragma unroll
            for (int i = 0; i < RA; ++i) ldv<4>(vb + (m0 + i) * DP + 16 * q, v4[i]);
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < RA; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(v4[i][e], uw.Ua[q][e][j], acc[i][j]);
        }
#pragma unroll
        for (int i = 0; i < RA; ++i) {
            acc[i][0] += __shfl_xor_sync(0xffffffffu, acc[i][1], 1);
            acc[i][2] += __shfl_xor_sync(0xffffffffu, acc[i][3], 1);
            acc[i][0] += __shfl_xor_sync(0xffffffffu, acc[i][2], 2);
            Part[(w * M + m0 + i) * RP + L] = acc[i][0];
        }
    }
    __syncthreads();
    for (int idx = tid; idx < M * RP; idx += GEO_NT) {
        float p = 0.f;
#pragma unroll
        for (int k = 0; k < GEO_NW; ++k) p += Part[k * M * RP + idx];
        S[idx] = p * p;
    }
    __syncthreads();
#pragma unroll
    for (int m0 = 0; m0 < M; m0 += RB) {
        float acc[RB][2];
#pragma unroll
        for (int i = 0; i < RB; ++i) acc[i][0] = acc[i][1] = 0.f;
#pragma unroll
        for (int rq = 0; rq < RP / 4; ++rq) {
            float s4[RB][4];
#pragma unroll
            for (int i = 0; i < RB; ++i) ldv<4>(S + (m0 + i) * RP + 4 * rq, s4[i]);
#pragma unroll
            for (int e = 0; e < 4; ++e)
#pragma unroll
                for (int i = 0; i < RB; ++i)
#pragma unroll
                    for (int k = 0; k < 2; ++k) acc[i][k] = fmaf(s4[i][e], uw.Wb[k][4 * rq + e], acc[i][k]);
        }
#pragma unroll
        for (int i = 0; i < RB; ++i) epi(m0 + i, acc[i]);
    }
    __syncwarp();  // (the leapfrog's next phase A reads the features that the warp's lanes wrote)
}

// Zeros both tile buffers (padded features and rows past B stay zero), then the rows
// of tile `tile` of each [B, D] source into buffer `b` (`n` arrays of [M][DP], NULL
// sources skipped; rows past B zeroed).
__device__ __forceinline__ void rs_zero(float* sm, int elems) {
    for (int i = geo_tid(); i < elems / 4; i += GEO_NT) stv<4>(sm + 4 * i, {0.f, 0.f, 0.f, 0.f});
    __syncthreads();
}
template <class C, int N>
__device__ __forceinline__ void rs_load(float* b, const float* const (&src)[N], i64 tile, const GeoArgs& a) {
    constexpr int M = C::M, DP = C::DP, Q = DP / 4;
    const i64 r0 = tile * M;
    for (int i = geo_tid(); i < M * Q; i += GEO_NT) {
        const int m = i / Q, col = 4 * (i % Q);
        if (col >= a.D) continue;
        const bool in = r0 + m < a.B;
#pragma unroll
        for (int n = 0; n < N; ++n) {
            float* s = b + n * M * DP + m * DP + col;
            if (src[n] == nullptr) continue;
            if (in) cp_async16(s, src[n] + (r0 + m) * a.D + col);
            else stv<4>(s, {0.f, 0.f, 0.f, 0.f});
        }
    }
}

// Leapfrog forward: the tile's v, x, f double-buffered, h f scaled in place, x of the
// lane's features in registers; kicks and drift in gamma_rs's epilogue.
template <class C> __device__ void lf_fwd_rs(const GeoArgs& a) {
    constexpr int M = C::M, DP = C::DP, BUF = 3 * M * DP;
    check_smem(C::SMEM_LF_FWD_RS * sizeof(float), a);
    float* const sm = reinterpret_cast<float*>(geo_smem);  // 2 buffers of [v, x, f][M][DP]
    float* const Part = sm + 2 * BUF;                         // [NW][M][RP]
    float* const S = Part + GEO_NW * M * C::RP;                // [M][RP]
    const float c = float(a.c), dt = float(a.dt), h = float(0.5 * a.dt);
    const float* x0 = reinterpret_cast<const float*>(a.x0);
    const float* v0 = reinterpret_cast<const float*>(a.v0);
    const float* f = reinterpret_cast<const float*>(a.f);
    const float* mu = reinterpret_cast<const float*>(a.mu);
    float* traj = reinterpret_cast<float*>(a.traj);
    RsUW uw;
    uw.load(a);
    const int d0 = uw.d0;
    float hm[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) hm[k] = h * ((mu != nullptr && d0 + k < a.D) ? mu[d0 + k] : 0.f);
    rs_zero(sm, 2 * BUF);  // (h f stays zero without f)
    const i64 ntiles = (a.B + M - 1) / M, BD = a.B * a.D;
    const float* const src[3] = {v0, x0, f};
    // the lane's features of the tile's valid rows: fn(row offset, smem row)
    auto rows = [&](i64 r0, auto fn) {
#pragma unroll
        for (int m = 0; m < M; ++m)
            if (d0 < a.D && r0 + m < a.B) fn((r0 + m) * a.D + d0, m);
    };
    int cur = 0;
    i64 tile = blockIdx.x;
    if (tile < ntiles) rs_load<C>(sm, src, tile, a);
    cp_async_commit();
    for (; tile < ntiles; tile += gridDim.x, cur ^= 1) {
        const i64 next = tile + gridDim.x, r0 = tile * M;
        if (next < ntiles) rs_load<C>(sm + (cur ^ 1) * BUF, src, next, a);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // the tile's v, x, f are in buffer `cur`
        float* const Vs = sm + cur * BUF;
        float* const Hs = Vs + 2 * M * DP;
        if (f != nullptr)
            for (int i = geo_tid(); i < M * DP / 4; i += GEO_NT) {
                float q[4];
                ldv<4>(Hs + 4 * i, q);
#pragma unroll
                for (int e = 0; e < 4; ++e) q[e] *= h;
                stv<4>(Hs + 4 * i, q);
            }
        float xr[M][2];
#pragma unroll
        for (int m = 0; m < M; ++m) ldv<2>(Vs + M * DP + m * DP + d0, xr[m]);
        __syncthreads();  // h f
        auto kicks = [&](auto drift) {
            gamma_rs<C>(Vs, Part, S, uw, [&](int m, const float (&raw)[2]) {
                float v[2], hf[2];
                ldv<2>(Vs + m * DP + d0, v);
                ldv<2>(Hs + m * DP + d0, hf);
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    v[k] = kick(v[k], hf[k], hm[k], h, raw[k], c);
                    if (decltype(drift)::value) xr[m][k] += dt * v[k];
                }
                stv<2>(Vs + m * DP + d0, v);
            });
        };
        for (i64 s = 0; s < a.steps; ++s) {
            kicks(GeoBool<true>{});
            kicks(GeoBool<false>{});
            if (traj != nullptr)
                rows(r0, [&](i64 o, int m) {
                    stv<2>(traj + 2 * s * BD + o, xr[m]);
                    float v[2];
                    ldv<2>(Vs + m * DP + d0, v);
                    stv<2>(traj + (2 * s + 1) * BD + o, v);
                });
        }
        rows(r0, [&](i64 o, int m) {
            stv<2>(reinterpret_cast<float*>(a.x_out) + o, xr[m]);
            float v[2];
            ldv<2>(Vs + m * DP + d0, v);
            stv<2>(reinterpret_cast<float*>(a.v_out) + o, v);
        });
        __syncthreads();  // buffer `cur` is free for the tile after next
    }
    cp_async_wait<0>();
}

// TF32 Christoffel forward, the same GEO_GROUPS thread groups. The phase-A operand (v) never touches shared memory: each
// lane loads its A fragments straight from global memory into registers, one tile
// ahead (the loads of tile t + step are in flight while tile t computes). Within a
// warp's slice of KW features, lane (g, t) holds rows g and g + 8, columns
// 16q + 4t .. 16q + 4t + 3 (one 16-byte load each): k-step s = 2q + h uses columns
// 16q + 4t + 2h (k position t) and 16q + 4t + 2h + 1 (k position t + 4), a
// permutation of the reduction order within the slice. U and W sit in shared memory
// in fragment order (U in that permuted k order), so each B fragment is one
// conflict-free 8-byte load; both are TF32-rounded once. Per group: the warps' phase-A
// partials [8][M][SU] and S [M][SU]; two group barriers per tile.
template <class C> __device__ void chr_fwd_tc(const GeoArgs& a) {
    static_assert(C::TC && C::M == 16 && C::KW % 16 == 0, "TF32 configuration");
    constexpr int KS = C::KW / 8, NR = C::RP / 8, NQ = C::KW / 16;
    check_smem(C::SMEM_CHR_FWD_TC * sizeof(float), a);
    float* Uf = reinterpret_cast<float*>(geo_smem);
    float* Wf = Uf + C::DP * C::RP;
    const int grp = threadIdx.x / GEO_NT;
    float* const Pg = Wf + C::DP * C::RP + grp * (GEO_NW + 1) * C::M * C::SU;
    float* const S = Pg + GEO_NW * C::M * C::SU;
    const float* U = reinterpret_cast<const float*>(a.u);
    const float* W = reinterpret_cast<const float*>(a.w);
    const float* v = reinterpret_cast<const float*>(a.v0);
    float* out = reinterpret_cast<float*>(a.gamma);
    const float c = float(a.c);
    const i64 B = a.B, D = a.D, R = a.R;
    const i64 ntiles = (B + C::M - 1) / C::M;
    const int w = geo_tid() >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const bool vec = a.vec_ok != 0;
    const bool pair_ok = ((a.gamma | (u64)(D * sizeof(float))) & 7) == 0;
    const i64 step = (i64)GEO_GROUPS * gridDim.x;
    // U, W in fragment order; k-step s = 2q + h takes columns 16q + 4t + 2h (+ 1)
    load_frags<C>(Uf, Wf, U, W, D, R, [](int ww, int st, int tt, int e) {
        return ww * C::KW + 16 * (st >> 1) + 4 * tt + 2 * (st & 1) + e;
    });
    // this lane's A elements of a tile: rows g, g + 8; columns c0 + 16q .. + 3
    const int c0 = w * C::KW + 4 * t;
    auto load_a = [&](GVec<float, 4> (&o)[2][NQ], i64 tl) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
            const i64 row = tl * C::M + g + 8 * hf;
            const float* p = v + row * D + c0;
#pragma unroll
            for (int q = 0; q < NQ; ++q) {
                const int col = c0 + 16 * q;
                if (vec) {
                    if (row < B && col < D) o[hf][q] = *reinterpret_cast<const GVec<float, 4>*>(p + 16 * q);
                    else o[hf][q] = GVec<float, 4>{{0.f, 0.f, 0.f, 0.f}};
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) o[hf][q].x[e] = (row < B && col + e < D) ? p[16 * q + e] : 0.f;
                }
            }
        }
    };
    GVec<float, 4> cur[2][NQ], nxt[2][NQ];
    i64 tile = blockIdx.x + (i64)grp * gridDim.x;
    if (tile < ntiles) load_a(cur, tile);
    __syncthreads();  // Uf, Wf
    const SmemFrags<NR> uf{Uf + Frags<NR>::off(w * KS, 0, lane, 0)};
    const SmemFrags<KS> wf{Wf + Frags<KS>::off(w * NR, 0, lane, 0)};
    for (; tile < ntiles; tile += step) {
        if (tile + step < ntiles) load_a(nxt, tile + step);
        // phase A: the warp's partial [16][RP] over its slice
        float acc[NR][4];
        phase_a_frag<C>(uf, NoLo{},
                        [&](int st, float (&af)[4], float (&)[4]) {
                            const int q = st >> 1, h = st & 1;
                            af[0] = geo_tf32_op(cur[0][q].x[2 * h]);
                            af[1] = geo_tf32_op(cur[1][q].x[2 * h]);
                            af[2] = geo_tf32_op(cur[0][q].x[2 * h + 1]);
                            af[3] = geo_tf32_op(cur[1][q].x[2 * h + 1]);
                        },
                        acc);
        store_part_tc<C>(Pg + w * C::M * C::SU, acc, lane);
        geo_group_sync(grp);
        reduce_parts<C, C::M * C::SU>(Pg, [&](int m, int r, float sum) {
            S[s_frag(m, r)] = geo_tf32_op(r < R ? sum * sum : 0.f);
        });
        geo_group_sync(grp);
        // phase B: raw[16][the warp's KW features] = S W^T
        float accb[KS][4];
        phase_b_frag<C>(S, nullptr, wf, NoLo{}, lane, accb);
        Rows<C> rl(tile * C::M, B, D);
        typename Rows<C>::Tile raw;
#pragma unroll
        for (int n = 0; n < KS; ++n) {
            raw[0][2 * n] = clampc_fast(accb[n][0], c);
            raw[0][2 * n + 1] = clampc_fast(accb[n][1], c);
            raw[1][2 * n] = clampc_fast(accb[n][2], c);
            raw[1][2 * n + 1] = clampc_fast(accb[n][3], c);
        }
        rl.store(raw, out, pair_ok);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
#pragma unroll
            for (int q = 0; q < NQ; ++q) cur[hf][q] = nxt[hf][q];
    }
}

// Christoffel forward (FFMA): one group of GEO_NT threads per block, tiles of M = 32
// rows (16 for DJ = 16), so the lane tiles are 8 x 8 in phase A (phase_a_w; MB x RA =
// 8 x 4 in phase_a for RP < 32) and 8 x DJ in phase B (phase_b_v, f32 with RP = 32 and
// DJ = 4 or 8, stores gamma as 16-byte vectors; else phase_b): 0.25 floats loaded from
// shared memory per FFMA (M = 16 gave 0.5 and 0.375). One v buffer: the next tile
// goes out by cp.async as soon as phase A has consumed the buffer (after the
// partial-sum reduction) and streams in during phase B.
template <class C> __device__ void chr_fwd_simt(const GeoArgs& a) {
    typedef typename C::T T;
    static_assert(!C::TC, "FFMA configuration");
    check_smem(C::SMEM_CHR_FWD * sizeof(T), a);
    T* Us = reinterpret_cast<T*>(geo_smem);
    T* Ws = Us + C::DP * C::SU;
    T* const vb = Ws + C::DP * C::SW;
    T* const S = vb + GEO_NW * C::SLICE;
    const T* v = reinterpret_cast<const T*>(a.v0);
    T* out = reinterpret_cast<T*>(a.gamma);
    const T c = T(a.c);
    const i64 ntiles = (a.B + C::M - 1) / C::M;
    const int w = geo_tid() >> 5, lane = threadIdx.x & 31;
    const bool vec = a.vec_ok != 0;
    // gamma as 16-byte vectors (VL) where every row starts 16-byte aligned
    const bool ovec = ((a.gamma | (u64)(a.D * sizeof(T))) & 15) == 0;
    const i64 step = gridDim.x;
    load_uw<C, C::SU, GEO_NT>(Us, Ws, reinterpret_cast<const T*>(a.u), reinterpret_cast<const T*>(a.w), a.D,
                               a.R);
    i64 tile = blockIdx.x;
    if (tile < ntiles) load_tile<C>(vb, v, tile * C::M, a.B, a.D, vec);
    cp_async_commit();
    T* vs = vb + w * C::SLICE;
    for (; tile < ntiles; tile += step) {
        cp_async_wait<0>();
        __syncthreads();  // the tile is in vb (and, the first time, U and W are in place)
        // the slice is consumed: its partial goes there
        if constexpr (C::M == 32 && C::RP == 32) {
            phase_a_w<C>(vs, Us + w * C::KW * C::SU, lane);
        } else {
            T acc[C::MB][C::RA];
            phase_a<C>(vs, Us + w * C::KW * C::SU, lane, acc);
            __syncwarp();
            store_part<C>(vs, acc, lane);
        }
        __syncthreads();
        reduce_parts<C>(vb, [&](int m, int r, T s) { S[m * C::SU + r] = r < a.R ? s * s : T(0); });
        __syncthreads();  // S complete, vb free: the next tile streams in during phase B
        const i64 next = tile + step;
        if (next < ntiles) load_tile<C>(vb, v, next * C::M, a.B, a.D, vec);
        cp_async_commit();
        Rows<C> rl(tile * C::M, a.B, a.D);
        typename Rows<C>::Tile raw;
        if constexpr (C::VL) phase_b_v<C>(S, Ws, lane, raw);
        else phase_b<C>(S, Ws, lane, raw);
#pragma unroll
        for (int i = 0; i < C::TI; ++i)
#pragma unroll
            for (int j = 0; j < C::TJ; ++j) raw[i][j] = clampc_fast(raw[i][j], c);
        rl.store_fast(raw, out, ovec);
    }
    cp_async_wait<0>();
}

// The TF32 variant (chr_fwd_tc) or the FFMA one (chr_fwd_simt).
template <class C> __device__ void chr_fwd_fast(const GeoArgs& a) {
    if constexpr (C::TC) chr_fwd_tc<C>(a);
    else chr_fwd_simt<C>(a);
}

template <class C> __device__ void chr_bwd_fast(const GeoArgs& a) {
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    check_smem(C::SMEM_CHR_BWD * sizeof(T), a);
    T* Us = reinterpret_cast<T*>(geo_smem);
    T* Ws = Us + C::DP * C::SUZ;
    T* Vb = Ws + C::DP * C::SW;
    T* Gb = Vb + GEO_NW * C::SLICE;
    T* P = Gb + GEO_NW * C::SLICE;
    T* S = P + C::M * C::SU;
    T* DPs = S + C::M * C::SU;
    const T c = T(a.c);
    const i64 ntiles = (a.B + C::M - 1) / C::M;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool want_dv = a.want & GEO_WANT_DV, want_du = a.want & GEO_WANT_DU, want_dw = a.want & GEO_WANT_DW;
    // VL: rows as 16-byte vectors where v, g, dv and the rows are 16-byte aligned
    const bool vec = C::VL && ((a.v0 | a.g | a.dv | (u64)(a.D * sizeof(T))) & 15) == 0;
    load_uw<C, C::SU>(Us, Ws, reinterpret_cast<const T*>(a.u), reinterpret_cast<const T*>(a.w), a.D,
                               a.R);
    T acc_u[C::NPAR], acc_w[C::NPAR];
#pragma unroll
    for (int k = 0; k < C::NPAR; ++k) acc_u[k] = acc_w[k] = T(0);
    T* vs = Vb + w * C::SLICE;
    T* gs = Gb + w * C::SLICE;
    __syncthreads();
    for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        Rows<C> rl(tile * C::M, a.B, a.D);
        Tile t;
        rl.load(t, reinterpret_cast<const T*>(a.v0), vec);
        {
            const i64 next = (tile + gridDim.x) * C::M;
            prefetch_rows_l2(reinterpret_cast<const T*>(a.v0), next, C::M, a.B, a.D);
            prefetch_rows_l2(reinterpret_cast<const T*>(a.g), next, C::M, a.B, a.D);
        }
        // p, s (partials in the G slices, free now)
        Tile raw;
        gamma_regs<C>(t, rl, Vb, Gb, P, S, SmemUW<C>{Us, Ws}, a.R, raw);
        // g only now: loaded before the Gamma, its tile lived in registers across it
        // (sm_90: 36/36 bytes of spills -> none; H100 -8% b2b; L2 holds it, prefetched)
        Tile gr;
        rl.load(gr, reinterpret_cast<const T*>(a.g), vec);
        // g' = g * 1[-c <= raw <= c] into the G slice
#pragma unroll
        for (int i = 0; i < C::TI; ++i)
#pragma unroll
            for (int j = 0; j < C::TJ; ++j) gr[i][j] = passc(raw[i][j], c) ? gr[i][j] : T(0);
        rl.to_slice(gr, gs);
        __syncwarp();
        if (want_dw) param_acc<C>(gs, S, lane, acc_w);
        // q = g' W, dp = 2 p q, dv = dp U^T
        vjp_tail<C>(Gb, P, DPs, Us, Ws, want_dv, raw);
        if (want_dv) rl.store(raw, reinterpret_cast<T*>(a.dv), vec);
        if (want_du) param_acc<C>(vs, DPs, lane, acc_u);
    }
    if (want_du) param_store<C>(acc_u, param_part<C>(a.du_part, a));
    if (want_dw) param_store<C>(acc_w, param_part<C>(a.dw_part, a));
}

// Where the leapfrog forward keeps a tile's x and h f and the per-feature h mu (TF32:
// 1 - h mu, for kick_folded) between its steps: in registers (`LfState<C, false>`, the
// FFMA kernel), or, in the TF32 kernel whose registers hold U and W (RegFrags), x and
// h f in a thread-private stash in shared memory (Rows::stash_at: 16-byte vectors,
// no barriers) and 1 - h mu as a [DP] vector there (`LfState<C, true>`).
//   load(rl, x0, f, pair)  the tile's x and f (stash: cp.async, one group committed)
//   scale_hf(h)            f -> h f, after the first Gamma (stash: waits for all but
//                          the newest cp.async group, i.e. the tile's x and f)
//   kicks<DRIFT>(v, raw)   v = kick(v, raw) per element; with DRIFT also x += dt v
//   with_x(rl, fn)         fn(the tile's x as a row-layout tile)
template <class C, bool STASH> struct LfState;
template <class C> struct LfState<C, false> {
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    T h, dt, c;
    Tile x, hf;
    T hm[C::TJ];
    __device__ __forceinline__ LfState(const Rows<C>& rl, T h_, T dt_, T c_, const T* mu, T*, int)
        : h(h_), dt(dt_), c(c_) {
#pragma unroll
        for (int j = 0; j < C::TJ; ++j) hm[j] = h * ((mu != nullptr && rl.colok(j)) ? mu[rl.col(j)] : T(0));
    }
    __device__ __forceinline__ void load(const Rows<C>& rl, const T* x0, const T* f, bool pair) {
        rl.load(x, x0, pair);
        rl.load(hf, f, pair);
    }
    __device__ __forceinline__ void scale_hf() {
#pragma unroll
        for (int i = 0; i < C::TI; ++i)
#pragma unroll
            for (int j = 0; j < C::TJ; ++j) hf[i][j] *= h;
    }
    template <bool DRIFT> __device__ __forceinline__ void kicks(Tile& v, const Tile& raw) {
#pragma unroll
        for (int i = 0; i < C::TI; ++i)
#pragma unroll
            for (int j = 0; j < C::TJ; ++j) {
                v[i][j] = kick(v[i][j], hf[i][j], hm[j], h, raw[i][j], c);
                if (DRIFT) x[i][j] += dt * v[i][j];
            }
    }
    template <class F> __device__ __forceinline__ void with_x(const Rows<C>&, F fn) const { fn(x); }
};
template <class C> struct LfState<C, true> {
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    T h, dt, c;
    T *xs, *hs, *am;  // the stash of x and of h f (offset by the thread); 1 - h mu at the thread's columns
    // `sm`: 2 M DP + DP elements of shared memory
    __device__ __forceinline__ LfState(const Rows<C>& rl, T h_, T dt_, T c_, const T* mu, T* sm, int D)
        : h(h_), dt(dt_), c(c_) {
        xs = sm + 4 * geo_tid();
        hs = xs + C::M * C::DP;
        am = sm + 2 * C::M * C::DP;
        for (int d = geo_tid(); d < C::DP; d += GEO_NT) am[d] = T(1) - h * ((mu != nullptr && d < D) ? mu[d] : T(0));
        am += rl.col(0);  // (read after the caller's next barrier)
    }
    __device__ __forceinline__ void load(const Rows<C>& rl, const T* x0, const T* f, bool pair) {
        rl.stash_async(xs, x0, pair);
        rl.stash_async(hs, f, pair);
        cp_async_commit();
    }
    __device__ __forceinline__ void scale_hf() {
        cp_async_wait<1>();
#pragma unroll
        for (int q = 0; q < C::TI * C::TJ; q += 4) {
            T* p = Rows<C>::stash_at(hs, q);
            T f4[4];
            ldv<4>(p, f4);
#pragma unroll
            for (int e = 0; e < 4; ++e) f4[e] *= h;
            stv<4>(p, f4);
        }
    }
    template <bool DRIFT> __device__ __forceinline__ void kicks(Tile& v, const Tile& raw) {
#pragma unroll
        for (int q = 0; q < C::TI * C::TJ; q += 4) {
            T x4[4], hf4[4], a2[2][2];
            if (DRIFT) ldv<4>(Rows<C>::stash_at(xs, q), x4);
            ldv<4>(Rows<C>::stash_at(hs, q), hf4);
            ldv<2>(am + Rows<C>::coff(q % C::TJ), a2[0]);  // columns j, j + 1 (the TC layout's pairs)
            ldv<2>(am + Rows<C>::coff(q % C::TJ + 2), a2[1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = (q + e) / C::TJ, j = (q + e) % C::TJ;
                v[i][j] = kick_folded(v[i][j], hf4[e], a2[e >> 1][e & 1], h, raw[i][j], c);
                if (DRIFT) x4[e] += dt * v[i][j];
            }
            if (DRIFT) stv<4>(Rows<C>::stash_at(xs, q), x4);
        }
    }
    template <class F> __device__ __forceinline__ void with_x(const Rows<C>& rl, F fn) const {
        Tile x;
        rl.from_stash(x, xs);
        fn(x);
    }
};

// Leapfrog forward: per tile of M rows, x, v, f on chip (row layout) for all T steps:
// the FFMA kernel in registers, the TF32 one v in registers and x, h f in a
// thread-private shared-memory stash (LfState), its registers holding the warp's U and
// W fragments (RegFrags) for the launch instead. The TF32 kernel stages v: where the
// launch gives it the room (`a.smem_bytes` covers SMEM_LF_STAGE more elements), the
// next tile's v streams into a staging buffer (load_tile, cp.async) during this tile's
// steps, so that a tile starts on v from shared memory; its x and f, only needed after
// the first Gamma, stream into the stash (cp.async) while that Gamma runs. (The FFMA
// kernel, at 250 registers, spilled with the stage and ran 3-4% slower: it loads v
// like x and f, asked for in L2 one tile ahead.)
template <class C> __device__ void lf_fwd_fast(const GeoArgs& a) {
    if constexpr (C::RS) {
        if (rs_ok(a, C::SMEM_LF_FWD_RS)) {
            lf_fwd_rs<C>(a);
            return;
        }
    }
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    constexpr int BASE = C::X3 ? C::SMEM_LF_FWD_TC3 : C::TC ? C::SMEM_LF_FWD_TC : C::SMEM_LF_FWD;
    check_smem(BASE * sizeof(T), a);
    const bool stage = C::TC && !C::X3 && a.smem_bytes >= (BASE + C::SMEM_LF_STAGE) * sizeof(T);
    // FFMA: U, W, the warp slices and S; TF32: the slices (partials), S, the state's
    // stash and the optional v stage; 3xTF32: the partials, S and its low parts, the
    // stash, and the low parts of U and W (in the v stage's place)
    T* Us = reinterpret_cast<T*>(geo_smem);
    T* Ws = Us + (C::TC ? 0 : C::DP * C::SU);
    T* Vb = Ws + (C::TC ? 0 : C::DP * C::SW);
    T* S = Vb + GEO_NW * C::PSL;
    T* const stash = S + (C::X3 ? 2 : 1) * C::M * C::SU;
    T* const Vn = stash + (C::TC ? 2 * C::M * C::DP + C::DP : 0);  // staged v of the next tile (`stage`)
    const T c = T(a.c), dt = T(a.dt), h = T(0.5 * a.dt);
    const i64 ntiles = (a.B + C::M - 1) / C::M;
    const i64 BD = a.B * a.D;
    const T* x0 = reinterpret_cast<const T*>(a.x0);
    const T* v0 = reinterpret_cast<const T*>(a.v0);
    const T* f = reinterpret_cast<const T*>(a.f);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    T* traj = reinterpret_cast<T*>(a.traj);
    // TC layout: 8-byte row pairs where every [B, D] tensor allows them; VL: 16-byte
    // vectors
    const bool pair =
        ((a.x0 | a.v0 | a.f | a.x_out | a.v_out | a.traj | (u64)(a.D * sizeof(T))) & (C::VL ? 15 : 7)) == 0;
    typename GeoIf<C::TC, RegFrags<C>, SmemUW<C>>::type uw;
    if constexpr (C::TC) {
        const int w = geo_tid() >> 5, lane = threadIdx.x & 31;
        const float* U = reinterpret_cast<const float*>(a.u);
        const float* W = reinterpret_cast<const float*>(a.w);
        uw.load(U, W, a.D, a.R, w, lane, KmapRows{C::KW});
        if constexpr (C::X3) {
            float* Ul = reinterpret_cast<float*>(Vn);
            float* Wl = Ul + C::DP * C::RP;
            load_frags<C, true>(Ul, Wl, U, W, a.D, a.R, KmapRows{C::KW});  // (read after the barrier below)
            uw.ulo.base = Ul + Frags<C::RP / 8>::off(w * (C::KW / 8), 0, lane, 0);
            uw.wlo.base = Wl + Frags<C::KW / 8>::off(w * (C::RP / 8), 0, lane, 0);
        }
    } else {
        load_uw<C, C::SU>(Us, Ws, reinterpret_cast<const T*>(a.u), reinterpret_cast<const T*>(a.w), a.D,
                                   a.R);
        uw = SmemUW<C>{Us, Ws};
    }
    LfState<C, C::TC> st(Rows<C>(0, a.B, a.D), h, dt, c, mu, stash, (int)a.D);
    i64 tile = blockIdx.x;
    if (stage && tile < ntiles) load_tile<C>(Vn, v0, tile * C::M, a.B, a.D, a.vec_ok != 0);
    cp_async_commit();
    __syncthreads();
    for (; tile < ntiles; tile += gridDim.x) {
        Rows<C> rl(tile * C::M, a.B, a.D);
        Tile v, raw;
        // x and f (h f after the first Gamma, so that nothing waits for f before): the
        // FFMA kernel's loads are issued before v's, the TF32 kernel's cp.async after
        if constexpr (!C::TC) st.load(rl, x0, f, pair);
        const i64 next = tile + gridDim.x;
        if (stage) {
            cp_async_wait<0>();
            __syncthreads();  // the tile's v is in Vn
            rl.from_slice(v, Vn + rl.w * C::SLICE);
        } else {
            rl.load(v, v0, pair);
            prefetch_rows_l2(v0, next * C::M, C::M, a.B, a.D);
        }
        if constexpr (C::TC) st.load(rl, x0, f, pair);
        prefetch_rows_l2(x0, next * C::M, C::M, a.B, a.D);
        prefetch_rows_l2(f, next * C::M, C::M, a.B, a.D);
        for (i64 t = 0; t < a.steps; ++t) {
            gamma_regs<C>(v, rl, Vb, Vb, nullptr, S, uw, a.R, raw);
            if (t == 0) {
                // every thread has read Vn (gamma_regs has barriers): the next tile's v
                // streams in during the steps
                if (stage && next < ntiles) load_tile<C>(Vn, v0, next * C::M, a.B, a.D, a.vec_ok != 0);
                cp_async_commit();
                st.scale_hf();
            }
            st.template kicks<true>(v, raw);
            gamma_regs<C>(v, rl, Vb, Vb, nullptr, S, uw, a.R, raw);
            st.template kicks<false>(v, raw);
            if (traj != nullptr) {
                st.with_x(rl, [&](const Tile& x) { rl.store(x, traj + (2 * t) * BD, pair); });
                rl.store(v, traj + (2 * t + 1) * BD, pair);
            }
        }
        st.with_x(rl, [&](const Tile& x) { rl.store(x, reinterpret_cast<T*>(a.x_out), pair); });
        rl.store(v, reinterpret_cast<T*>(a.v_out), pair);
    }
    cp_async_wait<0>();
}

// Leapfrog backward, per tile of rows: the velocities v_t at the start of each step
// come from the trajectory, or are recomputed on chip first and parked in this
// block's workspace slab ((T-1) x M x DP elements, thread-private order); then the
// adjoint sweeps t = T-1 .. 0 with two Christoffel forwards (v_t, vh_t) and two
// vector-Jacobian products per step.
template <class C> __device__ void lf_bwd_fast(const GeoArgs& a) {
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    constexpr int E = C::TI * C::TJ;
    static_assert(E <= 32, "mask bits must fit one word");
    check_smem(C::SMEM_LF_BWD * sizeof(T), a);
    T* Us = reinterpret_cast<T*>(geo_smem);
    T* Ws = Us + C::DP * C::SUZ;
    T* Vb = Ws + C::DP * C::SW;
    T* Gb = Vb + GEO_NW * C::SLICE;
    T* P0 = Gb + GEO_NW * C::SLICE;
    T* S0 = P0 + C::M * C::SU;
    T* P1 = S0 + C::M * C::SU;
    T* S1 = P1 + C::M * C::SU;
    T* DPs = S1 + C::M * C::SU;
    // thread-private stash (element e of thread t at e*NT + t: conflict-free, no syncs):
    // v_t of the current step, and the df accumulator
    T* VT = DPs + C::M * C::SU + threadIdx.x;
    T* DF = VT + E * GEO_NT;
    const T c = T(a.c), dt = T(a.dt), h = T(0.5 * a.dt);
    const i64 ntiles = (a.B + C::M - 1) / C::M;
    const i64 BD = a.B * a.D;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool want_du = a.want & GEO_WANT_DU, want_dw = a.want & GEO_WANT_DW, want_df = a.want & GEO_WANT_DF;
    // VL: rows as 16-byte vectors where every [B, D] tensor and the rows are 16-byte aligned
    const bool vec = C::VL && ((a.v0 | a.f | a.traj | a.gx | a.gv | a.dx | a.dv | a.df | (u64)(a.D * sizeof(T))) & 15) == 0;
    load_uw<C, C::SU>(Us, Ws, reinterpret_cast<const T*>(a.u), reinterpret_cast<const T*>(a.w), a.D,
                               a.R);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    const T* v0 = reinterpret_cast<const T*>(a.v0);
    const T* f = reinterpret_cast<const T*>(a.f);
    const T* traj = reinterpret_cast<const T*>(a.traj);
    const T* gx = reinterpret_cast<const T*>(a.gx);
    T* slab = reinterpret_cast<T*>(a.ws) + (i64)blockIdx.x * a.ws_per_cta + threadIdx.x;
    T mur[C::TJ];
    {
        Rows<C> rl(0, a.B, a.D);
#pragma unroll
        for (int j = 0; j < C::TJ; ++j) mur[j] = (mu != nullptr && rl.colok(j)) ? mu[rl.col(j)] : T(0);
    }
    T acc_u[C::NPAR], acc_w[C::NPAR];
#pragma unroll
    for (int k = 0; k < C::NPAR; ++k) acc_u[k] = acc_w[k] = T(0);
    T* vs = Vb + w * C::SLICE;
    T* gs = Gb + w * C::SLICE;
    __syncthreads();
    for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        Rows<C> rl(tile * C::M, a.B, a.D);
        Tile t0, t1, raw;
        if (traj == nullptr && a.steps > 1) {
            // recompute v_1 .. v_{T-1} of this tile into the slab
            rl.load(t0, v0, vec);
            for (i64 t = 0; t + 1 < a.steps; ++t) {
                for (int k = 0; k < 2; ++k) {
                    gamma_regs<C>(t0, rl, Vb, Gb, nullptr, S0, SmemUW<C>{Us, Ws}, a.R, raw);
                    rl.load(t1, f, vec);
#pragma unroll
                    for (int i = 0; i < C::TI; ++i)
#pragma unroll
                        for (int j = 0; j < C::TJ; ++j)
                            t0[i][j] = kick(t0[i][j], h * t1[i][j], h * mur[j], h, raw[i][j], c);
                }
                T* s = slab + t * E * GEO_NT;
#pragma unroll
                for (int i = 0; i < C::TI; ++i)
#pragma unroll
                    for (int j = 0; j < C::TJ; ++j) s[(i * C::TJ + j) * GEO_NT] = t0[i][j];
            }
        }
        Tile lv;
        rl.load(lv, reinterpret_cast<const T*>(a.gv), vec);
        if (want_df) {
#pragma unroll
            for (int e = 0; e < E; ++e) DF[e * GEO_NT] = T(0);
        }
        for (i64 t = a.steps - 1; t >= 0; --t) {
            // v_t: from v0, the trajectory or the slab; kept in the stash for dU
            if (t == 0) {
                rl.load(t0, v0, vec);
            } else if (traj != nullptr) {
                rl.load(t0, traj + (2 * (t - 1) + 1) * BD, vec);
            } else {
                const T* s = slab + (t - 1) * E * GEO_NT;
#pragma unroll
                for (int i = 0; i < C::TI; ++i)
#pragma unroll
                    for (int j = 0; j < C::TJ; ++j) t0[i][j] = s[(i * C::TJ + j) * GEO_NT];
            }
            if (want_du) {
#pragma unroll
                for (int i = 0; i < C::TI; ++i)
#pragma unroll
                    for (int j = 0; j < C::TJ; ++j) VT[(i * C::TJ + j) * GEO_NT] = t0[i][j];
            }
            // forward recomputation of the step: Gamma(v_t), vh, Gamma(vh)
            gamma_regs<C>(t0, rl, Vb, Gb, P0, S0, SmemUW<C>{Us, Ws}, a.R, raw);
            unsigned m0 = 0, m1 = 0;
            rl.load(t1, f, vec);
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) {
                    if (passc(raw[i][j], c)) m0 |= 1u << (i * C::TJ + j);
                    t1[i][j] = kick(t0[i][j], h * t1[i][j], h * mur[j], h, raw[i][j], c);
                }
            gamma_regs<C>(t1, rl, Vb, Gb, P1, S1, SmemUW<C>{Us, Ws}, a.R, raw);  // vh stays in the V slice
            // second kick, adjoint lv: g' = -h lv * mask1
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) {
                    if (passc(raw[i][j], c)) m1 |= 1u << (i * C::TJ + j);
                    t1[i][j] = (m1 >> (i * C::TJ + j)) & 1u ? -h * lv[i][j] : T(0);
                }
            rl.to_slice(t1, gs);
            __syncwarp();
            if (want_dw) param_acc<C>(gs, S1, lane, acc_w);
            vjp_tail<C>(Gb, P1, DPs, Us, Ws, true, raw);
            if (want_du) param_acc<C>(vs, DPs, lane, acc_u);  // vs holds vh
            // lvh = lv (1 - h mu) + dt gx + J^T g'; df += h (lv + lvh)
            rl.load(t1, gx, vec);
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) {
                    const T lvh = lv[i][j] * (T(1) - h * mur[j]) + dt * t1[i][j] + raw[i][j];
                    if (want_df) DF[(i * C::TJ + j) * GEO_NT] += h * lv[i][j] + h * lvh;
                    lv[i][j] = lvh;
                    t1[i][j] = (m0 >> (i * C::TJ + j)) & 1u ? -h * lvh : T(0);
                }
            // first kick
            rl.to_slice(t1, gs);
            __syncwarp();
            if (want_dw) param_acc<C>(gs, S0, lane, acc_w);
            vjp_tail<C>(Gb, P0, DPs, Us, Ws, true, raw);
            if (want_du) {
#pragma unroll
                for (int i = 0; i < C::TI; ++i)
#pragma unroll
                    for (int j = 0; j < C::TJ; ++j) t0[i][j] = VT[(i * C::TJ + j) * GEO_NT];
                rl.to_slice(t0, vs);
                __syncwarp();
                param_acc<C>(vs, DPs, lane, acc_u);
            }
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) lv[i][j] = lv[i][j] * (T(1) - h * mur[j]) + raw[i][j];
        }
        if (a.want & GEO_WANT_DV) rl.store(lv, reinterpret_cast<T*>(a.dv), vec);
        if (want_df) {
#pragma unroll
            for (int i = 0; i < C::TI; ++i)
#pragma unroll
                for (int j = 0; j < C::TJ; ++j) t1[i][j] = DF[(i * C::TJ + j) * GEO_NT];
            rl.store(t1, reinterpret_cast<T*>(a.df), vec);
        }
        if (a.want & GEO_WANT_DX) {
            rl.load(t1, gx, vec);
            rl.store(t1, reinterpret_cast<T*>(a.dx), vec);
        }
    }
    if (want_du) param_store<C>(acc_u, param_part<C>(a.du_part, a));
    if (want_dw) param_store<C>(acc_w, param_part<C>(a.dw_part, a));
}

// ---------------------------------------------------------------- generic path
// Groups of GEN_RG rows per block iteration; per-row vectors live in this block's
// global workspace; U, W are read from global memory (L1/L2).

// out[m][r] = sum_d A[m*lda + d] M[d*R + r] for m < nr: epi(m, r, value). Block-wide.
template <typename T, typename Epi>
__device__ void gen_vecmat(const T* A, i64 lda, int nr, const T* Mt, i64 D, i64 R, T* red, Epi epi) {
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (i64 r0 = 0; r0 < R; r0 += 32) {
        const i64 r = r0 + lane;
        T acc[GEN_RG];
#pragma unroll
        for (int m = 0; m < GEN_RG; ++m) acc[m] = T(0);
        if (r < R) {
            for (i64 d = w; d < D; d += GEO_NW) {
                const T mv = Mt[d * R + r];
#pragma unroll
                for (int m = 0; m < GEN_RG; ++m)
                    if (m < nr) acc[m] = fma(A[m * lda + d], mv, acc[m]);
            }
        }
#pragma unroll
        for (int m = 0; m < GEN_RG; ++m) red[(w * GEN_RG + m) * 32 + lane] = acc[m];
        __syncthreads();
        if (threadIdx.x < GEN_RG * 32) {
            const int m = threadIdx.x >> 5, l = threadIdx.x & 31;
            if (m < nr && r0 + l < R) {
                T s = red[m * 32 + l];
                for (int ww = 1; ww < GEO_NW; ++ww) s += red[(ww * GEN_RG + m) * 32 + l];
                epi(m, r0 + l, s);
            }
        }
        __syncthreads();
    }
}

// For every feature d (one thread each) and m < nr: fn(m, d, sum_r S[m*R + r] M[d*R + r]).
template <typename T, typename Fn>
__device__ void gen_rows(const T* S, int nr, const T* Mt, i64 D, i64 R, Fn fn) {
    for (i64 d = threadIdx.x; d < D; d += GEO_NT) {
        T acc[GEN_RG];
#pragma unroll
        for (int m = 0; m < GEN_RG; ++m) acc[m] = T(0);
        const T* mrow = Mt + d * R;
        for (i64 r = 0; r < R; ++r) {
            const T mv = mrow[r];
#pragma unroll
            for (int m = 0; m < GEN_RG; ++m)
                if (m < nr) acc[m] = fma(S[m * R + r], mv, acc[m]);
        }
#pragma unroll
        for (int m = 0; m < GEN_RG; ++m)
            if (m < nr) fn(m, d, acc[m]);
    }
}

// part[d*R + r] += sum_{m < nr} X[m*ldx + d] Y[m*R + r].
template <typename T>
__device__ void gen_param(T* part, const T* X, i64 ldx, const T* Y, int nr, i64 D, i64 R) {
    for (i64 idx = threadIdx.x; idx < D * R; idx += GEO_NT) {
        const i64 d = idx / R, r = idx - d * R;
        T acc = part[idx];
        for (int m = 0; m < nr; ++m) acc = fma(X[m * ldx + d], Y[m * R + r], acc);
        part[idx] = acc;
    }
}

template <typename T> __device__ void gen_zero(T* p, i64 n) {
    for (i64 i = threadIdx.x; i < n; i += GEO_NT) p[i] = T(0);
}

template <typename T> __device__ void chr_fwd_gen(const GeoArgs& a) {
    __shared__ T red[GEO_NW * GEN_RG * 32];
    const i64 B = a.B, D = a.D, R = a.R;
    const T c = T(a.c);
    const T* v = reinterpret_cast<const T*>(a.v0);
    const T* U = reinterpret_cast<const T*>(a.u);
    const T* W = reinterpret_cast<const T*>(a.w);
    T* out = reinterpret_cast<T*>(a.gamma);
    T* S = reinterpret_cast<T*>(a.ws) + (i64)blockIdx.x * a.ws_per_cta;
    for (i64 row0 = (i64)blockIdx.x * GEN_RG; row0 < B; row0 += (i64)gridDim.x * GEN_RG) {
        const int nr = (int)min((i64)GEN_RG, B - row0);
        gen_vecmat(v + row0 * D, D, nr, U, D, R, red, [&](int m, i64 r, T s) { S[m * R + r] = s * s; });
        gen_rows(S, nr, W, D, R, [&](int m, i64 d, T acc) { out[(row0 + m) * D + d] = clampc(acc, c); });
        __syncthreads();
    }
}

template <typename T> __device__ void chr_bwd_gen(const GeoArgs& a) {
    __shared__ T red[GEO_NW * GEN_RG * 32];
    const i64 B = a.B, D = a.D, R = a.R;
    const T c = T(a.c);
    const T* v = reinterpret_cast<const T*>(a.v0);
    const T* g = reinterpret_cast<const T*>(a.g);
    const T* U = reinterpret_cast<const T*>(a.u);
    const T* W = reinterpret_cast<const T*>(a.w);
    T* dv = reinterpret_cast<T*>(a.dv);
    T* ws = reinterpret_cast<T*>(a.ws) + (i64)blockIdx.x * a.ws_per_cta;
    T* P = ws;
    T* S = P + GEN_RG * R;
    T* DP = S + GEN_RG * R;
    T* Gp = DP + GEN_RG * R;
    const bool want_dv = a.want & GEO_WANT_DV, want_du = a.want & GEO_WANT_DU, want_dw = a.want & GEO_WANT_DW;
    T* du = want_du ? reinterpret_cast<T*>(a.du_part) + (i64)blockIdx.x * D * R : nullptr;
    T* dw = want_dw ? reinterpret_cast<T*>(a.dw_part) + (i64)blockIdx.x * D * R : nullptr;
    if (want_du) gen_zero(du, D * R);
    if (want_dw) gen_zero(dw, D * R);
    __syncthreads();
    for (i64 row0 = (i64)blockIdx.x * GEN_RG; row0 < B; row0 += (i64)gridDim.x * GEN_RG) {
        const int nr = (int)min((i64)GEN_RG, B - row0);
        const T* vr = v + row0 * D;
        gen_vecmat(vr, D, nr, U, D, R, red, [&](int m, i64 r, T s) {
            P[m * R + r] = s;
            S[m * R + r] = s * s;
        });
        gen_rows(S, nr, W, D, R, [&](int m, i64 d, T acc) {
            Gp[m * D + d] = passc(acc, c) ? g[(row0 + m) * D + d] : T(0);
        });
        __syncthreads();
        gen_vecmat(Gp, D, nr, W, D, R, red, [&](int m, i64 r, T s) { DP[m * R + r] = T(2) * P[m * R + r] * s; });
        if (want_dv) gen_rows(DP, nr, U, D, R, [&](int m, i64 d, T acc) { dv[(row0 + m) * D + d] = acc; });
        if (want_dw) gen_param(dw, Gp, D, S, nr, D, R);
        if (want_du) gen_param(du, vr, D, DP, nr, D, R);
        __syncthreads();
    }
}

template <typename T> __device__ void lf_fwd_gen(const GeoArgs& a) {
    __shared__ T red[GEO_NW * GEN_RG * 32];
    const i64 B = a.B, D = a.D, R = a.R, BD = a.B * a.D;
    const T c = T(a.c), dt = T(a.dt), h = T(0.5 * a.dt);
    const T* x0 = reinterpret_cast<const T*>(a.x0);
    const T* v0 = reinterpret_cast<const T*>(a.v0);
    const T* f = reinterpret_cast<const T*>(a.f);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    const T* U = reinterpret_cast<const T*>(a.u);
    const T* W = reinterpret_cast<const T*>(a.w);
    T* xo = reinterpret_cast<T*>(a.x_out);
    T* vo = reinterpret_cast<T*>(a.v_out);
    T* traj = reinterpret_cast<T*>(a.traj);
    T* S = reinterpret_cast<T*>(a.ws) + (i64)blockIdx.x * a.ws_per_cta;
    for (i64 row0 = (i64)blockIdx.x * GEN_RG; row0 < B; row0 += (i64)gridDim.x * GEN_RG) {
        const int nr = (int)min((i64)GEN_RG, B - row0);
        // the state lives in x_out, v_out (exact in-place x_out == x0 is fine)
        for (i64 k = threadIdx.x; k < nr * D; k += GEO_NT) {
            xo[row0 * D + k] = x0[row0 * D + k];
            vo[row0 * D + k] = v0[row0 * D + k];
        }
        __syncthreads();
        for (i64 t = 0; t < a.steps; ++t) {
            for (int half = 0; half < 2; ++half) {
                gen_vecmat(vo + row0 * D, D, nr, U, D, R, red, [&](int m, i64 r, T s) { S[m * R + r] = s * s; });
                gen_rows(S, nr, W, D, R, [&](int m, i64 d, T acc) {
                    const i64 o = (row0 + m) * D + d;
                    const T vv = vo[o];
                    const T ff = f != nullptr ? f[o] : T(0);
                    const T mm = mu != nullptr ? mu[d] : T(0);
                    const T vn = vv + h * (ff - clampc(acc, c) - mm * vv);
                    vo[o] = vn;
                    if (half == 0) {
                        xo[o] += dt * vn;
                    } else if (traj != nullptr) {
                        traj[(2 * t) * BD + o] = xo[o];
                        traj[(2 * t + 1) * BD + o] = vn;
                    }
                });
                __syncthreads();
            }
        }
    }
}

template <typename T> __device__ void lf_bwd_gen(const GeoArgs& a) {
    __shared__ T red[GEO_NW * GEN_RG * 32];
    const i64 B = a.B, D = a.D, R = a.R, BD = a.B * a.D;
    const T c = T(a.c), dt = T(a.dt), h = T(0.5 * a.dt);
    const T* v0 = reinterpret_cast<const T*>(a.v0);
    const T* f = reinterpret_cast<const T*>(a.f);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    const T* U = reinterpret_cast<const T*>(a.u);
    const T* W = reinterpret_cast<const T*>(a.w);
    const T* traj = reinterpret_cast<const T*>(a.traj);
    const T* gx = reinterpret_cast<const T*>(a.gx);
    const T* gv = reinterpret_cast<const T*>(a.gv);
    T* ws = reinterpret_cast<T*>(a.ws) + (i64)blockIdx.x * a.ws_per_cta;
    T* P0 = ws;
    T* S0 = P0 + GEN_RG * R;
    T* P1 = S0 + GEN_RG * R;
    T* S1 = P1 + GEN_RG * R;
    T* DP = S1 + GEN_RG * R;
    T* VH = DP + GEN_RG * R;
    T* M0 = VH + GEN_RG * D;
    T* GP = M0 + GEN_RG * D;
    T* LV = GP + GEN_RG * D;
    T* slab = LV + GEN_RG * D;  // (T-1) x GEN_RG x D when there is no trajectory
    const bool want_du = a.want & GEO_WANT_DU, want_dw = a.want & GEO_WANT_DW, want_df = a.want & GEO_WANT_DF;
    T* du = want_du ? reinterpret_cast<T*>(a.du_part) + (i64)blockIdx.x * D * R : nullptr;
    T* dw = want_dw ? reinterpret_cast<T*>(a.dw_part) + (i64)blockIdx.x * D * R : nullptr;
    T* df = reinterpret_cast<T*>(a.df);
    if (want_du) gen_zero(du, D * R);
    if (want_dw) gen_zero(dw, D * R);
    __syncthreads();
    auto kick = [&](T* vrow, i64 row0, int nr, T* Sbuf) {
        // vrow [nr][D] in place: v += h (f - Gamma(v) - mu v)
        gen_vecmat(vrow, D, nr, U, D, R, red, [&](int m, i64 r, T s) { Sbuf[m * R + r] = s * s; });
        gen_rows(Sbuf, nr, W, D, R, [&](int m, i64 d, T acc) {
            const T vv = vrow[m * D + d];
            const T ff = f != nullptr ? f[(row0 + m) * D + d] : T(0);
            const T mm = mu != nullptr ? mu[d] : T(0);
            vrow[m * D + d] = vv + h * (ff - clampc(acc, c) - mm * vv);
        });
        __syncthreads();
    };
    for (i64 row0 = (i64)blockIdx.x * GEN_RG; row0 < B; row0 += (i64)gridDim.x * GEN_RG) {
        const int nr = (int)min((i64)GEN_RG, B - row0);
        if (traj == nullptr) {
            for (i64 t = 0; t + 1 < a.steps; ++t) {
                T* dst = slab + t * GEN_RG * D;
                const T* src = t == 0 ? v0 + row0 * D : slab + (t - 1) * GEN_RG * D;
                for (i64 k = threadIdx.x; k < nr * D; k += GEO_NT) dst[k] = src[k];
                __syncthreads();
                kick(dst, row0, nr, S1);
                kick(dst, row0, nr, S1);
            }
        }
        for (i64 k = threadIdx.x; k < nr * D; k += GEO_NT) {
            LV[k] = gv != nullptr ? gv[row0 * D + k] : T(0);
            if (want_df) df[row0 * D + k] = T(0);
        }
        __syncthreads();
        for (i64 t = a.steps - 1; t >= 0; --t) {
            const T* vt = t == 0 ? v0 + row0 * D
                          : traj != nullptr ? traj + (2 * (t - 1) + 1) * BD + row0 * D
                                            : slab + (t - 1) * GEN_RG * D;
            gen_vecmat(vt, D, nr, U, D, R, red, [&](int m, i64 r, T s) {
                P0[m * R + r] = s;
                S0[m * R + r] = s * s;
            });
            gen_rows(S0, nr, W, D, R, [&](int m, i64 d, T acc) {
                const i64 k = m * D + d;
                const T vv = vt[k];
                const T ff = f != nullptr ? f[row0 * D + k] : T(0);
                const T mm = mu != nullptr ? mu[d] : T(0);
                M0[k] = passc(acc, c) ? T(1) : T(0);
                VH[k] = vv + h * (ff - clampc(acc, c) - mm * vv);
            });
            __syncthreads();
            gen_vecmat(VH, D, nr, U, D, R, red, [&](int m, i64 r, T s) {
                P1[m * R + r] = s;
                S1[m * R + r] = s * s;
            });
            gen_rows(S1, nr, W, D, R, [&](int m, i64 d, T acc) {
                const i64 k = m * D + d;
                const T lv = LV[k];
                if (want_df) df[row0 * D + k] += h * lv;
                GP[k] = passc(acc, c) ? -h * lv : T(0);
            });
            __syncthreads();
            gen_vecmat(GP, D, nr, W, D, R, red, [&](int m, i64 r, T s) { DP[m * R + r] = T(2) * P1[m * R + r] * s; });
            if (want_dw) gen_param(dw, GP, D, S1, nr, D, R);
            if (want_du) gen_param(du, VH, D, DP, nr, D, R);
            __syncthreads();
            gen_rows(DP, nr, U, D, R, [&](int m, i64 d, T acc) {
                const i64 k = m * D + d;
                const T mm = mu != nullptr ? mu[d] : T(0);
                const T gxv = gx != nullptr ? gx[row0 * D + k] : T(0);
                const T lvh = LV[k] * (T(1) - h * mm) + dt * gxv + acc;
                LV[k] = lvh;
                if (want_df) df[row0 * D + k] += h * lvh;
                GP[k] = M0[k] != T(0) ? -h * lvh : T(0);
            });
            __syncthreads();
            gen_vecmat(GP, D, nr, W, D, R, red, [&](int m, i64 r, T s) { DP[m * R + r] = T(2) * P0[m * R + r] * s; });
            if (want_dw) gen_param(dw, GP, D, S0, nr, D, R);
            if (want_du) gen_param(du, vt, D, DP, nr, D, R);
            __syncthreads();
            gen_rows(DP, nr, U, D, R, [&](int m, i64 d, T acc) {
                const i64 k = m * D + d;
                const T mm = mu != nullptr ? mu[d] : T(0);
                LV[k] = LV[k] * (T(1) - h * mm) + acc;
            });
            __syncthreads();
        }
        for (i64 k = threadIdx.x; k < nr * D; k += GEO_NT) {
            if (a.want & GEO_WANT_DV) reinterpret_cast<T*>(a.dv)[row0 * D + k] = LV[k];
            if (a.want & GEO_WANT_DX) reinterpret_cast<T*>(a.dx)[row0 * D + k] = gx != nullptr ? gx[row0 * D + k] : T(0);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- entry points
// Module contents: the host defines GEO_T, one GEO_MODULE_<op>, and either
// GEO_CFG_RP + GEO_CFG_DJ (a module with that one fast kernel) or GEO_GENERIC (the
// generic kernel, and geo_reduce for the backwards). With neither, everything of
// the op is instantiated (tests/emu, scripts/ptxas_report.py).
#if !defined(GEO_CFG_RP) && !defined(GEO_GENERIC)
#define GEO_ALL 1
#endif

#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && (defined(GEO_MODULE_CHR_BWD) || defined(GEO_MODULE_LF_BWD))
// Partial [D, R] sums of the blocks, added in block order (f64 accumulation). The
// partials of GEO_REDUCE_KB blocks are loaded before they are added (in the same
// order), so that a thread waits one memory latency per batch. The Christoffel
// backward's fast kernels write their partials in the parameter layout (param_store;
// element q * GEO_NT + t holds accumulator q of thread t), mapped back to [D][R] here;
// the other kernels' are [D][R] (`kw` = 0).
#define GEO_REDUCE_KB 16
extern "C" __global__ void __launch_bounds__(GEO_NT) geo_reduce(const ReduceArgs a) {
    const GEO_T* parts = reinterpret_cast<const GEO_T*>(a.parts);
    GEO_T* out = reinterpret_cast<GEO_T*>(a.out);
    for (i64 i = (i64)blockIdx.x * GEO_NT + threadIdx.x; i < a.n; i += (i64)gridDim.x * GEO_NT) {
        double s = 0.0;
        const GEO_T* q = parts + i;
        i64 p = 0;
        for (; p + GEO_REDUCE_KB <= a.nparts; p += GEO_REDUCE_KB) {
            GEO_T v[GEO_REDUCE_KB];
#pragma unroll
            for (int k = 0; k < GEO_REDUCE_KB; ++k) v[k] = q[(p + k) * a.n];
#pragma unroll
            for (int k = 0; k < GEO_REDUCE_KB; ++k) s += (double)v[k];
        }
        for (; p < a.nparts; ++p) s += (double)q[p * a.n];
        if (a.kw == 0) {
            out[i] = (GEO_T)s;
        } else {
            // param_acc's (d, r) of accumulator k = (b pv + jj) rq + kk of thread t
            const int t = (int)(i % GEO_NT), k = (int)(i / GEO_NT);
            const int lane = t & 31, kk = k % a.rq, bj = k / a.rq, jj = bj % a.pv, b = bj / a.pv;
            const i64 d = (i64)(t >> 5) * a.kw + b * 8 * a.pv + (lane & 7) * a.pv + jj;
            const i64 r = (i64)(lane >> 3) * a.rq + kk;
            if (d < a.D && r < a.R) out[d * a.R + r] = (GEO_T)s;
        }
    }
}
#endif

#if defined(GEO_GENERIC) || defined(GEO_ALL)
// The GEMM route (R or D beyond the fast kernels, see src/cuda/geodesic/route.rs): the
// products run in cuBLAS, these elementwise steps in between. Each thread takes
// V = 16 / sizeof(T) consecutive elements per step where `vec` (the host checked that
// every pointer is 16-byte aligned and n and d are multiples of V: 16-byte loads and
// stores, one i % d per V elements), else one.
template <int N> struct Width { static constexpr int n = N; };
template <typename F> __device__ __forceinline__ void ew_loop(i64 n, int vec, F f) {
    constexpr int V = 16 / sizeof(GEO_T);
    const i64 t0 = (i64)blockIdx.x * GEO_NT + threadIdx.x, st = (i64)gridDim.x * GEO_NT;
    if (vec) {
        for (i64 i = t0 * V; i < n; i += st * V) f(Width<V>{}, i);
    } else {
        for (i64 i = t0; i < n; i += st) f(Width<1>{}, i);
    }
}
// N elements from p + i (NULL: zeros)
template <int N> __device__ __forceinline__ void ld_opt(const GEO_T* p, i64 i, GEO_T (&o)[N]) {
    if (p != nullptr) {
        ldv<N>(p + i, o);
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) o[e] = GEO_T(0);
    }
}
// GEO_EW(NAME, EXPR, RY): y[i] = EXPR(y[i], x[i], c) over n elements (x NULL: zeros;
// y read only where RY)
// struct EwArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source
#define GEO_EW(NAME, EXPR, RY)                                                                \
    extern "C" __global__ void __launch_bounds__(GEO_NT) NAME(const EwArgs a) {             \
        GEO_T* y = reinterpret_cast<GEO_T*>(a.y);                                           \
        const GEO_T* x = reinterpret_cast<const GEO_T*>(a.x);                               \
        const GEO_T c = (GEO_T)a.c;                                                         \
        (void)c;                                                                            \
        ew_loop(a.n, a.vec, [&](auto wd, i64 i) {                                           \
            constexpr int N = decltype(wd)::n;                                              \
            GEO_T yv[N], xv[N];                                                             \
            ld_opt<N>(x, i, xv);                                                            \
            ld_opt<N>(RY ? y : nullptr, i, yv);                                             \
            _Pragma("unroll") for (int e = 0; e < N; ++e) yv[e] = EXPR(yv[e], xv[e], c);   \
            stv<N>(y + i, yv);                                                              \
        });                                                                                 \
    }
#define GEO_SQUARE(y_, x_, c_) (x_ * x_)
GEO_EW(geo_square, GEO_SQUARE, 0)  // s = p * p (y may be x)
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && (defined(GEO_MODULE_CHR_BWD) || defined(GEO_MODULE_LF_BWD))
#define GEO_DP(y_, x_, c_) (GEO_T(2) * x_ * y_)
GEO_EW(geo_dp, GEO_DP, 1)  // dp = 2 p q over q
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && defined(GEO_MODULE_CHR_BWD)
#define GEO_MASK(y_, x_, c_) (passc(y_, c_) ? x_ : GEO_T(0))
GEO_EW(geo_mask, GEO_MASK, 1)  // g' = g 1[-c <= raw <= c] over raw
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && defined(GEO_MODULE_CHR_FWD)
#define GEO_CLAMP(y_, x_, c_) clampc(y_, c_)
GEO_EW(geo_clamp, GEO_CLAMP, 1)  // gamma = clamp(raw) in place
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL))
// struct KickArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source
// The route's second product with what follows it fused in (geo_sw): for a tile of
// GEO_SW_M rows, raw = (P^2) W^T (P = v U from cuBLAS, squared here), then by `mode`:
// gamma = clamp(raw) into k.v (GEO_SW_CLAMP, the Christoffel forward), the kick of
// geo_kick (GEO_SW_KICK; k.raw unused), or g' = g 1[-c <= raw <= c] into k.v with g at
// k.vin (GEO_SW_MASK, the Christoffel backward). raw never goes to memory, and the
// square, the clamp, the mask and the kick are no passes of their own. W stays in
// shared memory for the whole (persistent) block, as [D][RS] with RS = R rounded up
// to 4 and to an odd number of 16-byte chunks (every lane's 16-byte loads of its own
// feature row in a different bank group); the tile's S beside it, transposed
// ([R4][GEO_SW_M], R4 = R rounded up to 4): a warp's lanes hold different features and
// the same rows, so S is read as 16-byte broadcasts. The host takes this kernel where
// that fits the device's shared memory and the products are strict
// (src/cuda/geodesic/plan.rs, `sw_smem`).
// struct SwArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source
#define GEO_SW_CLAMP 0
#define GEO_SW_KICK 1
#define GEO_SW_MASK 2
#define GEO_SW_M (sizeof(GEO_T) == 4 ? 32 : 16)  // rows per tile (f64: the accumulators take twice the registers)
__device__ __forceinline__ int geo_sw_stride(i64 r) {
    const int q = (int)((r + 3) / 4);  // 16-byte chunks of a row
    return 4 * (q % 2 == 0 ? q + 1 : q);
}
extern "C" __global__ void __launch_bounds__(GEO_NT, 1) geo_sw(const SwArgs a) {
    typedef GEO_T T;
    constexpr int M = GEO_SW_M;
    const i64 D = a.k.d, R = a.r, B = a.k.n / D;
    const int RS = geo_sw_stride(R);
    if ((u64)(D + M) * RS * sizeof(T) > dyn_smem_size()) __trap();
    T* Ws = reinterpret_cast<T*>(geo_smem);
    T* Ss = Ws + D * RS;  // [R4][M] (R4 <= RS)
    const T* P = reinterpret_cast<const T*>(a.p);
    const T* W = reinterpret_cast<const T*>(a.w);
    const T h = (T)a.k.h, dt = (T)a.k.dt, c = (T)a.k.c;
    const T* vin = reinterpret_cast<const T*>(a.k.vin);
    T* x = reinterpret_cast<T*>(a.k.x);
    T* v = reinterpret_cast<T*>(a.k.v);
    const T* f = reinterpret_cast<const T*>(a.k.f);
    const T* mu = reinterpret_cast<const T*>(a.k.mu);
    T* tx = reinterpret_cast<T*>(a.k.tx);
    T* tv = reinterpret_cast<T*>(a.k.tv);
    // W, zero padded; batches of 8 loads before their stores, 16 bytes each where W's
    // rows are whole 16-byte chunks (a launch's prologue: 4 rounds instead of 17 at
    // D = 512, R = 64, f32)
    constexpr int CH = 16 / sizeof(T);
    if (R % CH == 0 && (a.w & 15) == 0) {
        const i64 nq = D * R / CH;
        for (i64 q0 = threadIdx.x; q0 < nq; q0 += 8 * GEO_NT) {
            T wv[8][CH];
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (q0 + k * GEO_NT < nq) ldv<CH>(W + (q0 + k * GEO_NT) * CH, wv[k]);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const i64 e = (q0 + k * GEO_NT) * CH, d = e / R;
                if (q0 + k * GEO_NT < nq) stv<CH>(Ws + d * RS + (e - d * R), wv[k]);
            }
        }
        for (i64 i = threadIdx.x; i < D * (RS - R); i += GEO_NT) {
            const i64 d = i / (RS - R);
            Ws[d * RS + R + (i - d * (RS - R))] = T(0);
        }
    } else {
        for (i64 i0 = threadIdx.x; i0 < D * RS; i0 += 8 * GEO_NT) {
            T wv[8];
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                const i64 i = i0 + k * GEO_NT, d = i / RS, r = i - d * RS;
                wv[k] = (i < D * RS && r < R) ? W[d * R + r] : T(0);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (i0 + k * GEO_NT < D * RS) Ws[i0 + k * GEO_NT] = wv[k];
        }
    }
    const int R4 = (int)((R + 3) / 4 * 4);
    const i64 ntiles = (B + M - 1) / M;
    for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const i64 row0 = tile * M;
        __syncthreads();  // W is in; the previous tile's reads of Ss are done
        // S = P^2 of the tile, transposed ([R4][M]: the M rows of one r side by side,
        // 16-byte broadcast loads at immediate offsets below), zero past R and B
        for (int i = threadIdx.x; i < M * R4; i += GEO_NT) {
            const int r = i / M, m = i - r * M;
            const T pv = (row0 + m < B && r < R) ? P[(row0 + m) * R + r] : T(0);
            Ss[i] = pv * pv;
        }
        if (a.mode != GEO_SW_CLAMP) {  // the epilogue's rows, from DRAM into L2 while the product runs
            prefetch_rows_l2(vin, row0, M, B, D);
            prefetch_rows_l2(f, row0, M, B, D);
            prefetch_rows_l2(x, row0, M, B, D);
        }
        __syncthreads();
        for (i64 f0 = 0; f0 < D; f0 += 2 * GEO_NT) {
            // features fe[0], fe[1] of this thread (past D: computed on row D - 1, unused)
            const i64 fe[2] = {f0 + threadIdx.x, f0 + GEO_NT + threadIdx.x};
            const T* wa = Ws + min(fe[0], D - 1) * RS;
            const T* wb = Ws + min(fe[1], D - 1) * RS;
            T acc[2][M];
#pragma unroll
            for (int m = 0; m < M; ++m) acc[0][m] = acc[1][m] = T(0);
            for (int r0 = 0; r0 < R4; r0 += 4) {  // raw = sum over r in order, as phase_b
                T w0[4], w1[4];
                ldv<4>(wa + r0, w0);
                ldv<4>(wb + r0, w1);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const T* sr = Ss + (r0 + e) * M;
#pragma unroll
                    for (int q = 0; q < M; q += 4) {
                        T sv[4];
                        ldv<4>(sr + q, sv);
#pragma unroll
                        for (int k = 0; k < 4; ++k) {
                            acc[0][q + k] = fma(sv[k], w0[e], acc[0][q + k]);
                            acc[1][q + k] = fma(sv[k], w1[e], acc[1][q + k]);
                        }
                    }
                }
            }
            // the epilogue: element (m, k) at row0 + m, fe[k]; a full tile (every row and
            // both features in range) without per-element checks
            const bool ok[2] = {fe[0] < D, fe[1] < D};
            const bool full = row0 + M <= B && ok[1];
            auto in = [&](int m, int k) { return full || (row0 + m < B && ok[k]); };
            const i64 base = row0 * D + fe[0];  // element (m, k): base + m D + k GEO_NT
            if (a.mode == GEO_SW_CLAMP) {
#pragma unroll
                for (int m = 0; m < M; ++m)
#pragma unroll
                    for (int k = 0; k < 2; ++k)
                        if (in(m, k)) v[base + m * D + k * GEO_NT] = clampc_fast(acc[k][m], c);
                continue;
            }
            if (a.mode == GEO_SW_MASK) {
                constexpr int G = 8;
#pragma unroll
                for (int m0 = 0; m0 < M; m0 += G) {
                    T gg[G][2];
#pragma unroll
                    for (int mm = 0; mm < G; ++mm)
#pragma unroll
                        for (int k = 0; k < 2; ++k)
                            gg[mm][k] = in(m0 + mm, k) ? vin[base + (m0 + mm) * D + k * GEO_NT] : T(0);
#pragma unroll
                    for (int mm = 0; mm < G; ++mm)
#pragma unroll
                        for (int k = 0; k < 2; ++k)
                            if (in(m0 + mm, k))
                                v[base + (m0 + mm) * D + k * GEO_NT] = passc(acc[k][m0 + mm], c) ? gg[mm][k] : T(0);
                }
                continue;
            }
            // geo_kick's element; per G rows every load before any use
            constexpr int G = sizeof(T) == 4 ? 8 : 4;
            T mi[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) mi[k] = (mu != nullptr && ok[k]) ? mu[fe[k]] : T(0);
#pragma unroll
            for (int m0 = 0; m0 < M; m0 += G) {
                T vv[G][2], ff[G][2], xx[G][2];
#pragma unroll
                for (int mm = 0; mm < G; ++mm)
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        const i64 i = base + (m0 + mm) * D + k * GEO_NT;
                        const bool e = in(m0 + mm, k);
                        vv[mm][k] = e ? vin[i] : T(0);
                        ff[mm][k] = (e && f != nullptr) ? f[i] : T(0);
                        xx[mm][k] = (e && x != nullptr) ? x[i] : T(0);
                    }
#pragma unroll
                for (int mm = 0; mm < G; ++mm)
#pragma unroll
                    for (int k = 0; k < 2; ++k) {
                        if (!in(m0 + mm, k)) continue;
                        const i64 i = base + (m0 + mm) * D + k * GEO_NT;
                        const T vi = vv[mm][k] + h * (ff[mm][k] - clampc(acc[k][m0 + mm], c) - mi[k] * vv[mm][k]);
                        v[i] = vi;
                        if (x != nullptr) {
                            const T xi = xx[mm][k] + dt * vi;
                            x[i] = xi;
                            if (tx != nullptr) tx[i] = xi;
                        }
                        if (tv != nullptr) tv[i] = vi;
                    }
            }
        }
    }
}
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && (defined(GEO_MODULE_LF_FWD) || defined(GEO_MODULE_LF_BWD))
// One kick of the leapfrog, v = vin + h (f - clamp(raw) - mu vin) (vin may be v: in
// place), then (x given) the drift x += dt v, and (tx, tv) copies of the new x, v (the
// trajectory). The backward uses it to recompute vh from v_t (vin = v_t, no drift).
extern "C" __global__ void __launch_bounds__(GEO_NT) geo_kick(const KickArgs a) {
    typedef GEO_T T;
    const T h = (T)a.h, dt = (T)a.dt, c = (T)a.c;
    const T* vin = reinterpret_cast<const T*>(a.vin);
    T* x = reinterpret_cast<T*>(a.x);
    T* v = reinterpret_cast<T*>(a.v);
    const T* raw = reinterpret_cast<const T*>(a.raw);
    const T* f = reinterpret_cast<const T*>(a.f);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    ew_loop(a.n, a.vec, [&](auto wd, i64 i) {
        constexpr int N = decltype(wd)::n;
        T vi[N], ri[N], fi[N], mi[N];
        ldv<N>(vin + i, vi);
        ldv<N>(raw + i, ri);
        ld_opt<N>(f, i, fi);
        ld_opt<N>(mu, mu != nullptr ? i % a.d : 0, mi);
#pragma unroll
        for (int e = 0; e < N; ++e) vi[e] = vi[e] + h * (fi[e] - clampc(ri[e], c) - mi[e] * vi[e]);
        stv<N>(v + i, vi);
        if (x != nullptr) {
            T xi[N];
            ldv<N>(x + i, xi);
#pragma unroll
            for (int e = 0; e < N; ++e) xi[e] += dt * vi[e];
            stv<N>(x + i, xi);
            if (a.tx) stv<N>(reinterpret_cast<T*>(a.tx) + i, xi);
        }
        if (a.tv) stv<N>(reinterpret_cast<T*>(a.tv) + i, vi);
    });
}
#endif
#if (defined(GEO_GENERIC) || defined(GEO_ALL)) && defined(GEO_MODULE_LF_BWD)
#define GEO_COPY(y_, x_, c_) (x != nullptr ? x_ : c_)
GEO_EW(geo_copy, GEO_COPY, 0)  // dx0 = gx, or c (0) without gx
// struct AdjArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source
// The leapfrog backward's adjoint update at one kick (docs/geodesic.md, "Its
// backward"), per element with l = lv_in[i] and g[i] = gamma_raw at the kick's input:
// df += h l; g = 1[-c <= raw <= c] (-h l), the cotangent of the kick's Christoffel
// vjp, whose dv cuBLAS then adds to lv; lv = l (1 - h mu) + dt gx (lv may be lv_in).
// At the second kick (lv = dL/dv_{t+1}) this leaves lvh minus its vjp term in lv, at
// the first (lv = lvh, gx = 0) lv_t minus its vjp term.
extern "C" __global__ void __launch_bounds__(GEO_NT) geo_adj(const AdjArgs a) {
    typedef GEO_T T;
    const T h = (T)a.h, dt = (T)a.dt, c = (T)a.c;
    const T* lv_in = reinterpret_cast<const T*>(a.lv_in);
    T* lv = reinterpret_cast<T*>(a.lv);
    T* g = reinterpret_cast<T*>(a.g);
    T* df = reinterpret_cast<T*>(a.df);
    const T* gx = reinterpret_cast<const T*>(a.gx);
    const T* mu = reinterpret_cast<const T*>(a.mu);
    ew_loop(a.n, a.vec, [&](auto wd, i64 i) {
        constexpr int N = decltype(wd)::n;
        T l[N], gi[N], mi[N], gxi[N];
        ld_opt<N>(lv_in, i, l);
        ldv<N>(g + i, gi);
        ld_opt<N>(mu, mu != nullptr ? i % a.d : 0, mi);
        ld_opt<N>(gx, i, gxi);
        if (df != nullptr) {
            T d[N];
            ld_opt<N>(a.df_init ? nullptr : df, i, d);
#pragma unroll
            for (int e = 0; e < N; ++e) d[e] += h * l[e];
            stv<N>(df + i, d);
        }
#pragma unroll
        for (int e = 0; e < N; ++e) {
            gi[e] = passc(gi[e], c) ? -h * l[e] : T(0);
            l[e] = l[e] * (T(1) - h * mi[e]) + dt * gxi[e];
        }
        stv<N>(g + i, gi);
        stv<N>(lv + i, l);
    });
}
#endif

// Rows per thread of the fast kernels: forwards and the Christoffel backward use
// tiles of 16 rows (8 for DJ = 16); the leapfrog backward, which also keeps its
// adjoints and the dU, dW accumulators in registers, half of that.
#define GEO_MB_A(DJ) ((DJ) <= 8 ? 4 : 2)
#define GEO_MB_B(DJ) ((DJ) <= 8 ? 2 : 1)
// The FFMA Christoffel forward: tiles of 32 rows (16 for DJ = 16), one group of GEO_NT.
#define GEO_MB_CF(DJ) ((DJ) <= 8 ? 8 : 4)
// Threads per block of the FFMA fast kernels (the TF32 ones: GEO_FAST_NT).
#define GEO_SIMT_NT GEO_NT

#define GEO_ENTRY(NAME, FN, SMEM, MBX, RP, DJ)                                                                   \
    extern "C" __global__ void __launch_bounds__(GEO_SIMT_NT, 1) geo_##NAME##_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<GEO_T, RP, DJ, MBX(DJ)> C;                                                            \
        if constexpr (C::SMEM * sizeof(GEO_T) <= GEO_SMEM_MAX) FN<C>(a);                                  \
        else __trap();                                                                                     \
    }
// TF32 variants (GEO_TF32: f32 modules of the forwards): geo_<op>_tc_r<RP>_d<DJ>,
// stubs for DJ = 16.
#define GEO_ENTRY_TC(NAME, FN, SMEM, RP, DJ)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) geo_##NAME##_tc_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), 4, true> C;                                           \
        if constexpr ((DJ) <= 8 && C::SMEM * sizeof(float) <= GEO_SMEM_MAX) FN<C>(a);                         \
        else __trap();                                                                                         \
    }
// 3xTF32 (the leapfrog forward's TF32 module): geo_lf_fwd_tc3_r<RP>_d<DJ>
#define GEO_ENTRY_TC3(NAME, FN, SMEM, RP, DJ)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) geo_##NAME##_tc3_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), 4, true, true> C;                                      \
        if constexpr ((DJ) <= 8 && C::SMEM * sizeof(float) <= GEO_SMEM_MAX) FN<C>(a);                          \
        else __trap();                                                                                          \
    }
#if defined(GEO_TF32) && defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST_TC(RP, DJ) GEO_ENTRY_TC(chr_fwd, chr_fwd_fast, SMEM_CHR_FWD_TC, RP, DJ)
#elif defined(GEO_TF32) && defined(GEO_MODULE_LF_FWD)
#define GEO_FAST_TC(RP, DJ) \
    GEO_ENTRY_TC(lf_fwd, lf_fwd_fast, SMEM_LF_FWD_TC, RP, DJ) GEO_ENTRY_TC3(lf_fwd, lf_fwd_fast, SMEM_LF_FWD_TC3, RP, DJ)
#else
#define GEO_FAST_TC(RP, DJ)
#endif
#if defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_fwd, chr_fwd_fast, SMEM_CHR_FWD, GEO_MB_CF, RP, DJ)
#define GEO_GEN_KERNEL extern "C" __global__ void __launch_bounds__(GEO_NT) geo_chr_fwd_gen(const GeoArgs a) { chr_fwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_CHR_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_bwd, chr_bwd_fast, SMEM_CHR_BWD, GEO_MB_A, RP, DJ)
#define GEO_GEN_KERNEL extern "C" __global__ void __launch_bounds__(GEO_NT) geo_chr_bwd_gen(const GeoArgs a) { chr_bwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_LF_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_fwd, lf_fwd_fast, SMEM_LF_FWD, GEO_MB_A, RP, DJ)
#define GEO_GEN_KERNEL extern "C" __global__ void __launch_bounds__(GEO_NT) geo_lf_fwd_gen(const GeoArgs a) { lf_fwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_LF_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_bwd, lf_bwd_fast, SMEM_LF_BWD, GEO_MB_B, RP, DJ)
#define GEO_GEN_KERNEL extern "C" __global__ void __launch_bounds__(GEO_NT) geo_lf_bwd_gen(const GeoArgs a) { lf_bwd_gen<GEO_T>(a); }
#endif
#define GEO_FAST_EXPAND(RP, DJ) GEO_FAST(RP, DJ) GEO_FAST_TC(RP, DJ)

#if defined(GEO_CFG_RP)
GEO_FAST_EXPAND(GEO_CFG_RP, GEO_CFG_DJ)
#endif
#if defined(GEO_GENERIC) || defined(GEO_ALL)
GEO_GEN_KERNEL
#endif
#if defined(GEO_ALL)
#define GEO_FAST_ALL_DJ(RP) GEO_FAST_EXPAND(RP, 2) GEO_FAST_EXPAND(RP, 4) GEO_FAST_EXPAND(RP, 8) GEO_FAST_EXPAND(RP, 16)
GEO_FAST_ALL_DJ(8)
GEO_FAST_ALL_DJ(16)
GEO_FAST_ALL_DJ(32)
#endif

// The host's plan (src/cuda/geodesic/plan.rs) states the constants above and each
// fast module's tile rows, vector layout and shared memory per variant as GEO_PLAN_*
// (bytes) in the module's source; the kernels' own values (Cfg) must equal them, so
// an NVRTC compile of the module (tests/kernels_compile.rs) fails where the two
// disagree. The CPU emulator (tests/emu) compiles the source without them.
#if defined(GEO_PLAN_NT)
static_assert(GEO_NT == GEO_PLAN_NT && GEO_NW == GEO_PLAN_NW && GEO_GROUPS == GEO_PLAN_GROUPS && GEN_RG == GEO_PLAN_RG &&
                  GEO_SMEM_MAX == GEO_PLAN_SMEM_MAX,
              "the plan's constants");
static_assert(GEO_WANT_DV == GEO_PLAN_WANT_DV && GEO_WANT_DU == GEO_PLAN_WANT_DU && GEO_WANT_DW == GEO_PLAN_WANT_DW &&
                  GEO_WANT_DF == GEO_PLAN_WANT_DF && GEO_WANT_DX == GEO_PLAN_WANT_DX,
              "the plan's GEO_WANT_* bits");
#if defined(GEO_SW_M)
static_assert(GEO_SW_M == GEO_PLAN_SW_M, "the plan's rows per geo_sw tile");
#endif
#if defined(GEO_CFG_RP)
// the FFMA kernel of this module (GEO_FAST's Cfg and SMEM_*)
#if defined(GEO_MODULE_CHR_FWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_CF(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_CHR_FWD
#elif defined(GEO_MODULE_CHR_BWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_A(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_CHR_BWD
#elif defined(GEO_MODULE_LF_FWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_A(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_LF_FWD
#elif defined(GEO_MODULE_LF_BWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_B(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_LF_BWD
#endif
static_assert(GeoPlanCfg::M == GEO_PLAN_M && GeoPlanCfg::VL == (GEO_PLAN_VL != 0) &&
                  GEO_PLAN_KERNEL_SMEM * sizeof(GEO_T) == GEO_PLAN_SMEM,
              "the plan's FFMA kernel: tile rows, vector layout, shared memory");
// U and W in registers (lf_fwd_rs): exactly where the plan has its size
#if defined(GEO_PLAN_SMEM_RS)
static_assert(GeoPlanCfg::RS && GeoPlanCfg::SMEM_LF_FWD_RS * sizeof(float) == GEO_PLAN_SMEM_RS,
              "the plan's register leapfrog forward");
#else
static_assert(!GeoPlanCfg::RS, "a register leapfrog forward the plan does not know");
#endif
// the TF32 variants (GEO_ENTRY_TC, GEO_ENTRY_TC3): the f32 forwards' modules, DJ <= 8
#if defined(GEO_TF32) && GEO_CFG_DJ <= 8
typedef Cfg<float, GEO_CFG_RP, GEO_CFG_DJ, 4, true> GeoPlanTc;
static_assert(GeoPlanTc::M == GEO_PLAN_TC_M, "the plan's TF32 tile rows");
#if defined(GEO_MODULE_CHR_FWD)
static_assert(GeoPlanTc::SMEM_CHR_FWD_TC * sizeof(float) == GEO_PLAN_SMEM_TC, "the plan's TF32 Christoffel forward");
#if defined(GEO_PLAN_SMEM_STAGE) || defined(GEO_PLAN_SMEM_TC3)
#error "the plan has leapfrog variants in a Christoffel module"
#endif
#else
static_assert(GeoPlanTc::SMEM_LF_FWD_TC * sizeof(float) == GEO_PLAN_SMEM_TC &&
                  GeoPlanTc::SMEM_LF_STAGE * sizeof(float) == GEO_PLAN_SMEM_STAGE &&
                  Cfg<float, GEO_CFG_RP, GEO_CFG_DJ, 4, true, true>::SMEM_LF_FWD_TC3 * sizeof(float) == GEO_PLAN_SMEM_TC3,
              "the plan's TF32, v stage and 3xTF32 leapfrog forward");
#endif
#elif defined(GEO_PLAN_SMEM_TC) || defined(GEO_PLAN_SMEM_STAGE) || defined(GEO_PLAN_SMEM_TC3)
#error "the plan has TF32 variants this module does not hold"
#endif
#endif
#endif
