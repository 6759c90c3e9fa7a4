//! Streams: an ordered queue of work on one device.
//!
//! On CUDA a stream is either owned (created and destroyed by fusekit) or borrowed
//! (a caller's `CUstream`, e.g. PyTorch's current stream, which fusekit never
//! destroys). On the CPU backend every operation runs to completion inside the
//! call, so work on a stream is trivially in order and `synchronize` is a no-op.

use std::sync::Arc;

use crate::context::{Context, Device};
use crate::error::{FK_ERROR_DEVICE_MISMATCH, FK_ERROR_UNSUPPORTED, Result};

pub struct Stream {
    pub ctx: Arc<Context>,
    /// The raw `CUstream` (0 = the legacy default stream); 0 on the CPU.
    pub raw: usize,
    pub owned: bool,
}

impl Stream {
    pub fn create(ctx: &Arc<Context>) -> Result<Arc<Stream>> {
        let raw = match &ctx.cuda {
            None => 0,
            Some(d) => d.stream_create()?,
        };
        Ok(Arc::new(Stream {
            ctx: ctx.clone(),
            raw,
            owned: ctx.cuda.is_some(),
        }))
    }

    /// Wraps a caller's `CUstream` without taking ownership. NULL (0) is the legacy
    /// default stream. Not available on a CPU context.
    pub fn wrap(ctx: &Arc<Context>, raw: usize) -> Result<Arc<Stream>> {
        crate::ensure!(
            ctx.cuda.is_some(),
            FK_ERROR_UNSUPPORTED,
            "cannot wrap a CUstream on a CPU context"
        );
        Ok(Arc::new(Stream {
            ctx: ctx.clone(),
            raw,
            owned: false,
        }))
    }

    /// The stream used when the caller passes NULL: the legacy default stream on
    /// CUDA (which orders with every blocking stream), immediate execution on CPU.
    pub fn default_for(ctx: &Arc<Context>) -> Arc<Stream> {
        Arc::new(Stream {
            ctx: ctx.clone(),
            raw: 0,
            owned: false,
        })
    }

    pub fn device(&self) -> Device {
        self.ctx.device
    }

    pub fn synchronize(&self) -> Result<()> {
        match &self.ctx.cuda {
            None => Ok(()),
            Some(d) => d.stream_synchronize(self.raw),
        }
    }

    /// Checks that this stream belongs to `device`; `what` names the operation.
    pub fn check_device(&self, device: Device) -> Result<()> {
        crate::ensure!(
            self.ctx.device == device,
            FK_ERROR_DEVICE_MISMATCH,
            "stream is on {} but the buffers are on {device}",
            self.ctx.device
        );
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            if let Some(d) = &self.ctx.cuda {
                d.stream_destroy(self.raw);
            }
        }
    }
}
