// fusekit geodesic kernels: a generic module's entry points (after generic.cu): for
// the backwards geo_reduce (which also sums the fast kernels' partials), the GEMM
// route's elementwise kernels, and the generic kernel of the module's op.

#if defined(GEO_MODULE_CHR_BWD) || defined(GEO_MODULE_LF_BWD)
// Partial [D, R] sums of the blocks, added in block order (f64 accumulation). The
// partials of GEO_REDUCE_KB blocks are loaded before they are added (in the same
// order), so that a thread waits one memory latency per batch. The Christoffel
// backward's fast kernels write their partials in the parameter layout (param_store;
// element q * GEO_NT + t holds accumulator q of thread t), mapped back to [D][R] here;
// the other kernels' are [D][R] (`kw` = 0).
#define GEO_REDUCE_KB 16
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_reduce)(const ReduceArgs a) {
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
    extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(NAME)(const EwArgs a) {   \
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
#if defined(GEO_MODULE_CHR_BWD) || defined(GEO_MODULE_LF_BWD)
#define GEO_DP(y_, x_, c_) (GEO_T(2) * x_ * y_)
GEO_EW(geo_dp, GEO_DP, 1)  // dp = 2 p q over q
#endif
#if defined(GEO_MODULE_CHR_BWD)
#define GEO_MASK(y_, x_, c_) (passc(y_, c_) ? x_ : GEO_T(0))
GEO_EW(geo_mask, GEO_MASK, 1)  // g' = g 1[-c <= raw <= c] over raw
#endif
#if defined(GEO_MODULE_CHR_FWD)
#define GEO_CLAMP(y_, x_, c_) clampc(y_, c_)
GEO_EW(geo_clamp, GEO_CLAMP, 1)  // gamma = clamp(raw) in place
#endif
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
__device__ __forceinline__ int geo_sw_stride(i64 r) {
    const int q = (int)((r + 3) / 4);  // 16-byte chunks of a row
    return 4 * (q % 2 == 0 ? q + 1 : q);
}
extern "C" __global__ void __launch_bounds__(GEO_NT, 1) GEO_NAME(geo_sw)(const SwArgs a) {
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
#if defined(GEO_MODULE_LF_FWD) || defined(GEO_MODULE_LF_BWD)
// One kick of the leapfrog, v = vin + h (f - clamp(raw) - mu vin) (vin may be v: in
// place), then (x given) the drift x += dt v, and (tx, tv) copies of the new x, v (the
// trajectory). The backward uses it to recompute vh from v_t (vin = v_t, no drift).
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_kick)(const KickArgs a) {
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
#if defined(GEO_MODULE_LF_BWD)
#define GEO_COPY(y_, x_, c_) (x != nullptr ? x_ : c_)
GEO_EW(geo_copy, GEO_COPY, 0)  // dx0 = gx, or c (0) without gx
// struct AdjArgs: declared in src/cuda/geodesic/args.rs (kernel_args!), defined ahead of this source
// The leapfrog backward's adjoint update at one kick (docs/geodesic.md, "Its
// backward"), per element with l = lv_in[i] and g[i] = gamma_raw at the kick's input:
// df += h l; g = 1[-c <= raw <= c] (-h l), the cotangent of the kick's Christoffel
// vjp, whose dv cuBLAS then adds to lv; lv = l (1 - h mu) + dt gx (lv may be lv_in).
// At the second kick (lv = dL/dv_{t+1}) this leaves lvh minus its vjp term in lv, at
// the first (lv = lvh, gx = 0) lv_t minus its vjp term.
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_adj)(const AdjArgs a) {
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

// The generic kernel of the module's op.
#if defined(GEO_MODULE_CHR_FWD)
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_chr_fwd_gen)(const GeoArgs a) { chr_fwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_CHR_BWD)
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_chr_bwd_gen)(const GeoArgs a) { chr_bwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_LF_FWD)
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_lf_fwd_gen)(const GeoArgs a) { lf_fwd_gen<GEO_T>(a); }
#elif defined(GEO_MODULE_LF_BWD)
extern "C" __global__ void __launch_bounds__(GEO_NT) GEO_NAME(geo_lf_bwd_gen)(const GeoArgs a) { lf_bwd_gen<GEO_T>(a); }
#endif
