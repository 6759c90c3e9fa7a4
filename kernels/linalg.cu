// fusekit: kernels of the linear-algebra family (OPS.md section 4).
//
// The products themselves run in cuBLAS / cuBLASLt; these are the pieces around
// them:
//   linear_epilogue_<t>  y = act(y + b) in place (and aux = y + b): the fallback for
//                        configurations cuBLASLt's fused epilogues decline
//   linear_dz_<t>        dz = dy * act'(saved) and per-split column sums of dz
//   colsum_finish_<t>    db = sum of the column partials
//   kron_<t>             batched Kronecker product, 16-byte stores along rows
// Activation codes (FK_LA_ACT_*) come from the prelude fusekit prepends from the Rust
// enum in src/ops/linalg.rs. GELU is the tanh approximation (cuBLASLt's formula);
// src/cpu/linalg.rs computes the same in f32.
#include "common.cuh"

#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f

__device__ __forceinline__ float gelu_f(float z) {
    float u = GELU_C * (z + GELU_A * z * z * z);
    return 0.5f * z * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_grad_f(float z) {
    float u = GELU_C * (z + GELU_A * z * z * z);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * z * z);
}
__device__ __forceinline__ float act_f(int act, float z) {
    if (act == FK_LA_ACT_RELU) return z > 0.0f ? z : (z == z ? 0.0f : z);
    if (act == FK_LA_ACT_GELU) return gelu_f(z);
    return z;
}

// ---------------------------------------------------------------- epilogue fallback
struct EpiArgs {
    i64 m, n;
    u64 y, bias, aux;
    int act;
};

template <typename T> __device__ void linear_epilogue(const EpiArgs& a) {
    T* y = reinterpret_cast<T*>(a.y);
    const T* b = reinterpret_cast<const T*>(a.bias);
    T* aux = reinterpret_cast<T*>(a.aux);
    i64 total = a.m * a.n;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        float z = to_compute(y[i]);
        if (b) z += to_compute(b[i % a.n]);
        if (aux) aux[i] = from_compute<T>(z);
        y[i] = from_compute<T>(act_f(a.act, z));
    }
}

// ---------------------------------------------------------------- backward: dz, db
struct DzArgs {
    i64 m, n;
    i64 rows_per_split;
    u64 dy, saved, dz, partial;
    int act;
};

// block (32, 8): 32 columns, 8 row lanes; grid (ceil(n / 32), splits). Each block
// sums its rows of its 32 columns into partial[split, col] (f32).
template <typename T> __device__ void linear_dz(const DzArgs& a) {
    const T* dy = reinterpret_cast<const T*>(a.dy);
    const T* sv = reinterpret_cast<const T*>(a.saved);
    T* dz = reinterpret_cast<T*>(a.dz);
    float* partial = reinterpret_cast<float*>(a.partial);
    __shared__ float sh[8][33];
    i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
    i64 r0 = (i64)blockIdx.y * a.rows_per_split;
    i64 r1 = r0 + a.rows_per_split < a.m ? r0 + a.rows_per_split : a.m;
    float acc = 0.0f;
    if (col < a.n) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += 8) {
            i64 i = r * a.n + col;
            float g = to_compute(dy[i]);
            if (a.act == FK_LA_ACT_RELU) {
                g = to_compute(sv[i]) > 0.0f ? g : 0.0f;
            } else if (a.act == FK_LA_ACT_GELU) {
                g *= gelu_grad_f(to_compute(sv[i]));
            }
            if (dz) dz[i] = from_compute<T>(g);
            acc += g;
        }
    }
    if (!partial) return;
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < a.n) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s += sh[j][threadIdx.x];
        partial[(i64)blockIdx.y * a.n + col] = s;
    }
}

struct FinishArgs {
    i64 n, splits;
    u64 partial, out;
};

template <typename T> __device__ void colsum_finish(const FinishArgs& a) {
    const float* p = reinterpret_cast<const float*>(a.partial);
    T* out = reinterpret_cast<T*>(a.out);
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < a.n; c += (i64)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (i64 j = 0; j < a.splits; ++j) s += p[j * a.n + c];
        out[c] = from_compute<T>(s);
    }
}

