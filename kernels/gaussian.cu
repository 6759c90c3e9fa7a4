// fusekit: the Gaussian field family (docs/ops.md section 3). docs/gaussian.md has the
// design and the performance floors.
//
// One module per element type (gaussian_f32, gaussian_f64); the host prepends
// `#define FK_GS_<dtype> 1`. Kernels:
//
//   gs_maha_fwd_<T>   m[b,n] = |(L_n + eps I)^-1 (p_b - mu_n)|^2, written [B,N].
//                     Thread = Gaussian (its factors in registers), the CTA's
//                     points staged in shared memory; a warp writes 32
//                     consecutive m of one row (128 B, coalesced, streaming).
//   gs_field_fwd_<T>  out[b] = sum_n w_n exp(-0.5 m[b,n]), fused: no [B,N].
//                     Thread = 2 points in registers; all N Gaussians stream
//                     through shared memory in tiles of 256 (factors prepared
//                     once per tile: reciprocal diagonal, so no division in the
//                     inner loop). When B is small the CTA's threads also split
//                     the Gaussians GS ways (GS in 1,2,4,8) and the GS partial
//                     sums are added in a fixed order: deterministic.
//   gs_bwd_maha_<T>,  thread = 2 Gaussians (factors and 10 gradient
//   gs_bwd_field_<T>  accumulators in registers), the CTA's points streamed
//                     through shared memory. The 3 components of z per point
//                     are summed over the warp's Gaussians 4 points at a time by
//                     a reduce-scatter butterfly, then over the 8 warps in
//                     order. The CTA (ig, ip) covers a range of Gaussian tiles
//                     and a range of point chunks and writes
//                     per-point partials part_p[ig] and per-Gaussian partials
//                     part_g[ip] to the caller's workspace; no atomics.
//   gs_finalize_<T>   sums the partials over the splits in a fixed order and
//                     writes dpoints, dmeans, dchol (full lower triangle, upper
//                     part 0) and dweights.
//
// The field kernels work in scaled coordinates: points and means are multiplied
// by s = sqrt(0.5 log2 e), so that y_s = s y, m' = |y_s|^2 = 0.5 log2(e) m and
// exp(-0.5 m) = exp2(-m'): one exp2 per pair and no multiply. The backward
// accumulates z' = s z and z' y_s^T = s^2 z y^T; the finalize divides by s and s^2.
#include "common.cuh"

// Launch constants, stated in src/cuda/gaussian.rs and defined by it ahead of this
// source: GS_THREADS (threads per CTA), GS_FWD_TILE (Gaussians per shared-memory
// tile, field forward), GS_FWD_PPT (points per thread, field forward), GS_BWD_GPT
// (Gaussians per thread, backward), GS_BWD_TILE (= GS_THREADS * GS_BWD_GPT),
// GS_BWD_CHUNK (points per shared-memory chunk, backward), GS_MAHA_CHUNK (points per
// chunk, Mahalanobis forward), GS_K (per-Gaussian partial sums: z (3), z y^T lower
// (6), dweights).
#if !defined(GS_THREADS) || !defined(GS_FWD_TILE) || !defined(GS_FWD_PPT) || !defined(GS_BWD_GPT) || \
    !defined(GS_BWD_TILE) || !defined(GS_BWD_CHUNK) || !defined(GS_MAHA_CHUNK) || !defined(GS_K)
#error "the GS_* launch constants come from src/cuda/gaussian.rs (fusekit::cuda::modules() has the full source)"
#endif
static_assert(GS_BWD_TILE == GS_THREADS * GS_BWD_GPT, "GS_BWD_TILE");

template <typename T> __device__ __forceinline__ T gs_exp2(T x);
// f32: MUFU.EX2 directly (ex2.approx.ftz: max relative error 2^-22, as exp2f's).
// exp2f would add a fix-up of ~3 instructions per pair for subnormal results; here
// a term below 2^-126 (m > 175, 13 standard deviations out) counts as 0.
template <> __device__ __forceinline__ float gs_exp2<float>(float x) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return exp2f(x);  // host emulation (tests/cuda_emu)
#endif
}
template <> __device__ __forceinline__ double gs_exp2<double>(double x) { return exp2(x); }

