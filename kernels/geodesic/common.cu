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
// One module per op, dtype and configuration, so a program compiles only the kernels
// it uses. src/cuda/geodesic/names.rs assembles a module's source from the files of
// kernels/geodesic/ the module needs, after the #defines it generates (`GEO_T
// float|double`, one of `GEO_MODULE_CHR_FWD`, `_CHR_BWD`, `_LF_FWD`, `_LF_BWD`, the
// configuration: `GEO_CFG_RP` + `GEO_CFG_DJ` or `GEO_GENERIC`, the plan's constants)
// and the argument structs:
//   fast module (one fast tile):  common.cu, fast.cu, christoffel.cu or leapfrog.cu,
//                                 fast_entry.cu
//   generic module:               common.cu, generic.cu, generic_entry.cu
// This file (common.cu): what every geodesic module uses (constants, the elementwise
// helpers, vector loads, cp.async).
#include "common.cuh"

// The constants the kernels share with the host, defined ahead of this source by
// src/cuda/geodesic/config.rs (`defines`), which states them once: GEO_NT threads (GEO_NW
// warps) per group, GEO_GROUPS groups in the Christoffel forward's TF32 kernel
// (chr_fwd_tc), GEN_RG rows per block iteration of the generic kernels, GEO_SMEM_MAX
// the largest opt-in shared memory per block of the supported GPUs (configurations
// above it are compiled as stubs and never chosen), GEO_SW_M rows per geo_sw tile, the
// GEO_WANT_* bits of GeoArgs::want. A fast module also gets its tile's values (fast.cu).
#if !defined(GEO_NT) || !defined(GEO_NW) || !defined(GEO_GROUPS) || !defined(GEN_RG) || !defined(GEO_SMEM_MAX) || \
    !defined(GEO_SW_M) || !defined(GEO_WANT_DX)
#error "the geodesic constants come from src/cuda/geodesic/config.rs (fusekit::cuda::modules() has the full source)"
#endif

// struct GeoArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source

// struct ReduceArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source

// A kernel's name: `base` and the module's element type suffix (GEO_DT, f32 or f64),
// `geo_reduce_f32`, as src/cuda/geodesic/names.rs names it.
#define GEO_CAT_(a, b) a##b
#define GEO_CAT(a, b) GEO_CAT_(a, b)
#define GEO_NAME(base) GEO_CAT(base##_, GEO_DT)

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
