// fusekit: the activations of the linear-algebra family (docs/ops.md section 2),
// shared by kernels/linalg.cu and kernels/mlp_fused.cu. Activation codes
// (FK_LA_ACT_*) and the tanh GELU's constants (FK_LA_GELU_*) come from the prelude
// fusekit prepends from the Rust enum and constants of src/ops/linalg.rs.
// GELU_TANH is the tanh approximation (cuBLASLt's formula), GELU_ERF the exact
// 0.5 z (1 + erf(z / sqrt 2)); src/cpu/linalg.rs computes the same.
#pragma once

#define GELU_C 0.7978845608028654f
#define GELU_A 0.044715f
#define INV_SQRT2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
static_assert(GELU_C == FK_LA_GELU_C && GELU_A == FK_LA_GELU_A,
              "the tanh GELU's constants are GELU_TANH_C and GELU_TANH_A of src/ops/linalg.rs");

__device__ __forceinline__ float gelu_tanh_f(float z) {
    float u = GELU_C * (z + GELU_A * z * z * z);
    return 0.5f * z * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad_f(float z) {
    float u = GELU_C * (z + GELU_A * z * z * z);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * z * z);
}
__device__ __forceinline__ float gelu_erf_f(float z) { return 0.5f * z * (1.0f + erff(z * INV_SQRT2)); }
// Phi(z) + z phi(z)
__device__ __forceinline__ float gelu_erf_grad_f(float z) {
    return 0.5f * (1.0f + erff(z * INV_SQRT2)) + z * INV_SQRT_2PI * expf(-0.5f * z * z);
}
__device__ __forceinline__ float act_f(int act, float z) {
    if (act == FK_LA_ACT_RELU) return z > 0.0f ? z : (z == z ? 0.0f : z);
    if (act == FK_LA_ACT_GELU_TANH) return gelu_tanh_f(z);
    if (act == FK_LA_ACT_GELU_ERF) return gelu_erf_f(z);
    return z;
}

// act'(z) times g; the ReLU's derivative from its output or its pre-activation
// (z > 0; 0 where NaN).
__device__ __forceinline__ float act_grad_f(int act, float z, float g) {
    if (act == FK_LA_ACT_RELU) return z > 0.0f ? g : 0.0f;
    if (act == FK_LA_ACT_GELU_TANH) return g * gelu_tanh_grad_f(z);
    if (act == FK_LA_ACT_GELU_ERF) return g * gelu_erf_grad_f(z);
    return g;
}
