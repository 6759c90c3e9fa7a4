// fusekit: the fully fused MLP for narrow networks (docs/ops.md section 6, "The
// fused path"): every layer of the network in one kernel each way, f16 / bf16
// with f32 accumulation on the tensor cores (mma.sync m16n8k16, sm_80 and up).
//
//   mlpf_fwd_w<W>_<t>  the forward: y, and in training the saved buffer in the
//                      layout of src/ops/mlp.rs (SavedLayout: each hidden layer's
//                      output h, the ReLU bit mask or the GELU pre-activation)
//   mlpf_bwd_w<W>_<t>  the backward's data-gradient chain: each layer's dz (into
//                      the call's scratch, for the weight-gradient products), its
//                      bias gradient's per-block column partials, and dx
// W (16, 32, 64, 128) is the widest layer padded to a multiple of 16.
//
// Design. Each warp carries 16 * MT rows (MT: the instance's row tiles per warp)
// of the batch through every layer in registers: the accumulator fragment of one
// mma.sync m16n8k16 (rows g, g + 8, columns 2t, 2t + 1 of an 8-column tile;
// g = lane / 4, t = lane % 4) is exactly half of the A operand fragment of a
// 16-column tile, so a layer's output, with bias and activation applied in f32 and
// rounded once to the dtype, becomes the next layer's input without touching
// memory. The weights of every layer are staged once per block in shared memory,
// zero-padded to the instance width W in both dimensions (so any width up to 128
// works, padded columns give act(0) = 0, and every loop around an mma has
// compile-time bounds: see mf_product), rows skewed by 8 elements (conflict-free
// 32-bit operand loads); in the backward they are staged transposed, so the B
// operand of dz W is read the same way. Blocks loop over row tiles (grid-stride),
// so the weights are read from L2 once per block; rows past m are zero inputs
// never stored.
//
// Everything the launcher decides (padded widths, pitches, shared-memory offsets,
// the warps per block) comes in the argument struct or as #defines from
// src/cuda/linalg/mlp_fused.rs; nothing is computed again here. The kernels take
// their argument as __grid_constant__: the layer table is indexed by a run-time
// layer number, read from the parameter bank rather than copied per thread.
//
// struct MfLayer, struct MfArgs: declared in src/cuda/linalg/mlp_fused.rs
// (kernel_args!), defined ahead of this source. FK_MF_WARPS, FK_LA_ACT_* from there.
#include "common.cuh"
#include "activation.cuh"

typedef unsigned int u32;