// ---------------------------------------------------------------- Kronecker
struct KronArgs {
    i64 batch, m, n, p, q;
    i64 sa0, sa1, sa2, sb0, sb1, sb2;
    u64 a, b, out;
    int vec;
    int small;
};

template <typename T> struct __align__(16) Vec16 {
    T v[16 / sizeof(T)];
};

// out[bi, i*p + s, j*q + t] = a[bi, i, j] * b[bi, s, t]. Grid-stride over output
// rows (blockIdx.x) and column ranges (blockIdx.y); per-row index math once. With
// `vec` (q a multiple of the 16-byte vector, b's rows contiguous and aligned, out
// aligned) each thread stores 16 bytes at a time.
template <typename T> __device__ void kron(const KronArgs& a) {
    typedef typename Compute<T>::type C;
    const int V = 16 / sizeof(T);
    const char* A = reinterpret_cast<const char*>(a.a);
    const char* B = reinterpret_cast<const char*>(a.b);
    T* out = reinterpret_cast<T*>(a.out);
    i64 rows = a.batch * a.m * a.p;
    i64 cols = a.n * a.q;
    i64 units = a.vec ? cols / V : cols;
    i64 chunk = (units + gridDim.y - 1) / gridDim.y;
    i64 u0 = (i64)blockIdx.y * chunk;
    i64 u1 = u0 + chunk < units ? u0 + chunk : units;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 bi = row / (a.m * a.p);
        i64 r = row - bi * (a.m * a.p);
        i64 i = r / a.p, s = r - i * a.p;
        const T* arow = reinterpret_cast<const T*>(A) + bi * a.sa0 + i * a.sa1;
        const T* brow = reinterpret_cast<const T*>(B) + bi * a.sb0 + s * a.sb1;
        T* orow = out + row * cols;
        if (a.vec && a.small) {
            // 32-bit column arithmetic (n*q < 2^31): one cheap division per 16 bytes
            const unsigned q32 = (unsigned)a.q;
            for (unsigned u = (unsigned)u0 + threadIdx.x; u < (unsigned)u1; u += blockDim.x) {
                unsigned c = u * V;
                unsigned j = c / q32, t = c - j * q32;
                C x = to_compute(arow[(i64)j * a.sa2]);
                Vec16<T> bv = *reinterpret_cast<const Vec16<T>*>(brow + t);
                Vec16<T> o;
#pragma unroll
                for (int e = 0; e < V; ++e) o.v[e] = from_compute<T>(x * to_compute(bv.v[e]));
                *reinterpret_cast<Vec16<T>*>(orow + c) = o;
            }
        } else if (a.vec) {
            for (i64 u = u0 + threadIdx.x; u < u1; u += blockDim.x) {
                i64 c = u * V;
                i64 j = c / a.q, t = c - j * a.q;
                C x = to_compute(arow[j * a.sa2]);
                Vec16<T> bv = *reinterpret_cast<const Vec16<T>*>(brow + t);
                Vec16<T> o;
#pragma unroll
                for (int e = 0; e < V; ++e) o.v[e] = from_compute<T>(x * to_compute(bv.v[e]));
                *reinterpret_cast<Vec16<T>*>(orow + c) = o;
            }
        } else {
            for (i64 c = u0 + threadIdx.x; c < u1; c += blockDim.x) {
                i64 j = c / a.q, t = c - j * a.q;
                C x = to_compute(arow[j * a.sa2]);
                orow[c] = from_compute<T>(x * to_compute(brow[t * a.sb2]));
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

#define FK_KRON_KERNEL(T) \
    extern "C" __global__ void __launch_bounds__(256) kron_##T(KronArgs a) { kron<T>(a); }
FK_KRON_KERNEL(f16)
FK_KRON_KERNEL(bf16)
FK_KRON_KERNEL(f32)
FK_KRON_KERNEL(f64)
FK_KRON_KERNEL(c64)
FK_KRON_KERNEL(c128)
