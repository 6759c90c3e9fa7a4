// fusekit: the elementwise family (docs/ops.md section 1).
//
// One kernel per (arity, storage types, layout) and one module per dtype; the operation is a uniform
// run-time argument, dispatched once per thread outside the element loop. Op codes
// (FK_BIN_*, FK_UN_*) are defined by the prelude fusekit prepends from the Rust
// enums in src/ops/elementwise.rs, so the two sides cannot drift.
//
// Layouts: `contig` (every operand dense with the output's shape; 16-byte vector
// loads when all pointers are aligned) and `strided` (any strides, broadcasting
// through zero strides, dims coalesced on the host; 32- or 64-bit index math).
// Both are grid-stride loops with 64-bit element counts.
#include "common.cuh"

// FK_MAX_DIMS (the most dimensions of an operand, layout::FK_MAX_DIMS) and
// FK_EW_VEC_BYTES (the host's vector width) come from src/cuda/elementwise.rs,
// defined ahead of this source.
#if !defined(FK_MAX_DIMS) || !defined(FK_EW_VEC_BYTES)
#error "FK_MAX_DIMS and FK_EW_VEC_BYTES come from src/cuda/elementwise.rs (fusekit::cuda::modules() has the full source)"
#endif
// 16-byte vectors per thread per iteration of the contiguous loops (bytes in flight)
#define UNROLL 4

// EwArgs, the kernels' argument: declared in src/cuda/elementwise.rs (kernel_args!),
// its C definition ahead of this source.

// ---------------------------------------------------------------- functors
template <typename C> struct Scalars {
    C alpha, beta;
};
template <typename C> __device__ __forceinline__ C scalar_of(double re, double im);
template <> __device__ __forceinline__ float scalar_of<float>(double re, double) { return (float)re; }
template <> __device__ __forceinline__ double scalar_of<double>(double re, double) { return re; }
template <> __device__ __forceinline__ c64 scalar_of<c64>(double re, double im) { return cmake<c64>((float)re, (float)im); }
template <> __device__ __forceinline__ c128 scalar_of<c128>(double re, double im) { return cmake<c128>(re, im); }

template <int OP, typename C> struct Bin;
template <typename C> struct Bin<FK_BIN_ADD, C> { __device__ static C f(C a, C b, const Scalars<C>&) { return a + b; } };
template <typename C> struct Bin<FK_BIN_SUB, C> { __device__ static C f(C a, C b, const Scalars<C>&) { return a - b; } };
template <typename C> struct Bin<FK_BIN_MUL, C> { __device__ static C f(C a, C b, const Scalars<C>&) { return a * b; } };
template <typename C> struct Bin<FK_BIN_DIV, C> { __device__ static C f(C a, C b, const Scalars<C>&) { return a / b; } };
template <typename C> struct Bin<FK_BIN_AXPBY, C> {
    __device__ static C f(C a, C b, const Scalars<C>& s) { return s.alpha * a + s.beta * b; }
};

