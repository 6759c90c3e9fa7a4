//! Internals the integration tests, benches and examples call (not part of the
//! C ABI, no stability promise): the CPU's GELU formulas, the kernel modules and
//! the NVRTC compiler, the loaded cuBLAS pair.

pub use crate::cpu::linalg::{gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad};
pub use crate::cuda::modules;
pub use crate::gpu::cublas::{loaded_pair, lt_declines_on_this_thread};
pub use crate::gpu::nvrtc::{
    compile, cuda_include_dir, expand_source, load_nvrtc, nvrtc_version, store_prebuilt,
};

/// The unit tests' pseudo-random numbers: Knuth's MMIX linear congruential
/// generator, the same sequence for a seed on every machine.
#[cfg(test)]
pub(crate) struct Lcg(pub(crate) u64);

#[cfg(test)]
impl Lcg {
    /// The next state.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0
    }

    /// Uniform in `[0, 1)`: the state's top 53 bits.
    pub(crate) fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, 1)` in f32: the state's top 24 bits.
    pub(crate) fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}
