// fusekit: types and helpers shared by every kernel module.
//
// Compiled by NVRTC (see src/cuda/nvrtc.rs); `#include "common.cuh"` lines are
// inlined by fusekit before compilation. Only CUDA's own headers are included.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef long long i64;
typedef unsigned long long u64;

typedef __half f16;
typedef __nv_bfloat16 bf16;
typedef float f32;
typedef double f64;

// Kernels launched as programmatic dependents (launch_ex(.., early = true)) call this
// before touching memory: it waits until the previous kernel on the stream has
// completed and its writes are visible (a no-op for ordinary launches and pre-sm_90).
__device__ __forceinline__ void fk_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct __align__(8) c64 { float re, im; };
struct __align__(16) c128 { double re, im; };

// Arithmetic type used for computing on a storage type (half types compute in f32).
template <typename T> struct Compute { typedef T type; };
template <> struct Compute<f16> { typedef float type; };
template <> struct Compute<bf16> { typedef float type; };

__device__ __forceinline__ float to_compute(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_compute(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_compute(f32 x) { return x; }
__device__ __forceinline__ double to_compute(f64 x) { return x; }
__device__ __forceinline__ c64 to_compute(c64 x) { return x; }
__device__ __forceinline__ c128 to_compute(c128 x) { return x; }

template <typename T> __device__ __forceinline__ T from_compute(typename Compute<T>::type x);
template <> __device__ __forceinline__ f16 from_compute<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_compute<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ f32 from_compute<f32>(float x) { return x; }
template <> __device__ __forceinline__ f64 from_compute<f64>(double x) { return x; }
template <> __device__ __forceinline__ c64 from_compute<c64>(c64 x) { return x; }
template <> __device__ __forceinline__ c128 from_compute<c128>(c128 x) { return x; }

// ---- complex arithmetic (the CPU backend uses the same formulas) ----
template <typename C> struct ComplexReal;
template <> struct ComplexReal<c64> { typedef float type; };
template <> struct ComplexReal<c128> { typedef double type; };

template <typename C> __device__ __forceinline__ C cmake(typename ComplexReal<C>::type re, typename ComplexReal<C>::type im) {
    C z; z.re = re; z.im = im; return z;
}
__device__ __forceinline__ c64 operator+(c64 a, c64 b) { return cmake<c64>(a.re + b.re, a.im + b.im); }
__device__ __forceinline__ c128 operator+(c128 a, c128 b) { return cmake<c128>(a.re + b.re, a.im + b.im); }
__device__ __forceinline__ c64 operator-(c64 a, c64 b) { return cmake<c64>(a.re - b.re, a.im - b.im); }
__device__ __forceinline__ c128 operator-(c128 a, c128 b) { return cmake<c128>(a.re - b.re, a.im - b.im); }
__device__ __forceinline__ c64 operator-(c64 a) { return cmake<c64>(-a.re, -a.im); }
__device__ __forceinline__ c128 operator-(c128 a) { return cmake<c128>(-a.re, -a.im); }
template <typename C> __device__ __forceinline__ C cmul(C a, C b) {
    return cmake<C>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
__device__ __forceinline__ c64 operator*(c64 a, c64 b) { return cmul(a, b); }
__device__ __forceinline__ c128 operator*(c128 a, c128 b) { return cmul(a, b); }
// Division scaled by |c| + |d| (as cuComplex's cuCdiv) to avoid overflow.
template <typename C> __device__ __forceinline__ C cdiv(C a, C b) {
    typedef typename ComplexReal<C>::type R;
    R s = fabs(b.re) + fabs(b.im);
    R oos = R(1) / s;
    R ars = a.re * oos, ais = a.im * oos;
    R brs = b.re * oos, bis = b.im * oos;
    R d = brs * brs + bis * bis;
    R ood = R(1) / d;
    return cmake<C>((ars * brs + ais * bis) * ood, (ais * brs - ars * bis) * ood);
}
__device__ __forceinline__ c64 operator/(c64 a, c64 b) { return cdiv(a, b); }
__device__ __forceinline__ c128 operator/(c128 a, c128 b) { return cdiv(a, b); }

// Loads/stores through generic element pointers.
template <typename T> __device__ __forceinline__ T ld(const char* base, i64 off) {
    return reinterpret_cast<const T*>(base)[off];
}
template <typename T> __device__ __forceinline__ void st(char* base, i64 off, T v) {
    reinterpret_cast<T*>(base)[off] = v;
}