// Factors of one Gaussian: mean (scaled), weight, reciprocal diagonal of
// L + eps I, and the strictly lower part of L. 16-byte aligned so a copy from
// shared memory is a few vector loads.
template <typename T> struct __align__(16) Gauss {
    T mu0, mu1, mu2, w;
    T a0, a1, a2, l10;
    T l20, l21, pad0, pad1;
};

// Raw parameters of one Gaussian as read from global memory (the lower part of L
// only), so that a tile can be fetched ahead of its use.
template <typename T> struct RawGauss {
    T m0, m1, m2, w, l00, l10, l11, l20, l21, l22;
};

template <typename T>
__device__ __forceinline__ RawGauss<T> load_raw(const T* __restrict__ means, const T* __restrict__ chol,
                                                const T* __restrict__ weights, i64 n) {
    RawGauss<T> r;
    const T* m = means + n * 3;
    const T* L = chol + n * 9;
    r.m0 = m[0];
    r.m1 = m[1];
    r.m2 = m[2];
    r.w = weights ? weights[n] : T(0);
    r.l00 = L[0];
    r.l10 = L[3];
    r.l11 = L[4];
    r.l20 = L[6];
    r.l21 = L[7];
    r.l22 = L[8];
    return r;
}

// The factors: reciprocal diagonal (the only divisions), scaled mean.
template <typename T>
__device__ __forceinline__ Gauss<T> prepare(const RawGauss<T>& r, T eps, T scale) {
    Gauss<T> g;
    g.mu0 = r.m0 * scale;
    g.mu1 = r.m1 * scale;
    g.mu2 = r.m2 * scale;
    g.w = r.w;
    g.a0 = T(1) / (r.l00 + eps);
    g.a1 = T(1) / (r.l11 + eps);
    g.a2 = T(1) / (r.l22 + eps);
    g.l10 = r.l10;
    g.l20 = r.l20;
    g.l21 = r.l21;
    g.pad0 = T(0);
    g.pad1 = T(0);
    return g;
}

template <typename T>
__device__ __forceinline__ Gauss<T> load_gauss(const T* __restrict__ means, const T* __restrict__ chol,
                                               const T* __restrict__ weights, i64 n, T eps, T scale) {
    return prepare(load_raw(means, chol, weights, n), eps, scale);
}

// Forward substitution (L + eps I) y = p - mu.
template <typename T>
__device__ __forceinline__ void solve(const Gauss<T>& g, T p0, T p1, T p2, T& y0, T& y1, T& y2) {
    T d0 = p0 - g.mu0, d1 = p1 - g.mu1, d2 = p2 - g.mu2;
    y0 = d0 * g.a0;
    y1 = fma(-g.l10, y0, d1) * g.a1;
    y2 = fma(-g.l21, y1, fma(-g.l20, y0, d2)) * g.a2;
}

// Backward substitution (L + eps I)^T z = v.
template <typename T>
__device__ __forceinline__ void backsolve(const Gauss<T>& g, T v0, T v1, T v2, T& z0, T& z1, T& z2) {
    z2 = v2 * g.a2;
    z1 = fma(-g.l21, z2, v1) * g.a1;
    z0 = fma(-g.l20, z2, fma(-g.l10, z1, v0)) * g.a0;
}

// ---------------------------------------------------------------- Mahalanobis forward
// struct GsMahaFwdArgs: declared in src/cuda/gaussian.rs (kernel_args!), defined ahead of this source

