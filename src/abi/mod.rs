//! Every `extern "C"` function of fusekit, and nothing else: pointer checks, panic
//! catching and status translation, then a call into the crate.
//!
//! Each export runs its body through `guard`, which catches panics
//! (`FK_ERROR_INTERNAL`) and stores `"<function>: <message>"` as the thread's last
//! error message on failure. Successful calls leave the last message unchanged.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

/// The buffers behind an export's handle arguments, checked in the order written,
/// each named in messages by its parameter's name: `buffers!(a, [b])` is
/// `(buffer_ref(a, "a")?, opt_buffer(b, "b")?)`; a bracketed argument is optional
/// (NULL gives `None`). One argument gives its buffer, not a 1-tuple. Used inside
/// an `unsafe` block of a function returning `Result`.
macro_rules! buffers {
    (@arg [$p:ident]) => { $crate::abi::opt_buffer($p, stringify!($p))? };
    (@arg $p:ident) => { $crate::abi::buffer_ref($p, stringify!($p))? };
    ($arg:tt) => { buffers!(@arg $arg) };
    ($($arg:tt),+) => { ($(buffers!(@arg $arg)),+) };
}

pub mod core;
pub mod elementwise;
pub mod gaussian;
pub mod geodesic;
pub mod linalg;
pub mod mlp;
pub mod optim;
pub mod runtime;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::buffer::Buffer;
use crate::context::Context;
use crate::error::{
    Error, FK_ERROR_INTERNAL, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_NULL_POINTER, FK_OK, Result,
    fk_status, set_last_error,
};
use crate::stream::Stream;

const MAGIC_CONTEXT: u64 = 0x666b_636f_6e74_6578; // "fkcontex"
const MAGIC_STREAM: u64 = 0x666b_7374_7265_616d; // "fkstream"
const MAGIC_BUFFER: u64 = 0x666b_6275_6666_6572; // "fkbuffer"
const MAGIC_EVENT: u64 = 0x666b_6576_656e_7421; // "fkevent!"
const MAGIC_COMM: u64 = 0x666b_636f_6d6d_2121; // "fkcomm!!"

/// Opaque handle to a device context (see `fk_context_create`).
// The handles are `repr(C)` so that `magic` is the first word of every kind: the
// magic check of a wrong-kind pointer (e.g. an fk_stream* passed as fk_buffer*) then
// reads inside that handle's allocation. Written as `cfg_attr` so that cbindgen,
// which does not expand it, still emits the handles as opaque structs.
#[cfg_attr(all(), repr(C))]
pub struct fk_context {
    magic: u64,
    pub(crate) inner: Arc<Context>,
}

impl fk_context {
    /// The context behind the handle, for Rust callers: tests set per-context
    /// switches through it (e.g. `CudaDevice::set_linalg_fallback`).
    pub fn context(&self) -> &Context {
        &self.inner
    }
}

/// Opaque handle to a stream (see `fk_stream_create`, `fk_stream_wrap`).
#[cfg_attr(all(), repr(C))]
pub struct fk_stream {
    magic: u64,
    pub(crate) inner: Arc<Stream>,
}

/// Opaque handle to a buffer (see `fk_buffer_create`, `fk_buffer_wrap`).
#[cfg_attr(all(), repr(C))]
pub struct fk_buffer {
    magic: u64,
    pub(crate) inner: Buffer,
}

/// Opaque handle to an event (see `fk_event_create`).
#[cfg_attr(all(), repr(C))]
pub struct fk_event {
    magic: u64,
    pub(crate) inner: crate::event::Event,
}

/// Opaque handle to a communicator: one rank of a clique (see `fk_comm_init_all`,
/// `fk_comm_init_rank`).
#[cfg_attr(all(), repr(C))]
pub struct fk_comm {
    magic: u64,
    pub(crate) inner: crate::comm::Comm,
}

/// A scalar argument: a complex number `re + i*im`. For real element types `im`
/// must be 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct fk_scalar {
    pub re: f64,
    pub im: f64,
}