// real unary math
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }
__device__ __forceinline__ float m_cos(float x) { return cosf(x); }
__device__ __forceinline__ double m_cos(double x) { return cos(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double m_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
template <typename R> __device__ __forceinline__ R m_relu(R x) { return x > R(0) ? x : (x == x ? R(0) : x); }

// complex unary math (same formulas as src/cpu/elementwise.rs)
template <typename C> __device__ __forceinline__ typename ComplexReal<C>::type m_abs(C z) { return hypot(z.re, z.im); }
__device__ __forceinline__ float m_abs(c64 z) { return hypotf(z.re, z.im); }
template <typename C> __device__ __forceinline__ C m_exp(C z) {
    typename ComplexReal<C>::type e = m_exp(z.re);
    return cmake<C>(e * m_cos(z.im), e * m_sin(z.im));
}
template <typename C> __device__ __forceinline__ C m_log(C z) {
    return cmake<C>(m_log(m_abs(z)), atan2(z.im, z.re));
}
template <typename C> __device__ __forceinline__ C m_sqrt(C z) {
    typedef typename ComplexReal<C>::type R;
    R r = m_abs(z);
    if (r == R(0)) return cmake<C>(R(0), z.im);
    R t = m_sqrt((r + m_abs(z.re)) * R(0.5));
    if (z.re >= R(0)) return cmake<C>(t, z.im / (R(2) * t));
    return cmake<C>(m_abs(z.im) / (R(2) * t), copysign(t, z.im));
}
template <typename C> __device__ __forceinline__ C m_sin(C z) {
    return cmake<C>(m_sin(z.re) * cosh(z.im), m_cos(z.re) * sinh(z.im));
}
template <typename C> __device__ __forceinline__ C m_cos(C z) {
    return cmake<C>(m_cos(z.re) * cosh(z.im), -m_sin(z.re) * sinh(z.im));
}
// Kahan's formula (no cancellation near the poles, where cosh 2x + cos 2y -> 0).
template <typename C> __device__ __forceinline__ C m_tanh(C z) {
    typedef typename ComplexReal<C>::type R;
    if (m_abs(z.re) > R(22)) {
        R e = exp(R(-2) * m_abs(z.re));
        return cmake<C>(copysign(R(1), z.re), R(4) * m_sin(z.im) * m_cos(z.im) * e);
    }
    R t = tan(z.im);
    R b = R(1) + t * t;
    R s = sinh(z.re);
    R r = m_sqrt(R(1) + s * s);
    R d = R(1) + b * s * s;
    return cmake<C>(b * r * s / d, t / d);
}
template <typename C> __device__ __forceinline__ C m_sigmoid(C z) {
    typedef typename ComplexReal<C>::type R;
    return cmake<C>(R(1), R(0)) / (cmake<C>(R(1), R(0)) + m_exp(-z));
}

// Unary functors map compute type C to output compute type D.
template <int OP, typename C, typename D> struct Un;
#define FK_UN_SAME(OPC, EXPR) \
    template <typename C> struct Un<OPC, C, C> { __device__ static C f(C x, const Scalars<C>& s) { return EXPR; } };
FK_UN_SAME(FK_UN_NEG, -x)
FK_UN_SAME(FK_UN_EXP, m_exp(x))
FK_UN_SAME(FK_UN_LOG, m_log(x))
FK_UN_SAME(FK_UN_SQRT, m_sqrt(x))
FK_UN_SAME(FK_UN_SIN, m_sin(x))
FK_UN_SAME(FK_UN_COS, m_cos(x))
FK_UN_SAME(FK_UN_TANH, m_tanh(x))
FK_UN_SAME(FK_UN_SIGMOID, m_sigmoid(x))
FK_UN_SAME(FK_UN_RELU, m_relu(x))
FK_UN_SAME(FK_UN_SCALAR_ADD, x + s.alpha)
FK_UN_SAME(FK_UN_SCALAR_MUL, x * s.alpha)
FK_UN_SAME(FK_UN_COPY, x)
template <typename C> struct Un<FK_UN_ABS, C, C> { __device__ static C f(C x, const Scalars<C>&) { return m_abs(x); } };
// complex -> real magnitude
template <> struct Un<FK_UN_ABS, c64, float> { __device__ static float f(c64 x, const Scalars<c64>&) { return m_abs(x); } };
template <> struct Un<FK_UN_ABS, c128, double> { __device__ static double f(c128 x, const Scalars<c128>&) { return m_abs(x); } };

// ---------------------------------------------------------------- layouts
template <typename T> struct __align__(16) Vec16 {
    enum { N = (16 / sizeof(T)) > 0 ? (16 / sizeof(T)) : 1 };
    T v[N];
};
static_assert(sizeof(Vec16<f16>) == FK_EW_VEC_BYTES && sizeof(Vec16<c128>) == FK_EW_VEC_BYTES,
              "FK_EW_VEC_BYTES (src/cuda/elementwise.rs VEC_BYTES): the host's alignment and work-item width");

__device__ __forceinline__ i64 grid_stride() { return (i64)gridDim.x * blockDim.x; }
__device__ __forceinline__ i64 thread_index() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }

// Offsets of linear index `i` in each operand (row-major over args.shape).
// Offsets in each operand of row `i` over the outer dims [0, g.ndim - 1) (row-major).
// I: index type (unsigned 32 or signed 64 bit); O: offset type (int or i64). The
// host picks 32-bit only when every index and offset fits.
template <typename I, typename O, int NOPS>
__device__ __forceinline__ void row_offsets(const EwArgs& g, I i, O* off) {
    O o0 = 0, o1 = 0, o2 = 0;
#pragma unroll
    for (int d = FK_MAX_DIMS - 2; d >= 0; --d) {
        if (d < g.ndim - 1) {
            I ext = (I)g.shape[d];
            I q = i / ext;
            I c = i - q * ext;
            i = q;
            o0 += (O)c * (O)g.so[d];
            if (NOPS > 1) o1 += (O)c * (O)g.sa[d];
            if (NOPS > 2) o2 += (O)c * (O)g.sb[d];
        }
    }
    off[0] = o0;
    if (NOPS > 1) off[1] = o1;
    if (NOPS > 2) off[2] = o2;
}

// Loads N consecutive elements along the innermost dim starting at element `off`
// with inner stride `s`: one 16-byte load when `vec` (s == 1, aligned), one scalar
// load broadcast when s == 0, else N strided loads (`n_valid` bounds the tail).
template <typename T>
__device__ __forceinline__ Vec16<T> load_run(const char* base, i64 off, i64 s, bool vec, int n_valid) {
    Vec16<T> v;
    if (vec && s == 1) {
        v = *reinterpret_cast<const Vec16<T>*>(base + off * (i64)sizeof(T));
    } else if (s == 0) {
        T x = ld<T>(base, off);
#pragma unroll
        for (int k = 0; k < Vec16<T>::N; ++k) v.v[k] = x;
    } else {
#pragma unroll
        for (int k = 0; k < Vec16<T>::N; ++k)
            if (k < n_valid) v.v[k] = ld<T>(base, off + k * s);
    }
    return v;
}

template <typename T>
__device__ __forceinline__ void store_run(char* base, i64 off, i64 s, bool vec, int n_valid, const Vec16<T>& v) {
    if (vec) {
        *reinterpret_cast<Vec16<T>*>(base + off * (i64)sizeof(T)) = v;
    } else {
#pragma unroll
        for (int k = 0; k < Vec16<T>::N; ++k)
            if (k < n_valid) st<T>(base, off + k * s, v.v[k]);
    }
}

template <int OP, typename T>
__device__ void binary_contig(const EwArgs& g) {
    typedef typename Compute<T>::type C;
    Scalars<C> s = {scalar_of<C>(g.alpha_re, g.alpha_im), scalar_of<C>(g.beta_re, g.beta_im)};
    const char* a = (const char*)g.a;
    const char* b = (const char*)g.b;
    char* o = (char*)g.out;
    i64 start = 0;
    if (g.vec_ok) {
        typedef Vec16<T> V;
        i64 nv = g.n / V::N;
        const V* av = (const V*)a;
        const V* bv = (const V*)b;
        V* ov = (V*)o;
        const i64 gs = grid_stride();
        i64 i = thread_index();
        // UNROLL independent 16-byte loads of each input in flight per thread
        for (; i + (UNROLL - 1) * gs < nv; i += UNROLL * gs) {
            V x[UNROLL], y[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                x[u] = av[i + u * gs];
                y[u] = bv[i + u * gs];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                V z;
#pragma unroll
                for (int k = 0; k < V::N; ++k)
                    z.v[k] = from_compute<T>(Bin<OP, C>::f(to_compute(x[u].v[k]), to_compute(y[u].v[k]), s));
                ov[i + u * gs] = z;
            }
        }
        for (; i < nv; i += gs) {
            V x = av[i], y = bv[i], z;
#pragma unroll
            for (int k = 0; k < V::N; ++k)
                z.v[k] = from_compute<T>(Bin<OP, C>::f(to_compute(x.v[k]), to_compute(y.v[k]), s));
            ov[i] = z;
        }
        start = nv * V::N;
    }
    for (i64 i = start + thread_index(); i < g.n; i += grid_stride()) {
        T r = from_compute<T>(Bin<OP, C>::f(to_compute(ld<T>(a, i)), to_compute(ld<T>(b, i)), s));
        st<T>(o, i, r);
    }
}

// Strided layout: each work item is a run of N = 16/sizeof(T) consecutive elements
// along the innermost dim of one row, so index arithmetic is paid once per run
// and, when the host found the runs aligned and dense (`vec_ok`), moves 16 bytes.
template <int OP, typename T, typename I, typename O>
__device__ void binary_strided(const EwArgs& g) {
    typedef typename Compute<T>::type C;
    enum { N = Vec16<T>::N };
    Scalars<C> s = {scalar_of<C>(g.alpha_re, g.alpha_im), scalar_of<C>(g.beta_re, g.beta_im)};
    const char* a = (const char*)g.a;
    const char* b = (const char*)g.b;
    char* o = (char*)g.out;
    const int last = g.ndim - 1;
    const i64 inner = g.shape[last];
    const i64 runs = (inner + N - 1) / N;
    const i64 items = (g.n / inner) * runs;
    const i64 so = g.so[last], sa = g.sa[last], sb = g.sb[last];
    for (i64 it = thread_index(); it < items; it += grid_stride()) {
        I row = (I)it / (I)runs;
        I c = (I)it - row * (I)runs;
        O off[3];
        row_offsets<I, O, 3>(g, row, off);
        i64 col = (i64)c * N;
        int valid = (int)min((i64)N, inner - col);
        bool vec = g.vec_ok && valid == N;
        Vec16<T> x = load_run<T>(a, (i64)off[1] + col * sa, sa, vec, valid);
        Vec16<T> y = load_run<T>(b, (i64)off[2] + col * sb, sb, vec, valid);
        Vec16<T> z;
#pragma unroll
        for (int k = 0; k < N; ++k) z.v[k] = from_compute<T>(Bin<OP, C>::f(to_compute(x.v[k]), to_compute(y.v[k]), s));
        store_run<T>(o, (i64)off[0] + col * so, so, vec, valid, z);
    }
}

template <int OP, typename T, typename U>
__device__ void unary_contig(const EwArgs& g) {
    typedef typename Compute<T>::type C;
    typedef typename Compute<U>::type D;
    Scalars<C> s = {scalar_of<C>(g.alpha_re, g.alpha_im), scalar_of<C>(g.beta_re, g.beta_im)};
    const char* a = (const char*)g.a;
    char* o = (char*)g.out;
    i64 start = 0;
    if constexpr (sizeof(T) == sizeof(U)) if (g.vec_ok) {
        typedef Vec16<T> V;
        typedef Vec16<U> W;
        i64 nv = g.n / V::N;
        const V* av = (const V*)a;
        W* ov = (W*)o;
        const i64 gs = grid_stride();
        i64 i = thread_index();
        for (; i + (UNROLL - 1) * gs < nv; i += UNROLL * gs) {
            V x[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) x[u] = av[i + u * gs];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                W z;
#pragma unroll
                for (int k = 0; k < V::N; ++k) z.v[k] = from_compute<U>(Un<OP, C, D>::f(to_compute(x[u].v[k]), s));
                ov[i + u * gs] = z;
            }
        }
        for (; i < nv; i += gs) {
            V x = av[i];
            W z;
#pragma unroll
            for (int k = 0; k < V::N; ++k) z.v[k] = from_compute<U>(Un<OP, C, D>::f(to_compute(x.v[k]), s));
            ov[i] = z;
        }
        start = nv * V::N;
    }
    for (i64 i = start + thread_index(); i < g.n; i += grid_stride())
        st<U>(o, i, from_compute<U>(Un<OP, C, D>::f(to_compute(ld<T>(a, i)), s)));
}

