// fusekit: kernels of the optimizer-math family (docs/ops.md section 4).
//
// The products run in cuBLAS (GEMM, SYRK) and the eigendecompositions in cuSOLVER;
// these are the pieces around them. Matrices are row-major, contiguous, batched
// [batch, n, n]. "Row loops": a block takes whole rows (blockIdx.x grid-stride over
// the batch's rows), its threads the columns, so the diagonal test is c == r and no
// thread divides.
//   mp_partials_<t>   per (batch, chunk) partial of sum v^2 or max |v|, v = X + s I
//   mp_finish         combines the partials per matrix (Newton's scale, residual)
//   mp_start_<t>      X = z^(1/p) I, M = z (A + eps I)
//   mp_affine_<t>     T = ((p + 1) I - M) / p
//   eig_prepare_<t>   Q = A + eps I (cuSOLVER overwrites it with eigenvectors)
//   eig_scale_<t>     S = diag((lambda + shift)^power) Q (rows of Q are eigenvectors)
//   sym_mirror_<t>    lower triangle = upper triangle (after SYRK), tiled transpose
//   ps_outer_<t>      out[b] = g_b a_b^T for one step (write-bandwidth bound)
//   ps_norms_<t>      |g_b|^2 |a_b|^2 per sample; optionally gs = min(1, C/|G_b|) g_b
//   ps_norms_vec_<t>  the same, one 16-byte vector per thread and row (few samples)
//   ps_norms_warp_<t> the same, one warp per sample with 16-byte loads (many samples)
//   ps_gram_dot_<t>   <Ga_b, Gg_b> per sample (sequence norms from Gram matrices)
//   ps_scale_rows_<t> gs_b = min(1, C/|G_b|) g_b from given squared norms
#include "common.cuh"

// FK_BLOCK (threads of the row loops, launch::BLOCK) and PS_VEC_MAX_BLOCK (the
// widest ps_norms_vec block) come from src/cuda/optim.rs, defined ahead of this
// source.
#if !defined(FK_BLOCK) || !defined(PS_VEC_MAX_BLOCK)
#error "FK_BLOCK and PS_VEC_MAX_BLOCK come from src/cuda/optim.rs (fusekit::cuda::modules() has the full source)"
#endif

__device__ __forceinline__ double nan_max(double a, double b) {
    return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000ULL) : fmax(a, b);
}

// Block-wide reduction of one double per thread (sum or NaN-propagating max);
// the result is valid in thread 0. blockDim.x is a multiple of 32, <= 1024.
__device__ double block_reduce(double v, int is_max) {
    __shared__ double warp_part[32];
    for (int o = 16; o > 0; o >>= 1) {
        double w = __shfl_down_sync(0xffffffffu, v, o);
        v = is_max ? nan_max(v, w) : v + w;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // warp_part may still be read by a previous call
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    int nw = blockDim.x >> 5;
    v = threadIdx.x < nw ? warp_part[threadIdx.x] : 0.0;  // 0 is neutral for sums and max |.|
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) {
            double w = __shfl_down_sync(0xffffffffu, v, o);
            v = is_max ? nan_max(v, w) : v + w;
        }
    }
    return v;
}

// ---------------------------------------------------------------- Newton iteration
// struct PartialArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

// grid (chunks, min(batch, 65535)); chunk c takes rows c, c + chunks, ...
template <typename T> __device__ void mp_partials(const PartialArgs& a) {
    const i64 nn = a.n * a.n;
    for (i64 b = blockIdx.y; b < a.batch; b += gridDim.y) {
        const T* src = reinterpret_cast<const T*>(a.src) + b * nn;
        double acc = 0.0;
        for (i64 r = blockIdx.x; r < a.n; r += a.chunks) {
            const T* row = src + r * a.n;
            for (i64 c = threadIdx.x; c < a.n; c += blockDim.x) {
                double v = (double)row[c] + (c == r ? a.shift : 0.0);
                acc = a.mode ? nan_max(acc, fabs(v)) : acc + v * v;
            }
        }
        acc = block_reduce(acc, a.mode);
        if (threadIdx.x == 0) reinterpret_cast<double*>(a.partial)[b * a.chunks + blockIdx.x] = acc;
    }
}

// struct FinishArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