impl From<fk_scalar> for crate::plan::elementwise::Scalar {
    fn from(s: fk_scalar) -> Self {
        crate::plan::elementwise::Scalar { re: s.re, im: s.im }
    }
}

/// Runs an export's body: catches panics and records the message on failure.
pub(crate) fn guard<F: FnOnce() -> Result<()>>(name: &str, f: F) -> fk_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => FK_OK,
        Ok(Err(e)) => {
            set_last_error(&format!("{name}: {}", e.message));
            e.status
        }
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            set_last_error(&format!(
                "{name}: internal error (caught panic: {msg}); please report it"
            ));
            FK_ERROR_INTERNAL
        }
    }
}

/// The message of a caught panic (its `&str` or `String` payload).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn null(what: &str) -> Error {
    Error::new(FK_ERROR_NULL_POINTER, format!("{what} is NULL"))
}

pub(crate) fn bad_handle(what: &str, kind: &str) -> Error {
    Error::new(
        FK_ERROR_INVALID_ARGUMENT,
        format!("{what} is not a live {kind} (destroyed, or a different kind of handle)"),
    )
}

/// The first word of a non-NULL handle pointer of any kind (its magic), read
/// without forming a reference to a handle type that may be the wrong one.
pub(crate) unsafe fn magic_of<T>(p: *const T) -> u64 {
    // SAFETY: every handle kind is repr(C) with `magic: u64` first.
    unsafe { (p as *const u64).read() }
}

/// A handle kind: its magic (the first word of a live handle), its C name, and
/// what it holds.
pub(crate) trait Handle: Sized {
    const MAGIC: u64;
    const KIND: &'static str;
    type Inner;
    fn new(inner: Self::Inner) -> Self;
    fn inner(&self) -> &Self::Inner;
}

macro_rules! handle_kinds {
    ($($h:ident: $inner:ty = $magic:ident;)*) => {$(
        impl Handle for $h {
            const MAGIC: u64 = $magic;
            const KIND: &'static str = stringify!($h);
            type Inner = $inner;
            fn new(inner: $inner) -> Self {
                $h { magic: $magic, inner }
            }
            fn inner(&self) -> &$inner {
                &self.inner
            }
        }
    )*};
}

handle_kinds! {
    fk_context: Arc<Context> = MAGIC_CONTEXT;
    fk_stream: Arc<Stream> = MAGIC_STREAM;
    fk_buffer: Buffer = MAGIC_BUFFER;
    fk_event: crate::event::Event = MAGIC_EVENT;
    fk_comm: crate::comm::Comm = MAGIC_COMM;
}

/// What the handle `p` holds: `FK_ERROR_NULL_POINTER` when NULL,
/// `FK_ERROR_INVALID_ARGUMENT` when it is not a live handle of its kind.
///
/// # Safety
/// `p` is NULL or a pointer the caller got from fusekit (a handle of any kind, or
/// a destroyed one whose memory was not reused).
pub(crate) unsafe fn handle_ref<'a, H: Handle + 'a>(
    p: *const H,
    what: &str,
) -> Result<&'a H::Inner> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: the caller's contract; only the first word is read.
    if unsafe { magic_of(p) } != H::MAGIC {
        return Err(bad_handle(what, H::KIND));
    }
    // SAFETY: the magic says this is a live handle of this kind.
    Ok(unsafe { (*p).inner() })
}

pub(crate) unsafe fn context_ref<'a>(p: *const fk_context, what: &str) -> Result<&'a Arc<Context>> {
    unsafe { handle_ref(p, what) }
}

pub(crate) unsafe fn buffer_ref<'a>(p: *const fk_buffer, what: &str) -> Result<&'a Buffer> {
    unsafe { handle_ref(p, what) }
}

pub(crate) unsafe fn stream_ref<'a>(p: *const fk_stream, what: &str) -> Result<&'a Arc<Stream>> {
    unsafe { handle_ref(p, what) }
}