#if defined(FK_NVRTC)
// D += A B, one m16n8k16 tile, f32 accumulation (the whole warp calls it).
template <typename T> __device__ __forceinline__ void mf_mma(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1);
template <> __device__ __forceinline__ void mf_mma<f16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mf_mma<bf16>(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ unsigned short mf_bits(f16 x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short mf_bits(bf16 x) { return __bfloat16_as_ushort(x); }
#define MF_SHFL_XOR(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask))
#define MF_SMEM_DECL extern __shared__ __align__(16) unsigned char mf_smem[];
#endif

// Two elements as one 32-bit operand register: the lower column in the low half.
template <typename T> __device__ __forceinline__ u32 mf_pack(T lo, T hi) {
    return (u32)mf_bits(lo) | ((u32)mf_bits(hi) << 16);
}

// Element (r, c) of a row-major [m, cols] matrix with row pitch ld; 0 outside.
template <typename T> __device__ __forceinline__ T mf_ld(const T* p, i64 r, int c, i64 m, int cols, i64 ld) {
    return r < m && c < cols ? p[r * ld + c] : from_compute<T>(0.0f);
}

// Elements (r, c) and (r, c + 1) (c even) stored where they lie inside [m, cols]:
// one 32-bit store when both do and `vec` (p 4-byte aligned, ld even).
template <typename T>
__device__ __forceinline__ void mf_st2(T* p, i64 r, int c, i64 m, int cols, i64 ld, bool vec, T v0, T v1) {
    if (r >= m || c >= cols) return;
    T* q = p + r * ld + c;
    if (vec && c + 1 < cols) {
        *reinterpret_cast<u32*>(q) = mf_pack(v0, v1);
    } else {
        q[0] = v0;
        if (c + 1 < cols) q[1] = v1;
    }
}

// Activations are dispatched once per layer, not per element: the kernels switch on
// a layer's activation code (MF_BY_ACT) into code compiled for that one activation.
// Per element, the run-time code would inline every activation's formula (tanh, erf)
// into each of the tile's unrolled elements: on the H200 the forward's instruction
// fetch then stalled its warps 44% of the time (Nsight Compute, "no instruction").
#define MF_BY_ACT(act, F, ...)                                        \
    switch (act) {                                                    \
        case FK_LA_ACT_RELU: F<FK_LA_ACT_RELU>(__VA_ARGS__); break;           \
        case FK_LA_ACT_GELU_TANH: F<FK_LA_ACT_GELU_TANH>(__VA_ARGS__); break; \
        case FK_LA_ACT_GELU_ERF: F<FK_LA_ACT_GELU_ERF>(__VA_ARGS__); break;   \
        default: F<FK_LA_ACT_NONE>(__VA_ARGS__); break;                       \
    }

// The derivative of layer L's activation ACT at (r, c) times g, from what the
// forward saved (a bit of the ReLU mask, the GELU's pre-activation); 0 outside [m, n].
template <typename T, int ACT>
__device__ __forceinline__ float mf_deriv(const MfLayer& L, i64 r, int c, i64 m, float g) {
    if (r >= m || c >= L.n) return 0.0f;
    if (ACT == FK_LA_ACT_NONE) return g;
    if (ACT == FK_LA_ACT_RELU) {
        const unsigned char* bits = reinterpret_cast<const unsigned char*>(L.aux);
        return (bits[r * (L.aux_ld / 8) + c / 8] >> (c % 8)) & 1u ? g : 0.0f;
    }
    const T* z = reinterpret_cast<const T*>(L.aux);
    return act_grad_f(ACT, to_compute(z[r * L.aux_ld + c]), g);
}

// d = act'(z) gr over a warp's tile (accumulator layout), for layer L's activation ACT.
template <typename T, int MT, int NT> struct MfDerivs {
    template <int ACT>
    static __device__ __forceinline__ void run(float (&d)[MT][NT][4], const float (&gr)[MT][NT][4], const MfLayer& L,
                                               i64 r0, i64 m, int g, int t) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const i64 r = r0 + mt * 16 + g + 8 * (e >> 1);
                    const int c = nt * 8 + 2 * t + (e & 1);
                    d[mt][nt][e] = mf_deriv<T, ACT>(L, r, c, m, gr[mt][nt][e]);
                }
    }
};

// Stages layer L's weights ([n, k], row-major) into shared memory, zero-padded to
// [np, kp] (both the instance's width W): as they are (pitch kp + 8) for the
// forward, transposed ([kp, np], pitch np + 8) for the backward. The whole block
// calls it.
template <typename T, bool TRANSPOSED> __device__ void mf_stage(const MfLayer& L, T* ws) {
    const T* w = reinterpret_cast<const T*>(L.w);
    T* dst = ws + L.w_smem;
    const int total = L.np * L.kp;
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
        const int row = i / L.kp, col = i % L.kp;  // row: output feature, col: input feature
        const T v = row < L.n && col < L.k ? w[(i64)row * L.k + col] : from_compute<T>(0.0f);
        if (TRANSPOSED)
            dst[col * L.pitch + row] = v;
        else
            dst[row * L.pitch + col] = v;
    }
}

// acc[mt][nt] += A[mt] (16 x KT*16) times B (KT*16 x NT*8), every tile: B's column
// j, rows kk..kk+1 are the 32-bit word at bs[(nt*8 + g) * pitch + kt*16 + 2t (+ 8)].
// The loops have compile-time bounds and no exits (a layer narrower than the
// instance multiplies the zeros of its staged padding): an mma.sync under control
// flow that the compiler cannot prove warp-uniform (the layer table is indexed by
// a run-time layer) is wrapped in a warp-collective sequence per instruction, which
// on the H200 made the first version of these kernels 20x slower.
template <typename T, int MT, int KT, int NT>
__device__ __forceinline__ void mf_product(float (&acc)[MT][NT][4], const u32 (&A)[MT][KT][4], const T* bs,
                                           int pitch, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const T* col = bs + (nt * 8 + g) * pitch + 2 * t;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const u32 b0 = *reinterpret_cast<const u32*>(col + kt * 16);
            const u32 b1 = *reinterpret_cast<const u32*>(col + kt * 16 + 8);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) mf_mma<T>(acc[mt][nt], A[mt][kt], b0, b1);
        }
    }
}

