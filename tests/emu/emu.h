// A small CPU emulator of the CUDA subset that the geodesic kernels (kernels/geodesic/)
// use, to run them without a GPU (tests/emu/run.sh). Each CUDA thread of a block is a
// coroutine (ucontext) on one OS thread; `__syncthreads` and `__syncwarp` are
// scheduling points, and the scheduler runs the ready threads in a random order
// (seeded), so a missing barrier shows up as results that change with the seed.
// Blocks run one after another. Shared memory is poisoned (0xFF bytes: NaN) before
// every block.
//
// Named barriers (`bar.sync id, count`) release when `count` threads wait at `id`.
// Not emulated: warp-synchronous execution (none in these kernels beyond the
// collective mma and shuffle, emulated with warp barriers), the
// memory model beyond barriers, cp.async (a plain copy), PTX.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>
#include <ucontext.h>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__
#define __shared__ static

typedef long long i64;
typedef unsigned long long u64;
struct uint3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };

namespace emu {
extern uint3 threadIdx, blockIdx, gridDim, blockDim;
extern unsigned dyn_smem;
extern unsigned char* smem;
void sync_block();
void sync_warp();
void sync_bar(int id, int count);
[[noreturn]] void trap();
}  // namespace emu

using emu::threadIdx;
using emu::blockIdx;
using emu::gridDim;
using emu::blockDim;
using std::fma;
inline i64 min(i64 a, i64 b) { return a < b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp() { emu::sync_warp(); }
#define __trap() emu::trap()

// TF32 (the geodesic kernels call these where a GPU build uses PTX): cvt.rna.tf32.f32,
// and the warp-collective mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32 (D += A B; every
// lane of the warp must call it; operands' low 13 mantissa bits are ignored).
float geo_tf32(float x);
float geo_tf32_op(float x);  // + half a TF32 ulp on the bits (the mma drops the low bits)
void geo_split(float x, float& hi, float& lo);  // 3xTF32: hi exactly TF32 (+ 0x1000, low bits cleared), lo = geo_tf32_op(x - hi)
// bar.sync 1 + grp, GEO_NT (named barrier of one thread group)
inline void geo_group_sync(int grp) { emu::sync_bar(1 + grp, 256); }
void geo_mma_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]);

// __shfl_xor_sync over the full warp, warp-collective like the mma (every lane of the
// warp must call it): each lane publishes its value, then reads lane ^ mask's.
namespace emu {
extern double shfl_scratch[32][32];
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu::shfl_scratch[w][lane] = (double)v;
    emu::sync_warp();
    const T r = (T)emu::shfl_scratch[w][lane ^ mask];
    emu::sync_warp();  // every lane has read before the next shuffle overwrites
    return r;
}

namespace emu {
using KernelFn = void (*)(const void* args);
// Runs `fn` on a grid of `grid` blocks of `block` threads with `smem_bytes` of
// dynamic shared memory; `seed` picks the thread interleaving.
void launch(KernelFn fn, unsigned grid, unsigned block, unsigned smem_bytes, const void* args, unsigned seed);
}  // namespace emu