extern "C" __global__ void mp_finish(FinishArgs a) {
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < a.batch; b += (i64)gridDim.x * blockDim.x) {
        const double* part = reinterpret_cast<const double*>(a.partial) + b * a.chunks;
        double acc = 0.0;
        for (i64 c = 0; c < a.chunks; c++) acc = a.mode ? nan_max(acc, part[c]) : acc + part[c];
        double* out = reinterpret_cast<double*>(a.out);
        if (a.mode) {
            out[b] = acc;
        } else {
            // z = (1 + p) / (2 |A + eps I|_F) (src/cpu/optim.rs newton_scale)
            double f = sqrt(acc);
            double z = f > 0.0 ? (1.0 + a.p) / (2.0 * f) : 1.0;
            out[2 * b] = z;
            out[2 * b + 1] = pow(z, 1.0 / a.p);
        }
    }
}

// struct StartArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void mp_start(const StartArgs& a) {
    const i64 rows = a.batch * a.n;
    const double* sc = reinterpret_cast<const double*>(a.scale);
    for (i64 gr = blockIdx.x; gr < rows; gr += gridDim.x) {
        i64 b = gr / a.n, r = gr - b * a.n;
        double z = sc[2 * b], x0 = sc[2 * b + 1];
        const T* src = reinterpret_cast<const T*>(a.a) + gr * a.n;
        T* x = reinterpret_cast<T*>(a.x) + gr * a.n;
        T* m = reinterpret_cast<T*>(a.m) + gr * a.n;
        for (i64 c = threadIdx.x; c < a.n; c += blockDim.x) {
            x[c] = (T)(c == r ? x0 : 0.0);
            m[c] = (T)(z * ((double)src[c] + (c == r ? a.eps : 0.0)));
        }
    }
}

// struct AffineArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void mp_affine(const AffineArgs& a) {
    const i64 rows = a.batch * a.n;
    const T inv = T(1) / T(a.p), diag = T(a.p + 1);
    for (i64 gr = blockIdx.x; gr < rows; gr += gridDim.x) {
        i64 r = gr % a.n;
        const T* m = reinterpret_cast<const T*>(a.m) + gr * a.n;
        T* t = reinterpret_cast<T*>(a.t) + gr * a.n;
        for (i64 c = threadIdx.x; c < a.n; c += blockDim.x) t[c] = ((c == r ? diag : T(0)) - m[c]) * inv;
    }
}

// ---------------------------------------------------------------- eigendecomposition
// struct EigPrepArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void eig_prepare(const EigPrepArgs& a) {
    const i64 rows = a.batch * a.n;
    for (i64 gr = blockIdx.x; gr < rows; gr += gridDim.x) {
        i64 r = gr % a.n;
        const T* src = reinterpret_cast<const T*>(a.a) + gr * a.n;
        T* q = reinterpret_cast<T*>(a.q) + gr * a.n;
        for (i64 c = threadIdx.x; c < a.n; c += blockDim.x) q[c] = (T)((double)src[c] + (c == r ? a.eps : 0.0));
    }
}

// struct EigScaleArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

// Row j of matrix b of q is eigenvector j (cuSOLVER's column-major output); w holds
// the eigenvalues in ascending order, so w[b][0] is the smallest.
template <typename T> __device__ void eig_scale(const EigScaleArgs& a) {
    const i64 rows = a.batch * a.n;
    const T* w = reinterpret_cast<const T*>(a.w);
    for (i64 gr = blockIdx.x; gr < rows; gr += gridDim.x) {
        i64 b = gr / a.n;
        double lmin = (double)w[b * a.n];
        double shift = lmin < a.eps ? a.eps - lmin : 0.0;  // cpu::optim::eigen_shift
        T f = (T)pow((double)w[gr] + shift, a.power);
        const T* q = reinterpret_cast<const T*>(a.q) + gr * a.n;
        T* s = reinterpret_cast<T*>(a.s) + gr * a.n;
        for (i64 c = threadIdx.x; c < a.n; c += blockDim.x) s[c] = f * q[c];
    }
}

// ---------------------------------------------------------------- symmetric mirror
// struct MirrorArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

