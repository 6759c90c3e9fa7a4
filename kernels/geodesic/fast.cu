// fusekit geodesic kernels: the fast kernels' machinery (every fast module; see
// common.cu for how a module's source is assembled): the configuration (Cfg), the
// row layout, the GEMM phases, the TF32 tensor-core phases, the tile loads.
// ---------------------------------------------------------------- fast path
// A fast module's tile values, from src/cuda/geodesic/config.rs (`defines`, `smem`): the
// FFMA kernel's rows per thread (GEO_MB; the TF32 kernels': GEO_TC_MB), whether it
// takes the vector row layout (GEO_VL) and whether the module's leapfrog forward has
// the variant with U and W in registers (GEO_RS), and the shared memory in bytes of
// each kernel of the module: GEO_SMEM (the FFMA kernel), GEO_SMEM_TC (TF32),
// GEO_SMEM_STAGE (the TF32 leapfrog forward's optional v stage), GEO_SMEM_TC3
// (3xTF32), GEO_SMEM_RS (U and W in registers); 0 for a variant the module lacks. The
// sizes are computed there only; the kernels check their launch against them
// (check_smem).
#if !defined(GEO_MB) || !defined(GEO_TC_MB) || !defined(GEO_VL) || !defined(GEO_RS) || !defined(GEO_SMEM) || \
    !defined(GEO_SMEM_TC) || !defined(GEO_SMEM_STAGE) || !defined(GEO_SMEM_TC3) || !defined(GEO_SMEM_RS)
#error "a fast module's tile values come from src/cuda/geodesic/config.rs"
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
    static constexpr bool VL = GEO_VL && !TC;
    static constexpr int TI = TC ? 2 : MB;     // row-layout tile per thread: rows
    static constexpr int TJ = TC ? 2 * DJ : DJ;  // and columns
    // the FFMA kernels' W as [DP][RP] (swizzled, w_swz) with VL instead of [DP][SU]
    static constexpr int SW = VL ? RP : SU;
    static constexpr bool UZ = VL && GEO_UZ_MODULE;  // U in w_swz order too
    static constexpr int SUZ = UZ ? RP : SU;         // U's row stride
    // the strict f32 leapfrog forward with U and W in registers (lf_fwd_rs:
    // 16 < R <= 32, 256 < D <= 512)
    static constexpr bool RS = GEO_RS && !TC;
    static_assert(!TC || (MB == 4 && DJ <= 8 && sizeof(T) == 4), "TF32 configurations: f32, M = 16, D <= 512");
    static_assert(!X3 || TC, "3xTF32 is a TF32 configuration");
};


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