template <typename T>
__device__ void maha_fwd(const GsMahaFwdArgs& a) {
    __shared__ T sp[GS_MAHA_CHUNK * 3];
    const T* __restrict__ points = (const T*)a.points;
    T* __restrict__ out = (T*)a.out;
    const int tid = threadIdx.x;
    const int tx = tid % a.gx, ty = tid / a.gx, gy = GS_THREADS / a.gx;
    const i64 n = (i64)blockIdx.x * a.gx + tx;
    const bool live = n < a.N;
    Gauss<T> g;
    if (live) g = load_gauss<T>((const T*)a.means, (const T*)a.chol, nullptr, n, (T)a.eps, T(1));
    const i64 chunks = (a.B + GS_MAHA_CHUNK - 1) / GS_MAHA_CHUNK;
    for (i64 c = blockIdx.y; c < chunks; c += gridDim.y) {
        const i64 b0 = c * GS_MAHA_CHUNK;
        const int cnt = (int)min((i64)GS_MAHA_CHUNK, a.B - b0);
        __syncthreads();
        for (int i = tid; i < cnt * 3; i += GS_THREADS) sp[i] = points[b0 * 3 + i];
        __syncthreads();
        if (live) {
#pragma unroll 4
            for (int j = ty; j < cnt; j += gy) {
                T y0, y1, y2;
                solve(g, sp[j * 3], sp[j * 3 + 1], sp[j * 3 + 2], y0, y1, y2);
                T m = fma(y2, y2, fma(y1, y1, y0 * y0));
                __stcs(out + (b0 + j) * a.N + n, m);
            }
        }
    }
}

// ---------------------------------------------------------------- field forward
// struct GsFieldFwdArgs: declared in src/cuda/gaussian.rs (kernel_args!), defined ahead of this source

template <typename T>
__device__ void field_fwd(const GsFieldFwdArgs& a) {
    __shared__ Gauss<T> sg[GS_FWD_TILE];
    __shared__ T red[GS_THREADS * GS_FWD_PPT];
    const T* __restrict__ points = (const T*)a.points;
    const int tid = threadIdx.x;
    const int gs = a.gs, pb = GS_THREADS / gs;
    const int lane = tid % pb, split = tid / pb;
    const i64 base = (i64)blockIdx.x * pb * GS_FWD_PPT;
    const T scale = (T)a.scale, eps = (T)a.eps;
    T p[GS_FWD_PPT][3], acc[GS_FWD_PPT];
#pragma unroll
    for (int q = 0; q < GS_FWD_PPT; ++q) {
        const i64 b = base + q * pb + lane;
        const bool ok = b < a.B;
        p[q][0] = ok ? points[b * 3] * scale : T(0);
        p[q][1] = ok ? points[b * 3 + 1] * scale : T(0);
        p[q][2] = ok ? points[b * 3 + 2] * scale : T(0);
        acc[q] = T(0);
    }
    const T* __restrict__ means = (const T*)a.means;
    const T* __restrict__ chol = (const T*)a.chol;
    const T* __restrict__ weights = (const T*)a.weights;
    // Software pipeline: the raw parameters of tile t+1 are in flight while tile t
    // is computed.
    RawGauss<T> raw;
    if (tid < a.N) raw = load_raw(means, chol, weights, tid);
    for (i64 t0 = 0; t0 < a.N; t0 += GS_FWD_TILE) {
        const int cnt = (int)min((i64)GS_FWD_TILE, a.N - t0);
        __syncthreads();
        if (tid < cnt) sg[tid] = prepare(raw, eps, scale);
        __syncthreads();
        if (t0 + GS_FWD_TILE + tid < a.N) raw = load_raw(means, chol, weights, t0 + GS_FWD_TILE + tid);
#pragma unroll 2
        for (int k = split; k < cnt; k += gs) {
            const Gauss<T> g = sg[k];
#pragma unroll
            for (int q = 0; q < GS_FWD_PPT; ++q) {
                T y0, y1, y2;
                solve(g, p[q][0], p[q][1], p[q][2], y0, y1, y2);
                T m = fma(y2, y2, fma(y1, y1, y0 * y0));
                acc[q] = fma(g.w, gs_exp2<T>(-m), acc[q]);
            }
        }
    }
    if (gs > 1) {
#pragma unroll
        for (int q = 0; q < GS_FWD_PPT; ++q) red[split * pb * GS_FWD_PPT + q * pb + lane] = acc[q];
        __syncthreads();
        if (split == 0) {
#pragma unroll
            for (int q = 0; q < GS_FWD_PPT; ++q) {
                T s = red[q * pb + lane];
                for (int r = 1; r < gs; ++r) s += red[r * pb * GS_FWD_PPT + q * pb + lane];
                acc[q] = s;
            }
        }
    }
    if (split == 0) {
        T* __restrict__ out = (T*)a.out;
#pragma unroll
        for (int q = 0; q < GS_FWD_PPT; ++q) {
            const i64 b = base + q * pb + lane;
            if (b < a.B) out[b] = acc[q];
        }
    }
}