// Block (32, 8) per 32x32 tile (ti, tj) with ti >= tj (blockIdx.x enumerates the
// lower tiles, blockIdx.y grid-strides the batch): tile (ti, tj) of the lower
// triangle = transpose of tile (tj, ti) of the upper one, through shared memory.
template <typename T> __device__ void sym_mirror(const MirrorArgs& a) {
    __shared__ T tile[32][33];
    // lower tile index k -> (ti, tj), ti >= tj: k = ti (ti + 1) / 2 + tj
    i64 k = blockIdx.x;
    i64 ti = (i64)((sqrt(8.0 * (double)k + 1.0) - 1.0) * 0.5);
    while (ti * (ti + 1) / 2 > k) ti--;
    while ((ti + 1) * (ti + 2) / 2 <= k) ti++;
    i64 tj = k - ti * (ti + 1) / 2;
    for (i64 b = blockIdx.y; b < a.batch; b += gridDim.y) {
        T* m = reinterpret_cast<T*>(a.m) + b * a.n * a.n;
        // read the upper tile (tj, ti): rows tj*32.., columns ti*32..
        for (int y = threadIdx.y; y < 32; y += 8) {
            i64 r = tj * 32 + y, c = ti * 32 + threadIdx.x;
            if (r < a.n && c < a.n && c >= r) tile[y][threadIdx.x] = m[r * a.n + c];
        }
        __syncthreads();
        for (int y = threadIdx.y; y < 32; y += 8) {
            i64 r = ti * 32 + y, c = tj * 32 + threadIdx.x;
            if (r < a.n && c < a.n && r > c) m[r * a.n + c] = tile[threadIdx.x][y];
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- per-sample gradients
// struct OuterArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T, typename V> __device__ void ps_outer(const OuterArgs& p) {
    const i64 rows = p.batch * p.dout;
    const int W = sizeof(V) / sizeof(T);
    for (i64 gr = blockIdx.x; gr < rows; gr += gridDim.x) {
        i64 b = gr / p.dout;
        const T gv = reinterpret_cast<const T*>(p.g)[gr];
        const T* arow = reinterpret_cast<const T*>(p.a) + b * p.din;
        T* orow = reinterpret_cast<T*>(p.out) + gr * p.din;
        if (p.vec) {
            const V* av = reinterpret_cast<const V*>(arow);
            V* ov = reinterpret_cast<V*>(orow);
            for (i64 c = threadIdx.x; c < p.din / W; c += blockDim.x) {
                V x = av[c];
                T* xs = reinterpret_cast<T*>(&x);
#pragma unroll
                for (int j = 0; j < W; j++) xs[j] = gv * xs[j];
                __stcs(ov + c, x);
            }
        } else {
            for (i64 c = threadIdx.x; c < p.din; c += blockDim.x) orow[c] = gv * arow[c];
        }
    }
}

// struct NormArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

__device__ __forceinline__ double clip_scale(double sq, double max_norm) {
    double norm = sqrt(sq);
    return norm > max_norm ? max_norm / norm : 1.0;  // cpu::optim / ops::optim clip_scale
}

// Block-wide sums of two doubles, returned to every thread (one barrier pair).
__device__ __forceinline__ double2 block_sum2(double x, double y) {
    __shared__ double2 part2[32];
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_down_sync(0xffffffffu, x, o);
        y += __shfl_down_sync(0xffffffffu, y, o);
    }
    __syncthreads();  // part2 may still be read from a previous call
    if ((threadIdx.x & 31) == 0) part2[threadIdx.x >> 5] = make_double2(x, y);
    __syncthreads();
    double2 r = make_double2(0.0, 0.0);
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) r.x += part2[w].x, r.y += part2[w].y;
    return r;
}

// One block per sample (grid-stride): |a_b|^2 |g_b|^2 in f64, and optionally the
// clipped g. The first PS_KEEP * blockDim.x elements of g stay in registers between
// the norm and the scaling (no second read); one barrier pair per sample. This
// kernel is the whole cost of the clipped sum beyond its GEMM.
#define PS_KEEP 4
template <typename T> __device__ void ps_norms(const NormArgs& p) {
    fk_grid_dependency_wait();  // launched as a programmatic dependent
    const i64 nb = blockDim.x;
    for (i64 b = blockIdx.x; b < p.batch; b += gridDim.x) {
        const T* a = reinterpret_cast<const T*>(p.a) + b * p.din;
        const T* g = reinterpret_cast<const T*>(p.g) + b * p.dout;
        T keep[PS_KEEP];
        double sa = 0.0, sg = 0.0;
#pragma unroll
        for (int k = 0; k < PS_KEEP; ++k) {
            i64 i = threadIdx.x + k * nb;
            keep[k] = i < p.dout ? g[i] : (T)0;
        }
#pragma unroll 4
        for (i64 i = threadIdx.x; i < p.din; i += nb) sa += (double)a[i] * (double)a[i];
#pragma unroll
        for (int k = 0; k < PS_KEEP; ++k) sg += (double)keep[k] * (double)keep[k];
        for (i64 i = threadIdx.x + PS_KEEP * nb; i < p.dout; i += nb) sg += (double)g[i] * (double)g[i];
        double2 s2 = block_sum2(sa, sg);
        double sq = s2.x * s2.y;
        if (p.norms && threadIdx.x == 0) reinterpret_cast<T*>(p.norms)[b] = (T)sq;
        if (p.gs) {
            T s = (T)clip_scale(sq, p.max_norm);
            T* gs = reinterpret_cast<T*>(p.gs) + b * p.dout;
#pragma unroll
            for (int k = 0; k < PS_KEEP; ++k) {
                i64 i = threadIdx.x + k * nb;
                if (i < p.dout) gs[i] = s * keep[k];
            }
            for (i64 i = threadIdx.x + PS_KEEP * nb; i < p.dout; i += nb) gs[i] = s * g[i];
        }
    }
}