template <int OP, typename T, typename U, typename I, typename O>
__device__ void unary_strided(const EwArgs& g) {
    typedef typename Compute<T>::type C;
    typedef typename Compute<U>::type D;
    enum { N = Vec16<T>::N };
    Scalars<C> s = {scalar_of<C>(g.alpha_re, g.alpha_im), scalar_of<C>(g.beta_re, g.beta_im)};
    const char* a = (const char*)g.a;
    char* o = (char*)g.out;
    const int last = g.ndim - 1;
    const i64 inner = g.shape[last];
    const i64 runs = (inner + N - 1) / N;
    const i64 items = (g.n / inner) * runs;
    const i64 so = g.so[last], sa = g.sa[last];
    for (i64 it = thread_index(); it < items; it += grid_stride()) {
        I row = (I)it / (I)runs;
        I c = (I)it - row * (I)runs;
        O off[2];
        row_offsets<I, O, 2>(g, row, off);
        i64 col = (i64)c * N;
        int valid = (int)min((i64)N, inner - col);
        bool vec = g.vec_ok && valid == N;
        Vec16<T> x = load_run<T>(a, (i64)off[1] + col * sa, sa, vec, valid);
        if constexpr (sizeof(T) == sizeof(U)) {
            Vec16<U> z;
#pragma unroll
            for (int k = 0; k < N; ++k) z.v[k] = from_compute<U>(Un<OP, C, D>::f(to_compute(x.v[k]), s));
            store_run<U>(o, (i64)off[0] + col * so, so, vec, valid, z);
        } else {
#pragma unroll
            for (int k = 0; k < N; ++k)
                if (k < valid) st<U>(o, (i64)off[0] + (col + k) * so, from_compute<U>(Un<OP, C, D>::f(to_compute(x.v[k]), s)));
        }
    }
}