// ---------------------------------------------------------------- backward
// struct GsBwdArgs: declared in src/cuda/gaussian.rs (kernel_args!), defined ahead of this source

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T, bool FIELD>
__device__ void backward(const GsBwdArgs& a) {
    __shared__ __align__(16) T spt[GS_BWD_CHUNK][4];            // scaled point, dout
    __shared__ T red[GS_THREADS / 32][3][GS_BWD_CHUNK];        // per-warp sums of z'
    const T* __restrict__ points = (const T*)a.points;
    const T* __restrict__ gin = (const T*)a.g;
    T* __restrict__ part_p = (T*)a.part_p;
    T* __restrict__ part_g = (T*)a.part_g;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int ig = blockIdx.x, ip = blockIdx.y;
    const int gt0 = (int)((i64)ig * a.n_gtiles / a.sg), gt1 = (int)((i64)(ig + 1) * a.n_gtiles / a.sg);
    const i64 pc0 = (i64)ip * a.n_pchunks / a.sp, pc1 = (i64)(ip + 1) * a.n_pchunks / a.sp;
    const T scale = (T)a.scale, eps = (T)a.eps;
    for (int gt = gt0; gt < gt1; ++gt) {
        Gauss<T> g[GS_BWD_GPT];
        i64 n[GS_BWD_GPT];
        bool live[GS_BWD_GPT];
        T acc[GS_BWD_GPT][GS_K];
#pragma unroll
        for (int k = 0; k < GS_BWD_GPT; ++k) {
            n[k] = (i64)gt * GS_BWD_TILE + k * GS_THREADS + tid;
            live[k] = n[k] < a.N;
            g[k] = load_gauss<T>((const T*)a.means, (const T*)a.chol, FIELD ? (const T*)a.weights : nullptr,
                                 live[k] ? n[k] : 0, eps, scale);
#pragma unroll
            for (int i = 0; i < GS_K; ++i) acc[k][i] = T(0);
        }
        // the next chunk's point (thread tid < GS_BWD_CHUNK) is fetched ahead
        T q0 = T(0), q1 = T(0), q2 = T(0), q3 = T(0);
        auto fetch = [&](i64 pc) {
            const i64 b = pc * GS_BWD_CHUNK + tid;
            if (tid < GS_BWD_CHUNK && pc < pc1 && b < a.B) {
                q0 = points[b * 3] * scale;
                q1 = points[b * 3 + 1] * scale;
                q2 = points[b * 3 + 2] * scale;
                q3 = FIELD ? gin[b] : T(0);
            }
        };
        fetch(pc0);
        for (i64 pc = pc0; pc < pc1; ++pc) {
            const i64 b0 = pc * GS_BWD_CHUNK;
            const int cnt = (int)min((i64)GS_BWD_CHUNK, a.B - b0);
            __syncthreads();
            if (tid < cnt) {
                spt[tid][0] = q0;
                spt[tid][1] = q1;
                spt[tid][2] = q2;
                spt[tid][3] = q3;
            }
            __syncthreads();
            fetch(pc + 1);
            // Mahalanobis: g of the next point is loaded while this one is computed
            T gnext[GS_BWD_GPT];
            if (!FIELD) {
#pragma unroll
                for (int k = 0; k < GS_BWD_GPT; ++k)
                    gnext[k] = live[k] ? __ldcs(gin + b0 * a.N + n[k]) : T(0);
            }
            // Points in groups of 4: the z sums of the group are reduced over the warp
            // by a reduce-scatter (18 shuffles per 4 points instead of 60).
            for (int j0 = 0; j0 < cnt; j0 += 4) {
                T zs[4][3];
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    const int j = j0 + jj;
                    zs[jj][0] = zs[jj][1] = zs[jj][2] = T(0);
                    if (j >= cnt) continue;   // uniform over the CTA
                    const T p0 = spt[j][0], p1 = spt[j][1], p2 = spt[j][2];
                    T gcur[GS_BWD_GPT];
                    if (!FIELD) {
#pragma unroll
                        for (int k = 0; k < GS_BWD_GPT; ++k) {
                            gcur[k] = gnext[k];
                            if (j + 1 < cnt && live[k]) gnext[k] = __ldcs(gin + (b0 + j + 1) * a.N + n[k]);
                        }
                    }
#pragma unroll
                    for (int k = 0; k < GS_BWD_GPT; ++k) {
                        T y0, y1, y2;
                        solve(g[k], p0, p1, p2, y0, y1, y2);
                        T c;
                        if (FIELD) {
                            const T m = fma(y2, y2, fma(y1, y1, y0 * y0));
                            const T de = spt[j][3] * gs_exp2<T>(-m);     // dout * exp(-0.5 m)
                            acc[k][9] += de;
                            c = live[k] ? -g[k].w * de : T(0);             // 2 g, g = -0.5 dout w e
                        } else {
                            c = T(2) * gcur[k];   // 0 for a Gaussian past N
                        }
                        T z0, z1, z2;
                        backsolve(g[k], c * y0, c * y1, c * y2, z0, z1, z2);
                        zs[jj][0] += z0;
                        zs[jj][1] += z1;
                        zs[jj][2] += z2;
                        acc[k][0] += z0;
                        acc[k][1] += z1;
                        acc[k][2] += z2;
                        acc[k][3] = fma(z0, y0, acc[k][3]);
                        acc[k][4] = fma(z1, y0, acc[k][4]);
                        acc[k][5] = fma(z1, y1, acc[k][5]);
                        acc[k][6] = fma(z2, y0, acc[k][6]);
                        acc[k][7] = fma(z2, y1, acc[k][7]);
                        acc[k][8] = fma(z2, y2, acc[k][8]);
                    }
                }
                if (a.want_p) {
                    // step 16: lanes 0-15 keep points 0,1 and lanes 16-31 points 2,3
                    const bool h16 = lane & 16, h8 = lane & 8;
                    T w[2][3];
#pragma unroll
                    for (int q = 0; q < 2; ++q)
#pragma unroll
                        for (int c = 0; c < 3; ++c) {
                            const T keep = h16 ? zs[q + 2][c] : zs[q][c];
                            const T send = h16 ? zs[q][c] : zs[q + 2][c];
                            w[q][c] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
                        }
                    // step 8: lanes with bit 3 clear keep the first of their two points
                    T u[3];
#pragma unroll
                    for (int c = 0; c < 3; ++c) {
                        const T keep = h8 ? w[1][c] : w[0][c];
                        const T send = h8 ? w[0][c] : w[1][c];
                        u[c] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
                    }
                    // steps 4, 2, 1 over the 8 lanes that share a point
#pragma unroll
                    for (int o = 4; o > 0; o >>= 1)
#pragma unroll
                        for (int c = 0; c < 3; ++c) u[c] += __shfl_xor_sync(0xffffffffu, u[c], o);
                    // lane 8 q holds the warp's sum for point j0 + q (q = 2 h16 + h8)
                    const int j = j0 + (lane >> 3);
                    if ((lane & 7) == 0 && j < cnt) {
                        red[warp][0][j] = u[0];
                        red[warp][1][j] = u[1];
                        red[warp][2][j] = u[2];
                    }
                }
            }
            if (a.want_p) {
                __syncthreads();
                if (tid < cnt * 3) {
                    const int c = tid / cnt, j = tid % cnt;
                    T s = red[0][c][j];
#pragma unroll
                    for (int w = 1; w < GS_THREADS / 32; ++w) s += red[w][c][j];
                    T* dst = part_p + ((i64)ig * 3 + c) * a.B + b0 + j;
                    *dst = gt == gt0 ? s : *dst + s;
                }
            }
        }
        if (a.want_g) {
#pragma unroll
            for (int k = 0; k < GS_BWD_GPT; ++k)
                if (live[k])
#pragma unroll
                    for (int i = 0; i < GS_K; ++i) part_g[((i64)ip * GS_K + i) * a.N + n[k]] = acc[k][i];
        }
    }
}

