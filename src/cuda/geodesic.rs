//! Launcher for `kernels/geodesic.cu` (stub).
use super::CudaDevice;
use crate::error::{FK_ERROR_UNSUPPORTED, Result};
use crate::ops::geodesic::{Job, Kind};
use crate::stream::Stream;

pub const MODULES: [(&str, fn() -> String); 0] = [];

pub fn run(_dev: &CudaDevice, _kind: Kind, _job: &Job, _stream: &Stream) -> Result<()> {
    crate::bail!(FK_ERROR_UNSUPPORTED, "not yet")
}