// One block per sample (grid-stride), one 16-byte vector of each row per thread:
// rows of at most blockDim.x vectors, 16-byte aligned (the host checks and sizes the
// block to the rows). Every load is issued before any arithmetic and nothing loops,
// so a sample costs one memory round trip; the vector of g stays in registers for
// the scaling. The form for few samples (fewer than two per multiprocessor).
template <typename T, typename V> __device__ void ps_norms_vec(const NormArgs& p) {
    fk_grid_dependency_wait();  // launched as a programmatic dependent
    constexpr int W = sizeof(V) / sizeof(T);
    const int i = threadIdx.x;
    const int vin = (int)(p.din / W), vout = (int)(p.dout / W);
    for (i64 b = blockIdx.x; b < p.batch; b += gridDim.x) {
        V x = V(), y = V();
        if (i < vin) x = reinterpret_cast<const V*>(p.a)[b * vin + i];
        if (i < vout) y = reinterpret_cast<const V*>(p.g)[b * vout + i];
        double sa = 0.0, sg = 0.0;
        const T* ex = reinterpret_cast<const T*>(&x);
        const T* ey = reinterpret_cast<const T*>(&y);
#pragma unroll
        for (int w = 0; w < W; ++w) {
            sa += (double)ex[w] * (double)ex[w];
            sg += (double)ey[w] * (double)ey[w];
        }
        double2 s2 = block_sum2(sa, sg);
        double sq = s2.x * s2.y;
        if (p.norms && i == 0) reinterpret_cast<T*>(p.norms)[b] = (T)sq;
        if (p.gs && i < vout) {
            T s = (T)clip_scale(sq, p.max_norm);
            T* e = reinterpret_cast<T*>(&y);
#pragma unroll
            for (int w = 0; w < W; ++w) e[w] *= s;
            reinterpret_cast<V*>(p.gs)[b * vout + i] = y;
        }
    }
}

// One warp per sample (grid-stride over warps), 16-byte loads: the fast form of
// ps_norms for many samples with dims that are multiples of the vector width and
// 16-byte aligned rows (the host checks). No barriers at all: warp shuffles reduce,
// and the first PS_WKEEP vectors of g per lane stay in registers for the scaling.
#define PS_WKEEP 8
template <typename T, typename V> __device__ void ps_norms_warp(const NormArgs& p) {
    fk_grid_dependency_wait();  // launched as a programmatic dependent
    constexpr int W = sizeof(V) / sizeof(T);
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const i64 vin = p.din / W, vout = p.dout / W;
    for (i64 b = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < p.batch; b += warps) {
        const V* a = reinterpret_cast<const V*>(p.a) + b * vin;
        const V* g = reinterpret_cast<const V*>(p.g) + b * vout;
        V keep[PS_WKEEP];
#pragma unroll
        for (int k = 0; k < PS_WKEEP; ++k) {
            i64 i = lane + 32 * k;
            keep[k] = i < vout ? g[i] : V();
        }
        double sa = 0.0, sg = 0.0;
#pragma unroll 4
        for (i64 i = lane; i < vin; i += 32) {
            V x = a[i];
            const T* e = reinterpret_cast<const T*>(&x);
#pragma unroll
            for (int w = 0; w < W; ++w) sa += (double)e[w] * (double)e[w];
        }
#pragma unroll
        for (int k = 0; k < PS_WKEEP; ++k) {
            const T* e = reinterpret_cast<const T*>(&keep[k]);
#pragma unroll
            for (int w = 0; w < W; ++w) sg += (double)e[w] * (double)e[w];  // zeros past the end
        }
        for (i64 i = lane + 32 * PS_WKEEP; i < vout; i += 32) {
            V x = g[i];
            const T* e = reinterpret_cast<const T*>(&x);
#pragma unroll
            for (int w = 0; w < W; ++w) sg += (double)e[w] * (double)e[w];
        }
        for (int o = 16; o > 0; o >>= 1) {
            sa += __shfl_xor_sync(0xffffffffu, sa, o);
            sg += __shfl_xor_sync(0xffffffffu, sg, o);
        }
        double sq = sa * sg;
        if (p.norms && lane == 0) reinterpret_cast<T*>(p.norms)[b] = (T)sq;
        if (p.gs) {
            T s = (T)clip_scale(sq, p.max_norm);
            V* gs = reinterpret_cast<V*>(p.gs) + b * vout;
#pragma unroll
            for (int k = 0; k < PS_WKEEP; ++k) {
                i64 i = lane + 32 * k;
                if (i < vout) {
                    V y = keep[k];
                    T* e = reinterpret_cast<T*>(&y);
#pragma unroll
                    for (int w = 0; w < W; ++w) e[w] *= s;
                    gs[i] = y;
                }
            }
            for (i64 i = lane + 32 * PS_WKEEP; i < vout; i += 32) {
                V y = g[i];
                T* e = reinterpret_cast<T*>(&y);
#pragma unroll
                for (int w = 0; w < W; ++w) e[w] *= s;
                gs[i] = y;
            }
        }
    }
}