// ---------------------------------------------------------------- finalize
// struct GsFinalizeArgs: declared in src/cuda/gaussian.rs (kernel_args!), defined ahead of this source

template <typename T>
__device__ void finalize(const GsFinalizeArgs& a) {
    const T* __restrict__ pp = (const T*)a.part_p;
    const T* __restrict__ pg = (const T*)a.part_g;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const T inv_s = (T)a.inv_s, inv_s2 = (T)a.inv_s2;
    if (a.dpoints) {
        T* __restrict__ dp = (T*)a.dpoints;
        for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < a.B * 3; i += stride) {
            const i64 b = i / 3;
            const int c = (int)(i - b * 3);
            T s = T(0);
            for (int r = 0; r < a.sg; ++r) s += pp[((i64)r * 3 + c) * a.B + b];
            dp[i] = s * inv_s;
        }
    }
    if (a.dmeans || a.dchol || a.dweights) {
        for (i64 n = (i64)blockIdx.x * blockDim.x + threadIdx.x; n < a.N; n += stride) {
            T s[GS_K];
#pragma unroll
            for (int i = 0; i < GS_K; ++i) s[i] = T(0);
            for (int r = 0; r < a.sp; ++r)
#pragma unroll
                for (int i = 0; i < GS_K; ++i) s[i] += pg[((i64)r * GS_K + i) * a.N + n];
            if (a.dmeans) {
                T* dm = (T*)a.dmeans + n * 3;
                dm[0] = -s[0] * inv_s;
                dm[1] = -s[1] * inv_s;
                dm[2] = -s[2] * inv_s;
            }
            if (a.dchol) {
                T* dl = (T*)a.dchol + n * 9;
                dl[0] = -s[3] * inv_s2;
                dl[1] = T(0);
                dl[2] = T(0);
                dl[3] = -s[4] * inv_s2;
                dl[4] = -s[5] * inv_s2;
                dl[5] = T(0);
                dl[6] = -s[6] * inv_s2;
                dl[7] = -s[7] * inv_s2;
                dl[8] = -s[8] * inv_s2;
            }
            if (a.dweights) ((T*)a.dweights)[n] = s[9];
        }
    }
}

