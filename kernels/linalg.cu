// fusekit: kernels of the linear-algebra family (docs/ops.md section 2).
//
// The products themselves run in cuBLAS / cuBLASLt; these are the pieces around
// them:
//   linear_epilogue_<t>  y = act(z + b) (and aux = z + b), z the GEMM's output (y
//                        itself, or aux): the fallback for configurations
//                        cuBLASLt's fused epilogues decline, and the exact GELU
//                        after cuBLASLt's BIAS epilogue (cuBLASLt has only tanh)
//   linear_dz_<t>        dz = dy * act'(saved) and per-split column sums of dz
//   colsum_finish_<t>    db = sum of the column partials
//   mlp_epilogue_<t>     an MLP layer's y = act(z + b) and its saved derivative
//                        information (ReLU bit mask, padded pre-activation)
//   mlp_dz_<t>           dz = g * act'(saved) and column partials, for the MLP
//   kron_w<W>_<t>        batched Kronecker product, W-element (16-byte) stores
// The activations (act_f, act_grad_f) are in activation.cuh, shared with the fused
// MLP's kernels (kernels/mlp_fused.cu).
#include "common.cuh"
#include "activation.cuh"

// ---------------------------------------------------------------- epilogue fallback
// src: the GEMM's output (y itself: in place; or aux, already holding z when bias
// is 0 and aux is 0 here).
// struct EpiArgs: declared in src/cuda/linalg/linear.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void linear_epilogue(const EpiArgs& a) {
    const T* src = reinterpret_cast<const T*>(a.src);
    T* y = reinterpret_cast<T*>(a.y);
    const T* b = reinterpret_cast<const T*>(a.bias);
    T* aux = reinterpret_cast<T*>(a.aux);
    i64 total = a.m * a.n;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        float z = to_compute(src[i]);
        if (b) z += to_compute(b[i % a.n]);
        if (aux) aux[i] = from_compute<T>(z);
        y[i] = from_compute<T>(act_f(a.act, z));
    }
}

// ---------------------------------------------------------------- backward: dz, db
// struct DzArgs: declared in src/cuda/linalg/linear.rs (kernel_args!), defined ahead of this source
// linear_dz's block as src/cuda/linalg/linear.rs launches it (DZ_COLS, DZ_ROWS)
static_assert(FK_LA_DZ_COLS == 32 && FK_LA_DZ_ROWS == 8 && FK_LA_DZ_COLS * FK_LA_DZ_ROWS == 256,
              "linear_dz: block (32, 8): sh[8][33], 32 columns and 8 row lanes, __launch_bounds__(256)");

// block (32, 8): 32 columns, 8 row lanes; grid (ceil(n / 32), splits). Each block
// writes dz[r, col] = deriv(r, col, dy[r, col]) for its rows of its 32 columns (dz
// NULL: not written; dz may be dy, in place) and sums them into partial[split, col]
// (f32). Shared by linear_dz and mlp_dz, which differ in how they read act'.
template <typename T, typename Deriv>
__device__ void dz_colsums(i64 m, i64 n, i64 rows_per_split, const T* dy, T* dz, float* partial,
                           Deriv deriv) {
    __shared__ float sh[8][33];
    i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
    i64 r0 = (i64)blockIdx.y * rows_per_split;
    i64 r1 = r0 + rows_per_split < m ? r0 + rows_per_split : m;
    float acc = 0.0f;
    if (col < n) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
            i64 i = r * n + col;
            float g = deriv(r, col, to_compute(dy[i]));
            if (dz) dz[i] = from_compute<T>(g);
            acc += g;
        }
    }
    if (!partial) return;
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < n) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s += sh[j][threadIdx.x];
        partial[(i64)blockIdx.y * n + col] = s;
    }
}

template <typename T> __device__ void linear_dz(const DzArgs& a) {
    const T* sv = reinterpret_cast<const T*>(a.saved);
    i64 n = a.n;
    int act = a.act;
    dz_colsums(a.m, n, a.rows_per_split, reinterpret_cast<const T*>(a.dy), reinterpret_cast<T*>(a.dz),
               reinterpret_cast<float*>(a.partial), [=](i64 r, i64 col, float g) {
                   return act == FK_LA_ACT_NONE ? g : act_grad_f(act, to_compute(sv[r * n + col]), g);
               });
}

