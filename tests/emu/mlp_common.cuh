// Stands in for kernels/common.cuh when the fused MLP's module (kernels/mlp_fused.cu,
// as `kernel_source mlp_fused` prints it) is compiled by the host C++ compiler for
// the coroutine emulator (emu.h): host f16 / bf16 with the device's rounding, and the
// warp collectives the kernels call where a GPU build uses PTX: mma.sync
// m16n8k16 (f32 accumulation) and the 32-bit shuffle. Driven by the unit test
// `mlp_fused_kernels_in_the_cpu_emulator` (src/cuda/linalg/mlp_fused/tests.rs)
// through mlp_emu.cpp.
#pragma once
#include "emu.h"

#include <cstring>

#define __grid_constant__
#define MF_SMEM_DECL unsigned char* mf_smem = emu::smem;
#define MF_SHFL_XOR(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask))

typedef float f32;
typedef double f64;
// f16: GCC's _Float16 (round to nearest even, as __float2half_rn); bf16: the top
// 16 bits of an f32, rounded to nearest even (as __float2bfloat16_rn).
struct f16 {
    _Float16 v;
};
struct bf16 {
    unsigned short bits;
};

inline float to_compute(f16 x) { return (float)x.v; }
inline float to_compute(bf16 x) {
    unsigned u = (unsigned)x.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float to_compute(float x) { return x; }

template <typename T> inline T from_compute(float x);
template <> inline f16 from_compute<f16>(float x) { return f16{(_Float16)x}; }
template <> inline bf16 from_compute<bf16>(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(unsigned short)(u >> 16)};
}

inline unsigned short mf_bits(f16 x) {
    unsigned short b;
    std::memcpy(&b, &x.v, 2);
    return b;
}
inline unsigned short mf_bits(bf16 x) { return x.bits; }

namespace emu_mf {
template <typename T> inline float half_of(unsigned w, int hi) {
    T v;
    unsigned short b = (unsigned short)(hi ? w >> 16 : w & 0xffffu);
    std::memcpy(&v, &b, 2);
    return to_compute(v);
}
struct Scratch {
    unsigned a[32][4], b[32][2];
};
inline Scratch scratch[32];
}  // namespace emu_mf

// D += A B for one m16n8k16 tile, every lane of the warp calling it: A (16 x 16,
// row) lane 4(r % 8) + (k % 8) / 2, register (r / 8) + 2 (k / 8), half k % 2;
// B (16 x 8, col) lane 4 n + (k % 8) / 2, register k / 8, half k % 2; C (16 x 8)
// lane 4 (r % 8) + n / 2, register 2 (r / 8) + n % 2. Products of the exact
// half-precision values, summed in f32 as the hardware does (up to its order).
template <typename T> inline void mf_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    using namespace emu;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_mf::Scratch& sc = emu_mf::scratch[w];
    for (int e = 0; e < 4; ++e) sc.a[lane][e] = a[e];
    sc.b[lane][0] = b0;
    sc.b[lane][1] = b1;
    sync_warp();
    const int g = lane >> 2, t = lane & 3;
    float out[4];
    for (int e = 0; e < 4; ++e) {
        const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
        float acc = d[e];
        for (int k = 0; k < 16; ++k) {
            const float av = emu_mf::half_of<T>(sc.a[4 * (r % 8) + (k % 8) / 2][(r / 8) + 2 * (k / 8)], k % 2);
            const float bv = emu_mf::half_of<T>(sc.b[4 * n + (k % 8) / 2][k / 8], k % 2);
            acc += av * bv;
        }
        out[e] = acc;
    }
    sync_warp();  // every lane has read the scratch before the next mma reuses it
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}