// ---------------------------------------------------------------- entry points
#define FK_GS_KERNELS(NAME, T, BWD_MIN_BLOCKS)                                                                          \
    extern "C" __global__ void __launch_bounds__(GS_THREADS) gs_maha_fwd_##NAME(const GsMahaFwdArgs a) {   \
        maha_fwd<T>(a);                                                                                   \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(GS_THREADS) gs_field_fwd_##NAME(const GsFieldFwdArgs a) { \
        field_fwd<T>(a);                                                                                  \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(GS_THREADS, BWD_MIN_BLOCKS) gs_bwd_maha_##NAME(const GsBwdArgs a) {       \
        backward<T, false>(a);                                                                            \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(GS_THREADS, BWD_MIN_BLOCKS) gs_bwd_field_##NAME(const GsBwdArgs a) {      \
        backward<T, true>(a);                                                                             \
    }                                                                                                     \
    extern "C" __global__ void __launch_bounds__(GS_THREADS) gs_finalize_##NAME(const GsFinalizeArgs a) {  \
        finalize<T>(a);                                                                                   \
    }

#if defined(FK_GS_f32)
// f32 backward: 3 CTAs (24 warps) per multiprocessor (<= 85 registers); f64 would spill.
FK_GS_KERNELS(f32, f32, 3)
#elif defined(FK_GS_f64)
FK_GS_KERNELS(f64, f64, 1)
#endif