// struct GramArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void ps_gram_dot(const GramArgs& p) {
    for (i64 b = blockIdx.x; b < p.batch; b += gridDim.x) {
        const T* x = reinterpret_cast<const T*>(p.ga) + b * p.tt;
        const T* y = reinterpret_cast<const T*>(p.gg) + b * p.tt;
        double acc = 0.0;
        for (i64 i = threadIdx.x; i < p.tt; i += blockDim.x) acc += (double)x[i] * (double)y[i];
        acc = block_reduce(acc, 0);
        if (threadIdx.x == 0) reinterpret_cast<T*>(p.norms)[b] = (T)acc;
    }
}

// struct ScaleRowsArgs: declared in src/cuda/optim.rs (kernel_args!), defined ahead of this source

template <typename T> __device__ void ps_scale_rows(const ScaleRowsArgs& p) {
    for (i64 b = blockIdx.x; b < p.batch; b += gridDim.x) {
        T s = (T)clip_scale((double)reinterpret_cast<const T*>(p.norms)[b], p.max_norm);
        const T* g = reinterpret_cast<const T*>(p.g) + b * p.per_sample;
        T* gs = reinterpret_cast<T*>(p.gs) + b * p.per_sample;
        for (i64 i = threadIdx.x; i < p.per_sample; i += blockDim.x) gs[i] = s * g[i];
    }
}

// ---------------------------------------------------------------- entry points
#define OPT_KERNELS(T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) mp_partials_##T(PartialArgs a) { mp_partials<T>(a); } \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) mp_start_##T(StartArgs a) { mp_start<T>(a); }       \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) mp_affine_##T(AffineArgs a) { mp_affine<T>(a); }    \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) eig_prepare_##T(EigPrepArgs a) { eig_prepare<T>(a); } \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) eig_scale_##T(EigScaleArgs a) { eig_scale<T>(a); }  \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) sym_mirror_##T(MirrorArgs a) { sym_mirror<T>(a); }  \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_norms_##T(NormArgs a) { ps_norms<T>(a); }        \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_gram_dot_##T(GramArgs a) { ps_gram_dot<T>(a); }  \
    extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_scale_rows_##T(ScaleRowsArgs a) { ps_scale_rows<T>(a); }

OPT_KERNELS(f32)
OPT_KERNELS(f64)

extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_outer_f32(OuterArgs a) { ps_outer<f32, float4>(a); }
extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_outer_f64(OuterArgs a) { ps_outer<f64, double2>(a); }
extern "C" __global__ void __launch_bounds__(PS_VEC_MAX_BLOCK) ps_norms_vec_f32(NormArgs a) { ps_norms_vec<f32, float4>(a); }
extern "C" __global__ void __launch_bounds__(PS_VEC_MAX_BLOCK) ps_norms_vec_f64(NormArgs a) { ps_norms_vec<f64, double2>(a); }
extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_norms_warp_f32(NormArgs a) { ps_norms_warp<f32, float4>(a); }
extern "C" __global__ void __launch_bounds__(FK_BLOCK) ps_norms_warp_f64(NormArgs a) { ps_norms_warp<f64, double2>(a); }
