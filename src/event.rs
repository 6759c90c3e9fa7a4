//! Events: markers recorded on a stream, for ordering between streams (and devices)
//! and for timing.
//!
//! On CUDA an event is a `CUevent` of the context's device (timing enabled). On the
//! CPU backend every op runs to completion inside its call, so an event is a host
//! timestamp taken when it is recorded: it is complete at once, waiting on it is a
//! no-op, and the elapsed time between two events is the host time between their
//! records (so events recorded in order give a non-negative time).
//!
//! Mixed cases: a CUDA stream waiting on a CPU event does nothing (the event is
//! already complete); a CPU stream waiting on a CUDA event blocks the host until
//! the event completes (that is the only way a CPU op can be ordered after it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::context::Context;
use crate::error::{FK_ERROR_DEVICE_MISMATCH, FK_ERROR_INVALID_ARGUMENT, Result, lock};
use crate::gpu::runtime::RawEvent;
use crate::stream::Stream;

pub struct Event {
    pub ctx: Arc<Context>,
    /// The `CUevent` (0 on the CPU).
    raw: RawEvent,
    /// The host time of the last record (CPU backend).
    stamp: Mutex<Option<Instant>>,
    recorded: AtomicBool,
}

impl Event {
    pub fn create(ctx: &Arc<Context>) -> Result<Event> {
        let raw = match &ctx.cuda {
            None => 0,
            Some(d) => d.event_create()?,
        };
        Ok(Event {
            ctx: ctx.clone(),
            raw,
            stamp: Mutex::new(None),
            recorded: AtomicBool::new(false),
        })
    }

    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire)
    }

    /// Records the event on `stream`, which must belong to the event's device.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        crate::ensure!(
            stream.ctx.device == self.ctx.device,
            FK_ERROR_DEVICE_MISMATCH,
            "stream is on {} but the event belongs to {}",
            stream.ctx.device,
            self.ctx.device
        );
        match &self.ctx.cuda {
            None => *lock(&self.stamp) = Some(Instant::now()),
            Some(d) => d.event_record(self.raw, stream.raw)?,
        }
        self.recorded.store(true, Ordering::Release);
        Ok(())
    }

    /// Makes later work on `stream` wait until the event's work is done (see the
    /// module notes for CPU and mixed cases). An event never recorded is complete.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        if !self.is_recorded() {
            return Ok(());
        }
        match (&stream.ctx.cuda, &self.ctx.cuda) {
            (Some(sd), Some(_)) => sd.stream_wait_event(stream.raw, self.raw),
            (None, Some(ed)) => ed.event_synchronize(self.raw),
            (_, None) => Ok(()),
        }
    }

    /// Blocks until the event's work is done.
    pub fn synchronize(&self) -> Result<()> {
        match &self.ctx.cuda {
            Some(d) if self.is_recorded() => d.event_synchronize(self.raw),
            _ => Ok(()),
        }
    }

    /// Whether the event's work is done (an event never recorded is).
    pub fn query(&self) -> Result<bool> {
        match &self.ctx.cuda {
            Some(d) if self.is_recorded() => d.event_query(self.raw),
            _ => Ok(true),
        }
    }

    /// Milliseconds from `start` to `end` (two recorded events of one device); waits
    /// for `end` to complete first.
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        for (e, name) in [(start, "start"), (end, "end")] {
            crate::ensure!(
                e.is_recorded(),
                FK_ERROR_INVALID_ARGUMENT,
                "{name} has not been recorded (call fk_event_record first)"
            );
        }
        crate::ensure!(
            start.ctx.device == end.ctx.device,
            FK_ERROR_DEVICE_MISMATCH,
            "start is an event of {} but end of {}",
            start.ctx.device,
            end.ctx.device
        );
        match &end.ctx.cuda {
            None => {
                let s = lock(&start.stamp).unwrap_or_else(Instant::now);
                let e = lock(&end.stamp).unwrap_or_else(Instant::now);
                let ms = if e >= s {
                    (e - s).as_secs_f64() * 1e3
                } else {
                    -((s - e).as_secs_f64() * 1e3)
                };
                Ok(ms as f32)
            }
            Some(d) => {
                d.event_synchronize(end.raw)?;
                // Events of two fusekit contexts on one device share the primary
                // context, so either context's device can measure them.
                d.event_elapsed_ms(start.raw, end.raw)
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(d) = &self.ctx.cuda {
            d.event_destroy(self.raw);
        }
    }
}
