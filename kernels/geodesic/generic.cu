// fusekit geodesic kernels: the generic kernels (every generic module, after
// common.cu); their entry points are in generic_entry.cu.
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
