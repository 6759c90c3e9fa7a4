//! Helpers of the runtime tests (`abi_runtime`, `gpu_runtime`, `multigpu_runtime`):
//! RAII wrappers for events and communicators, pinned buffers, memory statistics,
//! copies, and a timeout for anything that may hang (collectives).

use std::ptr::{null, null_mut};
use std::sync::mpsc;
use std::time::Duration;

pub use fusekit::abi::runtime::*;
pub use fusekit::abi::{fk_comm, fk_event};
pub use fusekit::context::FK_DEVICE_CUDA_HOST;

use super::*;

/// An `fk_event*`, destroyed on drop.
pub struct Event(pub *mut fk_event);

// SAFETY: fusekit handles may be used from any thread (docs/abi.md).
unsafe impl Send for Event {}

impl Event {
    pub fn new(ctx: &Ctx) -> Event {
        Event(created(|p| unsafe { fk_event_create(ctx.0, p) }))
    }
    pub fn record(&self, stream: *const fk_stream) {
        ok(unsafe { fk_event_record(self.0, stream) });
    }
    pub fn sync(&self) {
        ok(unsafe { fk_event_synchronize(self.0) });
    }
    pub fn query(&self) -> bool {
        let d = out_param(-1, |d| unsafe { fk_event_query(self.0, d) });
        assert!(d == 0 || d == 1);
        d == 1
    }
    /// Milliseconds from `self` to `end`.
    pub fn ms_to(&self, end: &Event) -> f32 {
        out_param(f32::NAN, |ms| unsafe {
            fk_event_elapsed_ms(self.0, end.0, ms)
        })
    }
}

destroy_on_drop!(Event, fk_event_destroy);

/// An `fk_comm*`, destroyed on drop.
pub struct Comm(pub *mut fk_comm);

// SAFETY: as Event.
unsafe impl Send for Comm {}

impl Comm {
    pub fn init_rank(ctx: &Ctx, nranks: i32, id: &[u8; 128], rank: i32) -> Result<Comm, fk_status> {
        let mut p = null_mut();
        let s = unsafe { fk_comm_init_rank(ctx.0, nranks, id.as_ptr(), rank, &mut p) };
        if s == FK_OK {
            assert!(!p.is_null());
            Ok(Comm(p))
        } else {
            assert!(p.is_null(), "fk_comm_init_rank failed but wrote a handle");
            Err(s)
        }
    }
    pub fn init_all(ctxs: &[&Ctx]) -> Result<Vec<Comm>, fk_status> {
        let raw: Vec<*const fk_context> = ctxs.iter().map(|c| c.0 as *const _).collect();
        let mut out = vec![null_mut(); ctxs.len()];
        let s = unsafe { fk_comm_init_all(raw.as_ptr(), raw.len() as i32, out.as_mut_ptr()) };
        if s == FK_OK {
            assert!(out.iter().all(|p| !p.is_null()));
            Ok(out.into_iter().map(Comm).collect())
        } else {
            assert!(
                out.iter().all(|p| p.is_null()),
                "fk_comm_init_all failed but wrote handles"
            );
            Err(s)
        }
    }
    pub fn rank(&self) -> i32 {
        out_param(-1, |r| unsafe { fk_comm_rank(self.0, r) })
    }
    pub fn size(&self) -> i32 {
        out_param(-1, |n| unsafe { fk_comm_size(self.0, n) })
    }
}

destroy_on_drop!(Comm, fk_comm_destroy);

/// A pinned buffer (an ordinary host buffer on a CPU context).
pub fn pinned(ctx: &Ctx, dtype: fk_dtype, shape: &[i64]) -> Buf {
    let ndim = shape.len() as i32;
    Buf(created(|p| unsafe {
        fk_buffer_create_pinned(ctx.0, dtype, ndim, shape.as_ptr(), p)
    }))
}

pub fn copy(dst: &Buf, src: &Buf, stream: *const fk_stream) -> fk_status {
    unsafe { fk_buffer_copy(dst.0, src.0, stream) }
}

/// The context's memory statistics (full struct).
pub fn stats(ctx: &Ctx) -> fk_memory_stats {
    let mut s = fk_memory_stats {
        size: std::mem::size_of::<fk_memory_stats>(),
        ..Default::default()
    };
    ok(unsafe { fk_context_memory_stats(ctx.0, &mut s) });
    assert_eq!(
        s.size,
        std::mem::size_of::<fk_memory_stats>(),
        "size is left as set"
    );
    s
}

/// A unique id, or `None` when NCCL cannot be loaded (after checking the message).
pub fn unique_id() -> Option<[u8; 128]> {
    let mut id = [0u8; 128];
    let s = unsafe { fk_comm_unique_id(id.as_mut_ptr()) };
    if s == FK_ERROR_LIBRARY_NOT_FOUND {
        let msg = last_error();
        assert!(
            msg.contains("fk_comm_unique_id") && msg.contains("libnccl.so.2"),
            "{msg}"
        );
        return None;
    }
    ok(s);
    Some(id)
}

/// Runs `f` on a thread and fails the test when it has not finished in `secs`
/// seconds (a hung collective must not hang the test run).
pub fn with_timeout<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // the thread panicked before sending
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {secs} s (hung collective?)")
        }
    }
}

/// f32 values `0, 1, 2, ...` times `scale` plus `offset`.
pub fn ramp(n: usize, scale: f64, offset: f64) -> Vec<Cx> {
    (0..n).map(|i| re(i as f64 * scale + offset)).collect()
}

pub fn f32s(vals: &[f32]) -> Vec<Cx> {
    vals.iter().map(|&v| re(v as f64)).collect()
}

/// The default stream placeholder (NULL).
pub const NULL_STREAM: *const fk_stream = null();

/// A read-only f32 CPU buffer (a DLPack import flagged read-only).
pub fn read_only_f32(ctx: &Ctx, vals: &[Cx]) -> Buf {
    let m = make_tensor(
        encode(FK_DTYPE_F32, vals),
        None,
        DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        },
        &[vals.len() as i64],
        None,
        DLDevice {
            device_type: 1,
            device_id: 0,
        },
    );
    // SAFETY: a tensor just made, not yet handed over.
    unsafe { (*m.managed).flags = DL_READ_ONLY };
    import_dlpack(ctx, m.managed).expect("import of a read-only tensor")
}