// ---------------------------------------------------------------- entry points
template <int OP, typename T>
__device__ __forceinline__ void binary_layout(const EwArgs& g, bool strided) {
    if (!strided) binary_contig<OP, T>(g);
    else if (g.small_index) binary_strided<OP, T, unsigned int, int>(g);
    else binary_strided<OP, T, i64, i64>(g);
}

template <int OP, typename T, typename U>
__device__ __forceinline__ void unary_layout(const EwArgs& g, bool strided) {
    if (!strided) unary_contig<OP, T, U>(g);
    else if (g.small_index) unary_strided<OP, T, U, unsigned int, int>(g);
    else unary_strided<OP, T, U, i64, i64>(g);
}

template <typename T>
__device__ void binary_dispatch(const EwArgs& g, bool strided) {
    switch (g.op) {
        case FK_BIN_ADD: binary_layout<FK_BIN_ADD, T>(g, strided); break;
        case FK_BIN_SUB: binary_layout<FK_BIN_SUB, T>(g, strided); break;
        case FK_BIN_MUL: binary_layout<FK_BIN_MUL, T>(g, strided); break;
        case FK_BIN_DIV: binary_layout<FK_BIN_DIV, T>(g, strided); break;
        case FK_BIN_AXPBY: binary_layout<FK_BIN_AXPBY, T>(g, strided); break;
    }
}