// struct FinishArgs: declared in src/cuda/linalg/linear.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void colsum_finish(const FinishArgs& a) {
    const float* p = reinterpret_cast<const float*>(a.partial);
    T* out = reinterpret_cast<T*>(a.out);
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < a.n; c += (i64)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (i64 j = 0; j < a.splits; ++j) s += p[j * a.n + c];
        out[c] = from_compute<T>(s);
    }
}

// ---------------------------------------------------------------- MLP
// The layers of src/cuda/linalg/mlp.rs keep each activation's derivative
// information in the layout of src/ops/mlp.rs (SavedLayout), which cuBLASLt's
// RELU_AUX / GELU_AUX epilogues write and its DRELU / DGELU ones read: for ReLU a
// bit mask, row r's bit j (z > 0) at bit j % 8 of byte r * aux_ld / 8 + j / 8
// (aux_ld in bits, a multiple of 128); for the GELUs z, row pitch aux_ld elements.

// mlp_epilogue: y = act(src + b) over [m, n] (src row pitch src_ld, y dense; src
// may be y, in place; src NULL: zeros, to broadcast b into y; y NULL: not
// written, for the ReLU mask of an output the product already holds), and z = src + b into aux when given (the mask for ReLU,
// padding bits 0). One thread per 8 columns of a row (a mask byte).
// struct MlpEpiArgs: declared in src/cuda/linalg/mlp.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void mlp_epilogue(const MlpEpiArgs& a) {
    const T* src = reinterpret_cast<const T*>(a.src);
    T* y = reinterpret_cast<T*>(a.y);
    const T* b = reinterpret_cast<const T*>(a.bias);
    bool mask = a.act == FK_LA_ACT_RELU && a.aux;
    unsigned char* bits_out = reinterpret_cast<unsigned char*>(a.aux);
    T* z_out = mask ? nullptr : reinterpret_cast<T*>(a.aux);
    i64 groups = mask ? a.aux_ld / 8 : (a.n + 7) / 8;
    i64 total = a.m * groups;
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        i64 r = t / groups, j0 = (t % groups) * 8;
        unsigned bits = 0;
        for (int u = 0; u < 8 && j0 + u < a.n; ++u) {
            i64 j = j0 + u;
            float z = src ? to_compute(src[r * a.src_ld + j]) : 0.0f;
            if (b) z += to_compute(b[j]);
            if (mask) bits |= (z > 0.0f ? 1u : 0u) << u;
            if (z_out) z_out[r * a.aux_ld + j] = from_compute<T>(z);
            if (y) y[r * a.n + j] = from_compute<T>(act_f(a.act, z));
        }
        if (mask) bits_out[r * (a.aux_ld / 8) + j0 / 8] = (unsigned char)bits;
    }
}

// mlp_dz: dz = g * act'(z) over [m, n] (g and dz dense; dz may be g: in place),
// act' from aux as mlp_epilogue writes it, and per-split column sums of dz
// (dz_colsums; the launch of linear_dz).
// struct MlpDzArgs: declared in src/cuda/linalg/mlp.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void mlp_dz(const MlpDzArgs& a) {
    const unsigned char* bits = reinterpret_cast<const unsigned char*>(a.aux);
    const T* z = reinterpret_cast<const T*>(a.aux);
    i64 ld = a.aux_ld;
    int act = a.act;
    dz_colsums(a.m, a.n, a.rows_per_split, reinterpret_cast<const T*>(a.g), reinterpret_cast<T*>(a.dz),
               reinterpret_cast<float*>(a.partial), [=](i64 r, i64 col, float g) {
                   if (act == FK_LA_ACT_NONE) return g;
                   if (act == FK_LA_ACT_RELU) return (bits[r * (ld / 8) + col / 8] >> (col % 8)) & 1u ? g : 0.0f;
                   return act_grad_f(act, to_compute(z[r * ld + col]), g);
               });
}

