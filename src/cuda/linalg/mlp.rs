//! The multi-layer perceptron on CUDA: not implemented yet (the CPU backend is).

use crate::cuda::CudaDevice;
use crate::error::{FK_ERROR_UNSUPPORTED, Result};
use crate::ops::Addr;
use crate::ops::mlp::MlpPlan;
use crate::stream::Stream;

fn unsupported() -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "the MLP ops have no CUDA backend yet")
}

pub fn mlp_forward(_dev: &CudaDevice, _p: &MlpPlan, _stream: &Stream) -> Result<()> {
    unsupported()
}

pub fn mlp_backward(_dev: &CudaDevice, _p: &MlpPlan, _stream: &Stream) -> Result<()> {
    unsupported()
}

pub fn mlp_zero(_dev: &CudaDevice, _a: Option<Addr>, _bytes: usize, _stream: &Stream) -> Result<()> {
    unsupported()
}
