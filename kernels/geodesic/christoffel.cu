// fusekit geodesic kernels: the Christoffel fast kernels (the Christoffel modules'
// fast part, after fast.cu): the forward (TF32 and FFMA) and the backward.

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
    check_smem(GEO_SMEM_TC, a);
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
    check_smem(GEO_SMEM, a);
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
    check_smem(GEO_SMEM, a);
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