// ---------------------------------------------------------------- Kronecker
// out[bi, i*p + s, j*q + t] = a[bi, i, j] * b[bi, s, t]   (out contiguous, [batch, m*p, n*q])
//
// Written for store bandwidth (the output is p*q times larger than a). A thread owns
// one store unit of W consecutive output columns (16 bytes when the launcher can:
// W = 16 / sizeof(T); fewer when the row pitch or the output's address is not 16-byte
// aligned) and one row s of b; it loads its W elements of b once into registers and
// then walks the rows i of a, each store being a[bi, i, j] * (its b elements):
// one load of a (shared by the lanes of its segment) per 16-byte store, pointer
// increments and no integer division in the loop. The decomposition of the unit's
// columns into (j, t) and of the block's task into (batch, i chunk, s block) is done
// once, with 32-bit divisions when everything fits.
//
// Launch (src/cuda/linalg/kron.rs kron_config): block (bx, bs * il): threadIdx.x over
// units, threadIdx.y = s offset (bs of them) + bs * lane (il lanes over i, rows
// lane, lane + il, ... of the task's chunk of `rows * il` rows of a); grid.x over
// units, grid.y over tasks (grid-stride when more than 65535). Tasks are ordered
// with the s block fastest, so neighbouring blocks write neighbouring output rows.
//
// SPLIT (complex output aligned only to its components): each element stored as its
// two components. Loads of a and b go through the components too (an element's
// alignment is never assumed beyond its components').
// struct KronArgs: declared in src/cuda/linalg/kron.rs (kernel_args!), defined ahead of this source
// the block src/cuda/linalg/kron.rs launches has at most KRON_THREADS threads
static_assert(FK_LA_KRON_THREADS == 256, "kron kernels: __launch_bounds__(256)");

#ifndef FK_CHECK_ALIGNED
#define FK_CHECK_ALIGNED(ptr, bytes) ((void)0)
#endif

template <typename T> __device__ __forceinline__ T kron_ld(const T* p) { return *p; }
template <> __device__ __forceinline__ c64 kron_ld<c64>(const c64* p) {
    const float* f = reinterpret_cast<const float*>(p);
    return cmake<c64>(f[0], f[1]);
}
template <> __device__ __forceinline__ c128 kron_ld<c128>(const c128* p) {
    const double* f = reinterpret_cast<const double*>(p);
    return cmake<c128>(f[0], f[1]);
}

template <typename T, int W> struct alignas(sizeof(T) * W) KronVec {
    T v[W];
};

template <typename T, int W, bool SPLIT> struct KronStore {
    static __device__ __forceinline__ void run(T* p, const KronVec<T, W>& o) {
        FK_CHECK_ALIGNED(p, sizeof(KronVec<T, W>));
        *reinterpret_cast<KronVec<T, W>*>(p) = o;
    }
};
template <typename T> struct KronStore<T, 1, true> {
    static __device__ __forceinline__ void run(T* p, const KronVec<T, 1>& o) {
        typedef typename ComplexReal<T>::type R;
        R* r = reinterpret_cast<R*>(p);
        FK_CHECK_ALIGNED(r, sizeof(R));
        r[0] = o.v[0].re;
        r[1] = o.v[0].im;
    }
};

__device__ __forceinline__ i64 kron_div(i64 x, i64 d, bool small) {
    return small ? (i64)((unsigned)x / (unsigned)d) : x / d;
}