// Accumulator tile nt of row tile mt (rounded to T: v0, v1 at row g, v2, v3 at row
// g + 8) as its half of the next product's A operand: tile nt is columns 0..7
// (nt even) or 8..15 (nt odd) of the 16-column tile nt / 2.
template <typename T, int MT, int KT>
__device__ __forceinline__ void mf_put(u32 (&A)[MT][KT][4], int mt, int nt, T v0, T v1, T v2, T v3) {
    const int h = (nt % 2) * 2;
    A[mt][nt / 2][h] = mf_pack(v0, v1);
    A[mt][nt / 2][h + 1] = mf_pack(v2, v3);
}

// ReLU mask bytes of one 8-column tile from (rounded) outputs: bit c of row g's byte
// is h[g][c] > 0, gathered over the 4 lanes of the row; lanes t == 0 hold the bytes
// of rows g (lo) and g + 8 (hi).
__device__ __forceinline__ void mf_mask_bytes(bool p0, bool p1, bool p2, bool p3, int t, u32& lo, u32& hi) {
    lo = ((p0 ? 1u : 0u) | (p1 ? 2u : 0u)) << (2 * t);
    hi = ((p2 ? 1u : 0u) | (p3 ? 2u : 0u)) << (2 * t);
    lo |= MF_SHFL_XOR(lo, 1);
    hi |= MF_SHFL_XOR(hi, 1);
    lo |= MF_SHFL_XOR(lo, 2);
    hi |= MF_SHFL_XOR(hi, 2);
}

// A layer's forward epilogue over a warp's tile, for its activation ACT: bias and
// activation applied in f32 (acc holds z + b), one rounding; the output stored
// (`out`: y, or the hidden output kept for the backward; none in inference), the
// GELU's pre-activation or the ReLU's bit mask kept where the layer has `aux`,
// and, but for the last layer, the result put in the registers as the next
// layer's A operand.
template <typename T, int MT, int KT, int NT> struct MfEpilogue {
    template <int ACT>
    static __device__ __forceinline__ void run(const float (&acc)[MT][NT][4], u32 (&A)[MT][KT][4], const MfLayer& L,
                                               T* out, bool vec, bool last, i64 r0, i64 m, int g, int t) {
        T* zs = ACT == FK_LA_ACT_GELU_TANH || ACT == FK_LA_ACT_GELU_ERF ? reinterpret_cast<T*>(L.aux) : nullptr;
        unsigned char* bits = ACT == FK_LA_ACT_RELU ? reinterpret_cast<unsigned char*>(L.aux) : nullptr;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            const i64 ra = r0 + mt * 16 + g, rb = ra + 8;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const int c = nt * 8 + 2 * t;
                T h[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) h[e] = from_compute<T>(act_f(ACT, acc[mt][nt][e]));
                if (out) {
                    mf_st2(out, ra, c, m, L.n, L.n, vec, h[0], h[1]);
                    mf_st2(out, rb, c, m, L.n, L.n, vec, h[2], h[3]);
                }
                if (zs) {
                    const bool zv = L.aux_ld % 2 == 0;
                    mf_st2(zs, ra, c, m, L.n, L.aux_ld, zv, from_compute<T>(acc[mt][nt][0]),
                           from_compute<T>(acc[mt][nt][1]));
                    mf_st2(zs, rb, c, m, L.n, L.aux_ld, zv, from_compute<T>(acc[mt][nt][2]),
                           from_compute<T>(acc[mt][nt][3]));
                }
                if (bits) {
                    // the mask of the rounded output (> 0 exactly where z > 0, as
                    // the general path's mlp_epilogue derives it); padding bits 0
                    u32 lo, hi;
                    mf_mask_bytes(c < L.n && to_compute(h[0]) > 0.0f, c + 1 < L.n && to_compute(h[1]) > 0.0f,
                                  c < L.n && to_compute(h[2]) > 0.0f, c + 1 < L.n && to_compute(h[3]) > 0.0f, t,
                                  lo, hi);
                    const i64 pitch = L.aux_ld / 8;
                    if (t == 0 && ra < m) bits[ra * pitch + nt] = (unsigned char)lo;
                    if (t == 0 && rb < m) bits[rb * pitch + nt] = (unsigned char)hi;
                }
                // the next layer's input, without leaving the registers
                if (!last) mf_put<T, MT, KT>(A, mt, nt, h[0], h[1], h[2], h[3]);
            }
            if (bits && t == 0) {
                // the row's mask bytes past the instance's width
                const i64 pitch = L.aux_ld / 8;
                for (int j = NT; j < pitch; ++j) {
                    if (ra < m) bits[ra * pitch + j] = 0;
                    if (rb < m) bits[rb * pitch + j] = 0;
                }
            }
        }
    }
};

