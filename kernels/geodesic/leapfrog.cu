// fusekit geodesic kernels: the leapfrog fast kernels (the leapfrog modules' fast
// part, after fast.cu): the forward with U and W in registers (lf_fwd_rs), the
// forward and the backward.
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
__device__ __forceinline__ bool rs_ok(const GeoArgs& a, size_t smem_bytes) {
    return a.smem_bytes >= smem_bytes &&
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
    check_smem(GEO_SMEM_RS, a);
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
// launch gives it the room (`a.smem_bytes` covers GEO_SMEM_STAGE more bytes), the
// next tile's v streams into a staging buffer (load_tile, cp.async) during this tile's
// steps, so that a tile starts on v from shared memory; its x and f, only needed after
// the first Gamma, stream into the stash (cp.async) while that Gamma runs. (The FFMA
// kernel, at 250 registers, spilled with the stage and ran 3-4% slower: it loads v
// like x and f, asked for in L2 one tile ahead.)
template <class C> __device__ void lf_fwd_fast(const GeoArgs& a) {
    if constexpr (C::RS) {
        if (rs_ok(a, GEO_SMEM_RS)) {
            lf_fwd_rs<C>(a);
            return;
        }
    }
    typedef typename C::T T;
    typedef typename Rows<C>::Tile Tile;
    constexpr size_t BASE = C::X3 ? GEO_SMEM_TC3 : C::TC ? GEO_SMEM_TC : GEO_SMEM;  // bytes
    check_smem(BASE, a);
    const bool stage = C::TC && !C::X3 && a.smem_bytes >= BASE + GEO_SMEM_STAGE;
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
    check_smem(GEO_SMEM, a);
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
