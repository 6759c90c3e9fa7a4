//! Launchers of the linear-algebra family (stub while the CPU path lands).
use super::CudaDevice;
use crate::error::{FK_ERROR_UNSUPPORTED, Result};
use crate::ops::linalg::{GemmPlan, KronPlan, LinearBwdPlan, LinearPlan};
use crate::stream::Stream;

pub const MODULES: [(&str, fn() -> String); 0] = [];

pub fn gemm(_: &CudaDevice, _: &GemmPlan, _: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "todo")
}
pub fn gemm_chunked(_: &CudaDevice, _: &GemmPlan, _: u64, _: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "todo")
}
pub fn linear_forward(_: &CudaDevice, _: &LinearPlan, _: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "todo")
}
pub fn linear_backward(_: &CudaDevice, _: &LinearBwdPlan, _: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "todo")
}
pub fn kron(_: &CudaDevice, _: &KronPlan, _: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "todo")
}