template <typename T, int MAXW, int MT> __device__ void mlpf_fwd(const MfArgs& a) {
    constexpr int KT = MAXW / 16, NT = MAXW / 8;
    MF_SMEM_DECL
    T* ws = reinterpret_cast<T*>(mf_smem);
    float* bs = reinterpret_cast<float*>(mf_smem + a.f32_smem);
    for (int l = 0; l < a.n_layers; ++l) {
        const MfLayer& L = a.layers[l];
        mf_stage<T, false>(L, ws);
        const T* b = reinterpret_cast<const T*>(L.b);
        for (int c = threadIdx.x; c < L.np; c += blockDim.x)
            bs[L.b_smem + c] = b && c < L.n ? to_compute(b[c]) : 0.0f;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const i64 m = a.m, tiles = (m + 16 * MT - 1) / (16 * MT);
    const T* x = reinterpret_cast<const T*>(a.x);
    const int k0 = a.layers[0].k;
    for (i64 tile = (i64)blockIdx.x * FK_MF_WARPS + warp; tile < tiles; tile += (i64)gridDim.x * FK_MF_WARPS) {
        const i64 r0 = tile * 16 * MT;
        u32 A[MT][KT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kt = 0; kt < KT; ++kt)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const i64 r = r0 + mt * 16 + g + 8 * (j & 1);
                    const int c = kt * 16 + 2 * t + 8 * (j >> 1);
                    A[mt][kt][j] = mf_pack(mf_ld(x, r, c, m, k0, k0), mf_ld(x, r, c + 1, m, k0, k0));
                }
        for (int l = 0; l < a.n_layers; ++l) {
            const MfLayer& L = a.layers[l];
            const bool last = l + 1 == a.n_layers;
            float acc[MT][NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const float b0 = bs[L.b_smem + nt * 8 + 2 * t];
                const float b1 = bs[L.b_smem + nt * 8 + 2 * t + 1];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    acc[mt][nt][0] = acc[mt][nt][2] = b0;
                    acc[mt][nt][1] = acc[mt][nt][3] = b1;
                }
            }
            mf_product<T, MT, KT, NT>(acc, A, ws + L.w_smem, L.pitch, g, t);
            // bias and activation applied in f32, one rounding; then what is kept
            T* out = reinterpret_cast<T*>(last ? a.y : L.hidden);
            const bool vec = last ? a.y_vec != 0 : L.n % 2 == 0;
            using Epilogue = MfEpilogue<T, MT, KT, NT>;
            MF_BY_ACT(L.act, Epilogue::template run, acc, A, L, out, vec, last, r0, m, g, t)
        }
    }
}