template <typename T, int W, bool SPLIT> __device__ void kron(const KronArgs& a) {
    typedef typename Compute<T>::type C;
    const i64 u = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= a.units) return;  // no barriers in this kernel
    const bool small = a.small != 0;
    const int s_off = (int)threadIdx.y % a.bs;
    const int lane = (int)threadIdx.y / a.bs;
    // the unit's first column c0 as (segment j0, offset t0), once
    const i64 c0 = u * W;
    const i64 j0 = kron_div(c0, a.q, small);
    const i64 t0 = c0 - j0 * a.q;
    const T* __restrict__ A = reinterpret_cast<const T*>(a.a);
    const T* __restrict__ B = reinterpret_cast<const T*>(a.b);
    T* __restrict__ out = reinterpret_cast<T*>(a.out);
    const i64 chunk = a.rows * a.il;
    const i64 ostep = a.il * a.p * a.cols;  // output elements between the thread's rows
    const i64 astep = a.il * a.sa1;
    for (i64 task = blockIdx.y; task < a.tasks; task += gridDim.y) {
        // task = (bi * i_chunks + ich) * s_blocks + sblk
        const i64 r1 = kron_div(task, a.s_blocks, small);
        const i64 sblk = task - r1 * a.s_blocks;
        const i64 bi = kron_div(r1, a.i_chunks, small);
        const i64 ich = r1 - bi * a.i_chunks;
        const i64 s = sblk * a.bs + s_off;
        i64 i = ich * chunk + lane;
        const i64 i_end = ich * chunk + chunk < a.m ? ich * chunk + chunk : a.m;
        if (s >= a.p || i >= i_end) continue;
        // this thread's elements of b, for every row it writes; the columns of the
        // unit after c0 continue from (j0, t0) with wrap-around, no division
        C bv[W];
        i64 ja[W];  // a's column offset of each element
        const T* brow = B + bi * a.sb0 + s * a.sb1;
        {
            i64 j = j0, t = t0;
#pragma unroll
            for (int e = 0; e < W; ++e) {
                if (e > 0 && ++t == a.q) {
                    t = 0;
                    ++j;
                }
                bv[e] = to_compute(kron_ld(brow + t * a.sb2));
                ja[e] = j * a.sa2;
            }
        }
        const T* ap = A + bi * a.sa0 + i * a.sa1;
        T* op = out + ((bi * a.m + i) * a.p + s) * a.cols + c0;
        if (a.uniform) {
#pragma unroll 4
            for (; i < i_end; i += a.il) {
                const C x = to_compute(kron_ld(ap + ja[0]));
                KronVec<T, W> o;
#pragma unroll
                for (int e = 0; e < W; ++e) o.v[e] = from_compute<T>(x * bv[e]);
                KronStore<T, W, SPLIT>::run(op, o);
                ap += astep;
                op += ostep;
            }
        } else {
            // the unit straddles segments (q % W != 0): one a element per column
            for (; i < i_end; i += a.il) {
                KronVec<T, W> o;
#pragma unroll
                for (int e = 0; e < W; ++e)
                    o.v[e] = from_compute<T>(to_compute(kron_ld(ap + ja[e])) * bv[e]);
                KronStore<T, W, SPLIT>::run(op, o);
                ap += astep;
                op += ostep;
            }
        }
    }
}

// ---------------------------------------------------------------- entry points
#define FK_LINEAR_KERNELS(T)                                                                  \
    extern "C" __global__ void linear_epilogue_##T(EpiArgs a) { linear_epilogue<T>(a); }     \
    extern "C" __global__ void __launch_bounds__(256) linear_dz_##T(DzArgs a) { linear_dz<T>(a); } \
    extern "C" __global__ void colsum_finish_##T(FinishArgs a) { colsum_finish<T>(a); }
FK_LINEAR_KERNELS(f16)
FK_LINEAR_KERNELS(bf16)
FK_LINEAR_KERNELS(f32)

#define FK_MLP_KERNELS(T)                                                                     \
    extern "C" __global__ void mlp_epilogue_##T(MlpEpiArgs a) { mlp_epilogue<T>(a); }        \
    extern "C" __global__ void __launch_bounds__(256) mlp_dz_##T(MlpDzArgs a) { mlp_dz<T>(a); }
FK_MLP_KERNELS(f16)
FK_MLP_KERNELS(bf16)
FK_MLP_KERNELS(f32)

// kron_w<W>_<t>: W elements per store (16 bytes at most); kron_split_<t>: complex
// output aligned only to its components.
#define FK_KRON_KERNEL(T, W)                                                               \
    extern "C" __global__ void __launch_bounds__(256) kron_w##W##_##T(KronArgs a) {       \
        kron<T, W, false>(a);                                                              \
    }
#define FK_KRON_SPLIT(T) \
    extern "C" __global__ void __launch_bounds__(256) kron_split_##T(KronArgs a) { kron<T, 1, true>(a); }
FK_KRON_KERNEL(f16, 8)
FK_KRON_KERNEL(f16, 4)
FK_KRON_KERNEL(f16, 2)
FK_KRON_KERNEL(f16, 1)
FK_KRON_KERNEL(bf16, 8)
FK_KRON_KERNEL(bf16, 4)
FK_KRON_KERNEL(bf16, 2)
FK_KRON_KERNEL(bf16, 1)
FK_KRON_KERNEL(f32, 4)
FK_KRON_KERNEL(f32, 2)
FK_KRON_KERNEL(f32, 1)
FK_KRON_KERNEL(f64, 2)
FK_KRON_KERNEL(f64, 1)
FK_KRON_KERNEL(c64, 2)
FK_KRON_KERNEL(c64, 1)
FK_KRON_SPLIT(c64)
FK_KRON_KERNEL(c128, 1)
FK_KRON_SPLIT(c128)