pub(crate) unsafe fn event_ref<'a>(
    p: *const fk_event,
    what: &str,
) -> Result<&'a crate::event::Event> {
    unsafe { handle_ref(p, what) }
}

pub(crate) unsafe fn comm_ref<'a>(p: *const fk_comm, what: &str) -> Result<&'a crate::comm::Comm> {
    unsafe { handle_ref(p, what) }
}

/// An optional buffer argument: NULL is `None`.
pub(crate) unsafe fn opt_buffer<'a>(p: *const fk_buffer, what: &str) -> Result<Option<&'a Buffer>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: non-null handle pointer from the caller.
        unsafe { buffer_ref(p, what) }.map(Some)
    }
}

/// The stream an op runs on: `p`, or the context's default stream when `p` is NULL.
pub(crate) unsafe fn stream_or_default(
    p: *const fk_stream,
    ctx: &Arc<Context>,
) -> Result<Arc<Stream>> {
    if p.is_null() {
        Ok(Stream::default_for(ctx))
    } else {
        // SAFETY: non-null handle pointer from the caller.
        unsafe { stream_ref(p, "stream") }.cloned()
    }
}

/// Writes `v` through an out-parameter.
pub(crate) unsafe fn write_out<T>(p: *mut T, what: &str, v: T) -> Result<()> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: non-null out-parameter supplied by the caller.
    unsafe { p.write(v) };
    Ok(())
}

/// Checks an out-parameter for a new handle before any work is done.
pub(crate) fn check_out<T>(p: *mut *mut T, what: &str) -> Result<()> {
    if p.is_null() { Err(null(what)) } else { Ok(()) }
}

/// A new handle holding `inner`, released by `destroy`.
pub(crate) fn new_handle<H: Handle>(inner: H::Inner) -> *mut H {
    Box::into_raw(Box::new(H::new(inner)))
}

pub(crate) fn new_context(inner: Arc<Context>) -> *mut fk_context {
    new_handle(inner)
}
pub(crate) fn new_stream(inner: Arc<Stream>) -> *mut fk_stream {
    new_handle(inner)
}
pub(crate) fn new_buffer(inner: Buffer) -> *mut fk_buffer {
    new_handle(inner)
}
pub(crate) fn new_event(inner: crate::event::Event) -> *mut fk_event {
    new_handle(inner)
}
pub(crate) fn new_comm(inner: crate::comm::Comm) -> *mut fk_comm {
    new_handle(inner)
}

/// Frees a handle made by `new_handle`; NULL is a no-op. The magic is cleared first
/// so a second destroy of the same pointer is caught while the allocator has not
/// reused it.
///
/// # Safety
/// As `handle_ref`.
pub(crate) unsafe fn destroy<H: Handle>(p: *mut H) -> Result<()> {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: non-NULL handle pointer; only its first word is read before the
    // magic says which kind it is.
    if unsafe { magic_of(p) } != H::MAGIC {
        return Err(bad_handle("the handle", H::KIND));
    }
    // SAFETY: the magic says this is a live handle of this kind, whose first word
    // is its magic.
    unsafe { (p as *mut u64).write(0) };
    // SAFETY: made by Box::into_raw in new_handle.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

/// Reads `n` elements from a caller array (NULL allowed only when n == 0).
pub(crate) unsafe fn slice_in<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: caller guarantees `n` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Validates an `ndim` argument.
pub(crate) fn ndim_arg(ndim: i32) -> Result<usize> {
    crate::ensure!(
        ndim >= 0 && ndim as usize <= crate::layout::FK_MAX_DIMS,
        FK_ERROR_INVALID_ARGUMENT,
        "ndim = {ndim} is outside 0..={}",
        crate::layout::FK_MAX_DIMS
    );
    Ok(ndim as usize)
}

#[allow(dead_code)]
pub(crate) fn internal(msg: &str) -> Error {
    Error::new(FK_ERROR_INTERNAL, msg)
}