template <typename T, int MAXW, int MT> __device__ void mlpf_bwd(const MfArgs& a) {
    constexpr int KT = MAXW / 16, NT = MAXW / 8;
    MF_SMEM_DECL
    T* ws = reinterpret_cast<T*>(mf_smem);
    float* dbs = reinterpret_cast<float*>(mf_smem + a.f32_smem);  // [warps][sum of np]
    const int top = a.n_layers - 1, lo = a.lowest;
    for (int l = lo; l <= top; ++l) {
        const MfLayer& L = a.layers[l];
        if (l > lo || a.dx) mf_stage<T, true>(L, ws);
        for (int c = threadIdx.x; c < L.np * FK_MF_WARPS; c += blockDim.x)
            dbs[(c / L.np) * a.db_stride + L.b_smem + c % L.np] = 0.0f;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const i64 m = a.m, tiles = (m + 16 * MT - 1) / (16 * MT);
    const T* dy = reinterpret_cast<const T*>(a.dy);
    float* mydb = dbs + warp * a.db_stride;
    for (i64 tile = (i64)blockIdx.x * FK_MF_WARPS + warp; tile < tiles; tile += (i64)gridDim.x * FK_MF_WARPS) {
        const i64 r0 = tile * 16 * MT;
        using Derivs = MfDerivs<T, MT, NT>;
        float d[MT][NT][4];  // dz of layer l, f32, accumulator layout
        {
            const MfLayer& L = a.layers[top];
            float gy[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const i64 r = r0 + mt * 16 + g + 8 * (e >> 1);
                        const int c = nt * 8 + 2 * t + (e & 1);
                        gy[mt][nt][e] = to_compute(mf_ld(dy, r, c, m, L.n, L.n));
                    }
            MF_BY_ACT(L.act, Derivs::template run, d, gy, L, r0, m, g, t)
        }
        for (int l = top;; --l) {
            const MfLayer& L = a.layers[l];
            // dz rounded to T: into the scratch for the weight gradients, and as the
            // A operand of dh = dz W
            u32 A[MT][KT][4];
            T* dz = reinterpret_cast<T*>(L.dz);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    T dr[4];
#pragma unroll
                    for (int e = 0; e < 4; ++e) dr[e] = from_compute<T>(d[mt][nt][e]);
                    if (dz) {
                        const i64 ra = r0 + mt * 16 + g;
                        const int c = nt * 8 + 2 * t;
                        mf_st2(dz, ra, c, m, L.n, L.n, L.n % 2 == 0, dr[0], dr[1]);
                        mf_st2(dz, ra + 8, c, m, L.n, L.n, L.n % 2 == 0, dr[2], dr[3]);
                    }
                    mf_put<T, MT, KT>(A, mt, nt, dr[0], dr[1], dr[2], dr[3]);
                }
            if (L.db) {
                // column sums of dz (f32, before rounding) over the tile's rows:
                // the 8 lanes of a column reduce, lane t then adds columns 2t, 2t + 1
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        s0 += d[mt][nt][0] + d[mt][nt][2];
                        s1 += d[mt][nt][1] + d[mt][nt][3];
                    }
#pragma unroll
                    for (int o = 4; o < 32; o *= 2) {
                        s0 += MF_SHFL_XOR(s0, o);
                        s1 += MF_SHFL_XOR(s1, o);
                    }
                    if (g == 0) {
                        mydb[L.b_smem + nt * 8 + 2 * t] += s0;
                        mydb[L.b_smem + nt * 8 + 2 * t + 1] += s1;
                    }
                }
            }
            if (l == lo && !(l == 0 && a.dx)) break;
            // dh = dz W: [rows, k], the product over the layer's n outputs
            float acc[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
            mf_product<T, MT, KT, NT>(acc, A, ws + L.w_smem, L.pitch, g, t);
            if (l == 0) {
                T* dx = reinterpret_cast<T*>(a.dx);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const i64 ra = r0 + mt * 16 + g;
                        const int c = nt * 8 + 2 * t;
                        mf_st2(dx, ra, c, m, L.k, L.k, a.dx_vec != 0, from_compute<T>(acc[mt][nt][0]),
                               from_compute<T>(acc[mt][nt][1]));
                        mf_st2(dx, ra + 8, c, m, L.k, L.k, a.dx_vec != 0, from_compute<T>(acc[mt][nt][2]),
                               from_compute<T>(acc[mt][nt][3]));
                    }
                break;
            }
            // dz of the layer below: dh times its activation's derivative
            const MfLayer& B = a.layers[l - 1];
            MF_BY_ACT(B.act, Derivs::template run, d, acc, B, r0, m, g, t)
        }
    }
    __syncthreads();
    // the block's column partials of each wanted bias gradient, summed over its warps
    float* partial = reinterpret_cast<float*>(a.partial);
    for (int l = lo; l <= top; ++l) {
        const MfLayer& L = a.layers[l];
        if (!L.db) continue;
        for (int c = threadIdx.x; c < L.n; c += blockDim.x) {
            float s = 0.0f;
            for (int w = 0; w < FK_MF_WARPS; ++w) s += dbs[w * a.db_stride + L.b_smem + c];
            partial[L.p_off + (i64)blockIdx.x * L.n + c] = s;
        }
    }
}

#define FK_MF_KERNELS(W, MT, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(FK_MF_WARPS * 32) mlpf_fwd_w##W##_##T(__grid_constant__ const MfArgs a) { \
        mlpf_fwd<T, W, MT>(a);                                                                      \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(FK_MF_WARPS * 32) mlpf_bwd_w##W##_##T(__grid_constant__ const MfArgs a) { \
        mlpf_bwd<T, W, MT>(a);                                                                      \
    }
FK_MF_KERNELS(16, 1, f16)
FK_MF_KERNELS(32, 1, f16)
FK_MF_KERNELS(64, 1, f16)
FK_MF_KERNELS(128, 1, f16)
FK_MF_KERNELS(16, 1, bf16)
FK_MF_KERNELS(32, 1, bf16)
FK_MF_KERNELS(64, 1, bf16)
FK_MF_KERNELS(128, 1, bf16)
