// The FP32 FFMA ceiling of the GPU: every thread runs N independent FMA chains in
// registers (no memory traffic), at several chain counts and blocks per SM; the best
// figure is the rate the geodesic docs compare the strict kernels against.
//   nvcc -O3 -arch=sm_90 benches/peak_ffma.cu -o /tmp/peak_ffma && /tmp/peak_ffma
// (scripts/gpu_suite.sh step peak_ffma, where nvcc is on the PATH)
#include <cstdio>
#include <cuda_runtime.h>

template <int N>
__global__ void __launch_bounds__(256) ffma(float* out, int iters, float a, float b) {
    float x[N];
#pragma unroll
    for (int k = 0; k < N; ++k) x[k] = threadIdx.x * 1e-7f + k;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int k = 0; k < N; ++k) x[k] = fmaf(x[k], a, b);
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) s += x[k];
    if (s == 12345.f) out[0] = s;  // keeps the chains alive
}

static bool ok(cudaError_t e) {
    if (e != cudaSuccess) fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess;
}

template <int N> static double run(int blocks_per_sm, int sms, float* out) {
    const int iters = 20000, grid = sms * blocks_per_sm;
    ffma<N><<<grid, 256>>>(out, 1000, 0.999999f, 1e-7f);  // warm-up (clocks up)
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int r = 0; r < 5; ++r) {
        cudaEventRecord(e0);
        ffma<N><<<grid, 256>>>(out, iters, 0.999999f, 1e-7f);
        cudaEventRecord(e1);
        if (!ok(cudaEventSynchronize(e1))) return 0;
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (ms < best) best = ms;
    }
    const double tflops = 2.0 * N * (double)iters * grid * 256 / best * 1e-9;
    printf("chains %2d, %d blocks of 256 per SM: %.1f TFLOP/s (%.3f ms)\n", N, blocks_per_sm, tflops, best);
    return tflops;
}

int main() {
    int sms = 0, clk = 0;
    if (!ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0))) return 1;
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    printf("%d SMs, max clock %d MHz: %.1f TFLOP/s at that clock (128 FP32 lanes per SM)\n", sms, clk / 1000,
           sms * 128 * 2.0 * clk * 1e-9);
    float* out;
    if (!ok(cudaMalloc(&out, 4))) return 1;
    double best = 0, r;
    if ((r = run<8>(1, sms, out)) > best) best = r;
    if ((r = run<8>(2, sms, out)) > best) best = r;
    if ((r = run<16>(2, sms, out)) > best) best = r;
    if ((r = run<16>(4, sms, out)) > best) best = r;
    if ((r = run<32>(2, sms, out)) > best) best = r;
    printf("FFMA peak: %.1f TFLOP/s\n", best);
    cudaFree(out);
    return best > 0 ? 0 : 1;
}
