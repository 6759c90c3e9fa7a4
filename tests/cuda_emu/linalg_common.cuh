// Stands in for kernels/common.cuh when kernels/linalg.cu is compiled by the host C++
// compiler (tests/cuda_emu/kron_emu.cpp, driven by the unit test
// `kron_kernel_in_the_cpu_emulator` of src/cuda/linalg/kron/tests.rs): the CUDA constructs of
// emu.cuh plus host versions of the element types and their arithmetic. f16 is
// GCC's _Float16 (round to nearest even, as __float2half_rn), bf16 a 16-bit pattern
// with round-to-nearest-even from f32 (as __float2bfloat16_rn).
// Every store of the Kronecker kernel checks its alignment (FK_CHECK_ALIGNED).
#pragma once
#include "emu.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define FK_CHECK_ALIGNED(ptr, bytes)                                                           \
    do {                                                                                       \
        if ((unsigned long long)(ptr) % (bytes) != 0) {                                        \
            std::fprintf(stderr, "misaligned %zu-byte store at %p\n", (size_t)(bytes), (void*)(ptr)); \
            std::abort();                                                                      \
        }                                                                                      \
    } while (0)

struct f16 {
    _Float16 v;
};
struct bf16 {
    unsigned short bits;
};
struct __align__(8) c64 { float re, im; };
struct __align__(16) c128 { double re, im; };

template <typename T> struct Compute { typedef T type; };
template <> struct Compute<f16> { typedef float type; };
template <> struct Compute<bf16> { typedef float type; };

inline float to_compute(f16 x) { return (float)x.v; }
inline float to_compute(bf16 x) {
    unsigned u = (unsigned)x.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float to_compute(f32 x) { return x; }
inline double to_compute(f64 x) { return x; }
inline c64 to_compute(c64 x) { return x; }
inline c128 to_compute(c128 x) { return x; }

template <typename T> inline T from_compute(typename Compute<T>::type x);
template <> inline f16 from_compute<f16>(float x) { return f16{(_Float16)x}; }
template <> inline bf16 from_compute<bf16>(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(unsigned short)(u >> 16)};
}
template <> inline f32 from_compute<f32>(float x) { return x; }
template <> inline f64 from_compute<f64>(double x) { return x; }
template <> inline c64 from_compute<c64>(c64 x) { return x; }
template <> inline c128 from_compute<c128>(c128 x) { return x; }

template <typename C> struct ComplexReal;
template <> struct ComplexReal<c64> { typedef float type; };
template <> struct ComplexReal<c128> { typedef double type; };
template <typename C> inline C cmake(typename ComplexReal<C>::type re, typename ComplexReal<C>::type im) {
    C z;
    z.re = re;
    z.im = im;
    return z;
}
template <typename C> inline C cmul(C a, C b) {
    return cmake<C>(a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re);
}
inline c64 operator*(c64 a, c64 b) { return cmul(a, b); }
inline c128 operator*(c128 a, c128 b) { return cmul(a, b); }