// Same-type unary ops; complex types exclude RELU (the host refuses it).
template <typename T, bool COMPLEX>
__device__ void unary_dispatch(const EwArgs& g, bool strided) {
    switch (g.op) {
        case FK_UN_NEG: unary_layout<FK_UN_NEG, T, T>(g, strided); break;
        case FK_UN_EXP: unary_layout<FK_UN_EXP, T, T>(g, strided); break;
        case FK_UN_LOG: unary_layout<FK_UN_LOG, T, T>(g, strided); break;
        case FK_UN_SQRT: unary_layout<FK_UN_SQRT, T, T>(g, strided); break;
        case FK_UN_SIN: unary_layout<FK_UN_SIN, T, T>(g, strided); break;
        case FK_UN_COS: unary_layout<FK_UN_COS, T, T>(g, strided); break;
        case FK_UN_TANH: unary_layout<FK_UN_TANH, T, T>(g, strided); break;
        case FK_UN_SIGMOID: unary_layout<FK_UN_SIGMOID, T, T>(g, strided); break;
        case FK_UN_SCALAR_ADD: unary_layout<FK_UN_SCALAR_ADD, T, T>(g, strided); break;
        case FK_UN_SCALAR_MUL: unary_layout<FK_UN_SCALAR_MUL, T, T>(g, strided); break;
        case FK_UN_COPY: unary_layout<FK_UN_COPY, T, T>(g, strided); break;
        default:
            if constexpr (!COMPLEX) {
                if (g.op == FK_UN_ABS) unary_layout<FK_UN_ABS, T, T>(g, strided);
                else if (g.op == FK_UN_RELU) unary_layout<FK_UN_RELU, T, T>(g, strided);
            }
            break;
    }
}

#define FK_EW_REAL(NAME, T)                                                                              \
    extern "C" __global__ void ew_binary_contig_##NAME(const EwArgs g) { binary_dispatch<T>(g, false); }  \
    extern "C" __global__ void ew_binary_strided_##NAME(const EwArgs g) { binary_dispatch<T>(g, true); }  \
    extern "C" __global__ void ew_unary_contig_##NAME(const EwArgs g) { unary_dispatch<T, false>(g, false); } \
    extern "C" __global__ void ew_unary_strided_##NAME(const EwArgs g) { unary_dispatch<T, false>(g, true); }
#define FK_EW_COMPLEX(NAME, T, R)                                                                        \
    extern "C" __global__ void ew_binary_contig_##NAME(const EwArgs g) { binary_dispatch<T>(g, false); }  \
    extern "C" __global__ void ew_binary_strided_##NAME(const EwArgs g) { binary_dispatch<T>(g, true); }  \
    extern "C" __global__ void ew_unary_contig_##NAME(const EwArgs g) { unary_dispatch<T, true>(g, false); } \
    extern "C" __global__ void ew_unary_strided_##NAME(const EwArgs g) { unary_dispatch<T, true>(g, true); } \
    extern "C" __global__ void ew_abs_contig_##NAME(const EwArgs g) { unary_layout<FK_UN_ABS, T, R>(g, false); } \
    extern "C" __global__ void ew_abs_strided_##NAME(const EwArgs g) { unary_layout<FK_UN_ABS, T, R>(g, true); }

// Each element type is its own module (elementwise_<dtype>), so a program pays
// NVRTC only for the types it uses; the host defines FK_EW_<dtype>.
#if defined(FK_EW_f16)
FK_EW_REAL(f16, f16)
#elif defined(FK_EW_bf16)
FK_EW_REAL(bf16, bf16)
#elif defined(FK_EW_f32)
FK_EW_REAL(f32, f32)
#elif defined(FK_EW_f64)
FK_EW_REAL(f64, f64)
#elif defined(FK_EW_c64)
FK_EW_COMPLEX(c64, c64, f32)
#elif defined(FK_EW_c128)
FK_EW_COMPLEX(c128, c128, f64)
#endif
