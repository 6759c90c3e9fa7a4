// Host emulation of the CUDA constructs kernels/gaussian.cu uses, so that the kernel
// source itself can be compiled by g++ and executed on the CPU: one std::thread per
// CUDA thread of a block (blocks run one after another), __syncthreads as a block
// barrier, warp shuffles through a per-warp exchange buffer and barrier.
// Stands in for kernels/common.cuh: run.sh copies it as common.cuh next to a copy
// of the kernel source.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

typedef long long i64;
typedef unsigned long long u64;
typedef float f32;
typedef double f64;

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

using std::fma;
using std::exp2;
template <typename A, typename B> inline auto min(A a, B b) { return a < b ? a : b; }

struct Dim3 { unsigned x = 1, y = 1, z = 1; };
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 blockDim, gridDim;

struct Emu {
    std::barrier<>* block = nullptr;
    std::vector<std::barrier<>*> warps;
    std::vector<double> xchg;   // one slot per thread
};
inline Emu emu;

inline void __syncthreads() { emu.block->arrive_and_wait(); }

template <typename T> inline T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
    emu.warps[w]->arrive_and_wait();
    emu.xchg[t] = (double)v;
    emu.warps[w]->arrive_and_wait();
    T r = (T)emu.xchg[w * 32 + (lane ^ o)];
    return r;
}
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }

// Runs `kernel(args)` over the grid, blocks in order, each with `threads` threads.
template <typename A>
void emu_launch(void (*kernel)(const A), Dim3 grid, unsigned threads, const A& args) {
    gridDim = grid;
    blockDim = Dim3{threads, 1, 1};
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::barrier<> block(threads);
            std::vector<std::barrier<>*> warps;
            for (unsigned w = 0; w < threads / 32; ++w) warps.push_back(new std::barrier<>(32));
            emu.block = &block;
            emu.warps = warps;
            emu.xchg.assign(threads, 0.0);
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = Dim3{t, 0, 0};
                    blockIdx = Dim3{bx, by, 0};
                    kernel(args);
                });
            for (auto& th : ts) th.join();
            for (auto* w : warps) delete w;
        }
}
