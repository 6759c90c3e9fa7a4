//! The harness every C-ABI integration test shares (`abi_*`, `gpu_*`, `stress`, ...).
//! Everything here drives the library through its `extern "C"` entry points only,
//! as a C caller would. Per-family helpers live beside it: `elementwise_table`,
//! `gaussian_util`, `geodesic_util`, `linalg_ref`, `optim_ref`.
//!
//! - RAII wrappers (`Ctx`, `Stream`, `Buf`) over the raw handles.
//! - `ok` / `expect_status`: a status, and for failures the message substrings
//!   read back through `fk_last_error_message`.
//! - `Cx`: f64 complex values, the currency of every test (real dtypes use im = 0),
//!   with `encode` / `decode` to and from each dtype's bytes.
//! - `Rng`: a seeded splitmix64.
//! - `View`: a strided view (shape, strides, offset) into a 1-D storage buffer, so
//!   that a test can place an operand transposed, reversed, strided, broadcast by a
//!   zero stride or misaligned, poison the rest of the storage, and afterwards check
//!   that nothing outside the view was written.
//! - `assert_close`: `||out - ref|| / ||ref||` against a per-dtype threshold; NaN or
//!   infinity in the output never passes.
//! - Real values as plain `f64`: `Buf::from_reals` / `poisoned` (NaN-filled outputs) /
//!   `read_reals`, `quantize_reals`, `assert_close_reals`; `raw_or_null` for optional
//!   buffer arguments.
//! - `gpu()` / `sanitizing()`: the skip without a CUDA device, and the sizes under
//!   compute-sanitizer.

#![allow(dead_code, unused_imports)]

/// `impl Drop` for a wrapper of one handle (`.0`): destroys it with `$destroy` and
/// checks the status, except while the thread is already panicking (a failing test
/// still frees its handles, and a second panic would abort). Defined before the
/// submodules so that `runtime` uses it too.
macro_rules! destroy_on_drop {
    ($ty:ty, $destroy:path) => {
        impl Drop for $ty {
            fn drop(&mut self) {
                let s = unsafe { $destroy(self.0) };
                if !std::thread::panicking() {
                    ok(s);
                }
            }
        }
    };
}

pub mod graph;
pub mod runtime;

use std::ffi::{CStr, c_char, c_void};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use fusekit::abi::core::*;
pub use fusekit::abi::elementwise::*;
pub use fusekit::abi::{fk_buffer, fk_context, fk_scalar, fk_stream};
pub use fusekit::context::{FK_DEVICE_AUTO, FK_DEVICE_CPU, FK_DEVICE_CUDA, fk_device_kind};
pub use fusekit::dtype::{
    FK_DTYPE_BF16, FK_DTYPE_C64, FK_DTYPE_C128, FK_DTYPE_F16, FK_DTYPE_F32, FK_DTYPE_F64, fk_dtype,
};
pub use fusekit::error::{
    FK_ERROR_ABI_MISMATCH, FK_ERROR_ALIASING, FK_ERROR_BUFFER_TOO_SMALL, FK_ERROR_CUDA,
    FK_ERROR_CUDA_UNAVAILABLE, FK_ERROR_DEVICE_MISMATCH, FK_ERROR_DTYPE_MISMATCH,
    FK_ERROR_INTERNAL, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_IO, FK_ERROR_KERNEL_COMPILE,
    FK_ERROR_LIBRARY_NOT_FOUND, FK_ERROR_NOT_CONVERGED, FK_ERROR_NULL_POINTER,
    FK_ERROR_OUT_OF_MEMORY, FK_ERROR_SHAPE_MISMATCH, FK_ERROR_UNSUPPORTED,
    FK_ERROR_UNSUPPORTED_DTYPE, FK_OK, fk_status,
};

// ------------------------------------------------------------------ the C header

/// include/fusekit.h, read once per call, for tests that check the header's
/// constants against the crate's.
pub struct Header(pub String);

impl Header {
    pub fn read() -> Header {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/fusekit.h");
        Header(std::fs::read_to_string(path).unwrap())
    }
    /// The value of `#define NAME value`; panics when the header does not define it.
    pub fn define(&self, name: &str) -> i64 {
        let line = self
            .0
            .lines()
            .find(|l| l.starts_with("#define") && l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{name} is not #defined in fusekit.h"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }
}

// ------------------------------------------------------------------ statuses, messages

/// Reads a NUL-terminated string returned by the library.
pub fn cstr(p: *const c_char) -> String {
    assert!(!p.is_null(), "the library returned a NULL string");
    // SAFETY: the library returns NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .expect("library strings are UTF-8")
        .to_owned()
}

/// This thread's last error message (pointer form).
pub fn last_error() -> String {
    cstr(fk_last_error_message())
}

pub fn status_name(s: fk_status) -> String {
    cstr(fk_status_string(s))
}

/// Asserts `FK_OK`, printing the status name and the last message otherwise.
#[track_caller]
pub fn ok(s: fk_status) {
    assert!(
        s == FK_OK,
        "expected FK_OK, got {} ({s}): {}",
        status_name(s),
        last_error()
    );
}

/// Asserts that a call returned FK_OK; a failure names `what` (the case), the status
/// and the last error message.
pub fn ok_for(s: fk_status, what: impl std::fmt::Display) {
    assert!(s == FK_OK, "{what}: {} {}", status_name(s), last_error());
}

/// Waits for `stream` when there is one (null: the default stream, nothing to wait
/// for), before results are read on the default stream: an owned stream is
/// non-blocking and does not order with it.
pub fn sync_stream(stream: *const fk_stream) {
    if !stream.is_null() {
        ok(unsafe { fk_stream_synchronize(stream) });
    }
}

/// Asserts that a call failed with `want` and that the last error message contains
/// every one of `needles` (the function's name, the argument, the cause).
#[track_caller]
pub fn expect_status(s: fk_status, want: fk_status, needles: &[&str]) {
    let msg = last_error();
    assert!(
        s == want,
        "expected {} ({want}), got {} ({s}); last message: {msg:?}",
        status_name(want),
        status_name(s)
    );
    for n in needles {
        assert!(
            msg.contains(n),
            "status {} is right but the message {msg:?} does not contain {n:?}",
            status_name(s)
        );
    }
}

/// What an entry point writes through its out-parameter: `call` gets `poison` (a
/// value the entry point must overwrite) to write into and must return FK_OK.
pub fn out_param<T>(poison: T, call: impl FnOnce(&mut T) -> fk_status) -> T {
    let mut v = poison;
    ok(call(&mut v));
    v
}

/// A handle an entry point creates through its out-parameter (FK_OK and not null).
pub fn created<T>(call: impl FnOnce(&mut *mut T) -> fk_status) -> *mut T {
    let p = out_param(null_mut(), call);
    assert!(!p.is_null());
    p
}

/// Whether a usable CUDA device is present (`fk_device_count`).
pub fn device_count() -> i32 {
    let n = out_param(-1, |n| unsafe { fk_device_count(n) });
    assert!(n >= 0);
    n
}

// ------------------------------------------------------------------ RAII handles

/// An `fk_context*`, destroyed on drop.
pub struct Ctx(pub *mut fk_context);

impl Ctx {
    pub fn try_new(kind: fk_device_kind, ordinal: i32) -> Result<Ctx, fk_status> {
        let mut p = null_mut();
        let s = unsafe { fk_context_create(FK_ABI_VERSION, kind, ordinal, &mut p) };
        if s == FK_OK {
            assert!(!p.is_null(), "fk_context_create returned FK_OK and NULL");
            Ok(Ctx(p))
        } else {
            assert!(p.is_null(), "fk_context_create failed but wrote a handle");
            Err(s)
        }
    }
    pub fn cpu() -> Ctx {
        Ctx::try_new(FK_DEVICE_CPU, 0)
            .unwrap_or_else(|s| panic!("CPU context: {} {}", status_name(s), last_error()))
    }
    pub fn cuda(ordinal: i32) -> Ctx {
        Ctx::try_new(FK_DEVICE_CUDA, ordinal)
            .unwrap_or_else(|s| panic!("CUDA context: {} {}", status_name(s), last_error()))
    }
    pub fn raw(&self) -> *mut fk_context {
        self.0
    }
    /// `(kind, ordinal)` of the context's device.
    pub fn device(&self) -> (fk_device_kind, i32) {
        let (mut k, mut o) = (-1, -1);
        ok(unsafe { fk_context_device(self.0, &mut k, &mut o) });
        (k, o)
    }
    pub fn is_cuda(&self) -> bool {
        self.device().0 == FK_DEVICE_CUDA
    }
    pub fn sync_default(&self) {
        // The legacy default stream orders after every blocking stream.
        let s = Stream::default_of(self);
        if let Some(s) = s {
            s.sync();
        }
    }
}

destroy_on_drop!(Ctx, fk_context_destroy);

/// An `fk_stream*`, destroyed on drop.
pub struct Stream(pub *mut fk_stream);

impl Stream {
    pub fn new(ctx: &Ctx) -> Stream {
        Stream(created(|p| unsafe { fk_stream_create(ctx.0, p) }))
    }
    /// Wraps a raw `CUstream` (CUDA contexts only).
    pub fn wrap(ctx: &Ctx, raw: *mut c_void) -> Stream {
        Stream(created(|p| unsafe { fk_stream_wrap(ctx.0, raw, p) }))
    }
    /// The legacy default stream wrapped (CUDA), `None` on the CPU.
    pub fn default_of(ctx: &Ctx) -> Option<Stream> {
        if ctx.is_cuda() {
            Some(Stream::wrap(ctx, null_mut()))
        } else {
            None
        }
    }
    pub fn raw(&self) -> *mut fk_stream {
        self.0
    }
    pub fn sync(&self) {
        ok(unsafe { fk_stream_synchronize(self.0) });
    }
    pub fn handle(&self) -> *mut c_void {
        out_param(1usize as *mut c_void, |h| unsafe {
            fk_stream_handle(self.0, h)
        })
    }
}

destroy_on_drop!(Stream, fk_stream_destroy);

/// An `fk_buffer*`, destroyed on drop.
pub struct Buf(pub *mut fk_buffer);

impl Buf {
    pub fn new(ctx: &Ctx, dtype: fk_dtype, shape: &[i64]) -> Buf {
        Buf::new_on(ctx, dtype, shape, null())
    }
    pub fn new_on(ctx: &Ctx, dtype: fk_dtype, shape: &[i64], stream: *const fk_stream) -> Buf {
        let mut p = null_mut();
        ok(unsafe {
            fk_buffer_create(
                ctx.0,
                dtype,
                shape.len() as i32,
                shape.as_ptr(),
                stream,
                &mut p,
            )
        });
        assert!(!p.is_null());
        Buf(p)
    }
    /// Wraps `data` (host memory for a CPU context, device memory for CUDA).
    ///
    /// # Safety
    /// `data` must address every element of the view and outlive the handle.
    pub unsafe fn wrap(
        ctx: &Ctx,
        data: *mut c_void,
        dtype: fk_dtype,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Buf {
        let mut p = null_mut();
        ok(unsafe {
            fk_buffer_wrap(
                ctx.0,
                data,
                dtype,
                shape.len() as i32,
                shape.as_ptr(),
                strides.map_or(null(), |s| s.as_ptr()),
                &mut p,
            )
        });
        assert!(!p.is_null());
        Buf(p)
    }
    /// A new buffer holding `vals`.
    pub fn from_vals(ctx: &Ctx, dtype: fk_dtype, shape: &[i64], vals: &[Cx]) -> Buf {
        let b = Buf::new(ctx, dtype, shape);
        b.write(vals);
        b
    }
    pub fn raw(&self) -> *mut fk_buffer {
        self.0
    }
    pub fn dtype(&self) -> fk_dtype {
        out_param(-1, |d| unsafe { fk_buffer_dtype(self.0, d) })
    }
    pub fn ndim(&self) -> i32 {
        out_param(-1, |n| unsafe { fk_buffer_ndim(self.0, n) })
    }
    pub fn shape(&self) -> Vec<i64> {
        let mut v = vec![-7i64; self.ndim() as usize];
        ok(unsafe { fk_buffer_shape(self.0, v.as_mut_ptr()) });
        v
    }
    pub fn strides(&self) -> Vec<i64> {
        let mut v = vec![-7i64; self.ndim() as usize];
        ok(unsafe { fk_buffer_strides(self.0, v.as_mut_ptr()) });
        v
    }
    pub fn numel(&self) -> i64 {
        out_param(-1, |n| unsafe { fk_buffer_numel(self.0, n) })
    }
    pub fn nbytes(&self) -> usize {
        out_param(usize::MAX, |n| unsafe { fk_buffer_nbytes(self.0, n) })
    }
    pub fn is_contiguous(&self) -> bool {
        let c = out_param(-1, |c| unsafe { fk_buffer_is_contiguous(self.0, c) });
        assert!(c == 0 || c == 1);
        c == 1
    }
    pub fn data(&self) -> *mut c_void {
        out_param(1usize as *mut c_void, |p| unsafe {
            fk_buffer_data(self.0, p)
        })
    }
    pub fn device(&self) -> (fk_device_kind, i32) {
        let (mut k, mut o) = (-1, -1);
        ok(unsafe { fk_buffer_device(self.0, &mut k, &mut o) });
        (k, o)
    }
    /// Caller host memory `host` wrapped as a buffer of `ctx` with `shape` and
    /// `strides` (elements of `dtype`, which need not be `T`).
    ///
    /// # Safety
    /// `host` outlives the buffer and holds every element the view reaches.
    pub unsafe fn wrap_host<T>(
        ctx: &Ctx,
        host: &mut [T],
        dtype: fk_dtype,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> Buf {
        unsafe { Buf::wrap(ctx, host.as_mut_ptr().cast(), dtype, shape, strides) }
    }
    /// Elements `start..start + len` of this contiguous buffer as a 1-D wrap for `ctx`.
    ///
    /// # Safety
    /// The range lies inside the buffer, which outlives the wrap.
    pub unsafe fn wrap_range(&self, ctx: &Ctx, start: usize, len: usize) -> Buf {
        let dtype = self.dtype();
        let data = self.data().cast::<u8>().wrapping_add(start * dsize(dtype));
        unsafe { Buf::wrap(ctx, data.cast(), dtype, &[len as i64], None) }
    }
    pub fn write_bytes(&self, bytes: &[u8]) {
        ok(unsafe {
            fk_buffer_copy_from_host(self.0, bytes.as_ptr() as *const c_void, bytes.len(), null())
        });
    }
    pub fn read_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.nbytes()];
        ok(unsafe {
            fk_buffer_copy_to_host(self.0, v.as_mut_ptr() as *mut c_void, v.len(), null())
        });
        v
    }
    pub fn write(&self, vals: &[Cx]) {
        self.write_bytes(&encode(self.dtype(), vals));
    }
    pub fn read(&self) -> Vec<Cx> {
        decode(self.dtype(), &self.read_bytes())
    }
    /// Gives up ownership (for tests that destroy the handle themselves).
    pub fn into_raw(self) -> *mut fk_buffer {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

/// An optional buffer argument: its handle, or NULL for `None`.
pub fn raw_or_null(b: &Option<Buf>) -> *mut fk_buffer {
    b.as_ref().map_or(null_mut(), |b| b.raw())
}

destroy_on_drop!(Buf, fk_buffer_destroy);

// ------------------------------------------------------------------ dtypes

pub const DTYPES: [fk_dtype; 6] = [
    FK_DTYPE_F16,
    FK_DTYPE_BF16,
    FK_DTYPE_F32,
    FK_DTYPE_F64,
    FK_DTYPE_C64,
    FK_DTYPE_C128,
];

pub fn dsize(d: fk_dtype) -> usize {
    match d {
        FK_DTYPE_F16 | FK_DTYPE_BF16 => 2,
        FK_DTYPE_F32 => 4,
        FK_DTYPE_F64 | FK_DTYPE_C64 => 8,
        FK_DTYPE_C128 => 16,
        _ => panic!("unknown dtype {d}"),
    }
}

pub fn is_complex(d: fk_dtype) -> bool {
    d == FK_DTYPE_C64 || d == FK_DTYPE_C128
}

/// The real dtype of a complex one (the dtype itself when real).
pub fn real_of(d: fk_dtype) -> fk_dtype {
    match d {
        FK_DTYPE_C64 => FK_DTYPE_F32,
        FK_DTYPE_C128 => FK_DTYPE_F64,
        d => d,
    }
}

pub fn dname(d: fk_dtype) -> &'static str {
    match d {
        FK_DTYPE_F16 => "f16",
        FK_DTYPE_BF16 => "bf16",
        FK_DTYPE_F32 => "f32",
        FK_DTYPE_F64 => "f64",
        FK_DTYPE_C64 => "complex64",
        FK_DTYPE_C128 => "complex128",
        _ => "?",
    }
}

/// The default relative-error threshold per dtype for `assert_close` against an f64
/// reference of the rounded inputs: 1e-2 for f16 and bf16 (their 11 and 8
/// significant bits), 1e-5 for f32 and complex64, 1e-12 for f64 and complex128.
pub fn tol(d: fk_dtype) -> f64 {
    match d {
        FK_DTYPE_F16 | FK_DTYPE_BF16 => 1e-2,
        FK_DTYPE_F32 | FK_DTYPE_C64 => 1e-5,
        FK_DTYPE_F64 | FK_DTYPE_C128 => 1e-12,
        _ => panic!("unknown dtype {d}"),
    }
}

// ------------------------------------------------------------------ values

/// An f64 complex value; real dtypes use `im == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Cx {
    pub re: f64,
    pub im: f64,
}

pub const fn cx(re: f64, im: f64) -> Cx {
    Cx { re, im }
}
pub const fn re(re: f64) -> Cx {
    Cx { re, im: 0.0 }
}

impl Cx {
    pub fn scalar(self) -> fk_scalar {
        fk_scalar {
            re: self.re,
            im: self.im,
        }
    }
    pub fn is_finite(self) -> bool {
        self.re.is_finite() && self.im.is_finite()
    }
    pub fn has_nan(self) -> bool {
        self.re.is_nan() || self.im.is_nan()
    }
    pub fn add(self, o: Cx) -> Cx {
        cx(self.re + o.re, self.im + o.im)
    }
    pub fn sub(self, o: Cx) -> Cx {
        cx(self.re - o.re, self.im - o.im)
    }
    pub fn mul(self, o: Cx) -> Cx {
        cx(
            self.re * o.re - self.im * o.im,
            self.re * o.im + self.im * o.re,
        )
    }
    /// Textbook `a * conj(b) / |b|^2`.
    pub fn div(self, o: Cx) -> Cx {
        let d = o.re * o.re + o.im * o.im;
        cx(
            (self.re * o.re + self.im * o.im) / d,
            (self.im * o.re - self.re * o.im) / d,
        )
    }
    pub fn neg(self) -> Cx {
        cx(-self.re, -self.im)
    }
    pub fn abs(self) -> f64 {
        self.re.hypot(self.im)
    }
    pub fn exp(self) -> Cx {
        let e = self.re.exp();
        cx(e * self.im.cos(), e * self.im.sin())
    }
    pub fn ln(self) -> Cx {
        cx(self.abs().ln(), self.im.atan2(self.re))
    }
    /// Principal root `sqrt(r) * e^(i theta/2)`.
    pub fn sqrt(self) -> Cx {
        let (r, t) = (self.abs().sqrt(), self.im.atan2(self.re) / 2.0);
        cx(r * t.cos(), r * t.sin())
    }
    pub fn sin(self) -> Cx {
        cx(
            self.re.sin() * self.im.cosh(),
            self.re.cos() * self.im.sinh(),
        )
    }
    pub fn cos(self) -> Cx {
        cx(
            self.re.cos() * self.im.cosh(),
            -self.re.sin() * self.im.sinh(),
        )
    }
    /// `(e^(2z) - 1) / (e^(2z) + 1)`.
    pub fn tanh(self) -> Cx {
        let e = cx(2.0 * self.re, 2.0 * self.im).exp();
        e.sub(re(1.0)).div(e.add(re(1.0)))
    }
    pub fn sigmoid(self) -> Cx {
        re(1.0).div(re(1.0).add(self.neg().exp()))
    }
}

/// Rounds `v` to what `dtype` can hold (the inputs the library really sees).
pub fn quantize(dtype: fk_dtype, v: Cx) -> Cx {
    match dtype {
        FK_DTYPE_F16 => re(half::f16::from_f64(v.re).to_f64()),
        FK_DTYPE_BF16 => re(half::bf16::from_f64(v.re).to_f64()),
        FK_DTYPE_F32 => re(v.re as f32 as f64),
        FK_DTYPE_F64 => re(v.re),
        FK_DTYPE_C64 => cx(v.re as f32 as f64, v.im as f32 as f64),
        FK_DTYPE_C128 => v,
        _ => panic!("unknown dtype {dtype}"),
    }
}

/// Encodes values as `dtype` elements (little endian; complex interleaved).
pub fn encode(dtype: fk_dtype, vals: &[Cx]) -> Vec<u8> {
    let mut out = Vec::with_capacity(vals.len() * dsize(dtype));
    for v in vals {
        match dtype {
            FK_DTYPE_F16 => {
                out.extend_from_slice(&half::f16::from_f64(v.re).to_bits().to_le_bytes())
            }
            FK_DTYPE_BF16 => {
                out.extend_from_slice(&half::bf16::from_f64(v.re).to_bits().to_le_bytes())
            }
            FK_DTYPE_F32 => out.extend_from_slice(&(v.re as f32).to_le_bytes()),
            FK_DTYPE_F64 => out.extend_from_slice(&v.re.to_le_bytes()),
            FK_DTYPE_C64 => {
                out.extend_from_slice(&(v.re as f32).to_le_bytes());
                out.extend_from_slice(&(v.im as f32).to_le_bytes());
            }
            FK_DTYPE_C128 => {
                out.extend_from_slice(&v.re.to_le_bytes());
                out.extend_from_slice(&v.im.to_le_bytes());
            }
            _ => panic!("unknown dtype {dtype}"),
        }
    }
    out
}

/// Decodes `dtype` elements.
pub fn decode(dtype: fk_dtype, bytes: &[u8]) -> Vec<Cx> {
    let sz = dsize(dtype);
    assert_eq!(bytes.len() % sz, 0);
    bytes
        .chunks_exact(sz)
        .map(|c| decode_one(dtype, c))
        .collect()
}

fn decode_one(dtype: fk_dtype, c: &[u8]) -> Cx {
    let f32_at = |i: usize| f32::from_le_bytes(c[i..i + 4].try_into().unwrap()) as f64;
    let f64_at = |i: usize| f64::from_le_bytes(c[i..i + 8].try_into().unwrap());
    match dtype {
        FK_DTYPE_F16 => re(half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64()),
        FK_DTYPE_BF16 => re(half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64()),
        FK_DTYPE_F32 => re(f32_at(0)),
        FK_DTYPE_F64 => re(f64_at(0)),
        FK_DTYPE_C64 => cx(f32_at(0), f32_at(4)),
        FK_DTYPE_C128 => cx(f64_at(0), f64_at(8)),
        _ => panic!("unknown dtype {dtype}"),
    }
}

// ------------------------------------------------------------------ random numbers

/// splitmix64: tiny, seeded, good enough for test data.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// The generator at `state` itself, with no seed mixing (the geodesic tests'
    /// problems are drawn from these states).
    pub fn from_state(state: u64) -> Rng {
        Rng(state)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Magnitude in [lo, hi) with a random sign.
    pub fn signed(&mut self, lo: f64, hi: f64) -> f64 {
        let m = self.uniform(lo, hi);
        if self.next_u64() & 1 == 0 { m } else { -m }
    }
    /// `n` values uniform in [lo, hi).
    pub fn uniform_vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Where an operand's random values come from.
#[derive(Clone, Copy, Debug)]
pub enum Domain {
    /// Components of magnitude in [0.25, 2) with random signs: away from zero (safe
    /// divisors, no complex branch cuts or poles), both signs for relu.
    Signed,
    /// Reals in [0.25, 3) (log, sqrt); complex as `Signed`.
    Positive,
}

pub fn random_value(rng: &mut Rng, dtype: fk_dtype, dom: Domain) -> Cx {
    let v = if is_complex(dtype) {
        cx(rng.signed(0.25, 2.0), rng.signed(0.25, 2.0))
    } else {
        match dom {
            Domain::Signed => re(rng.signed(0.25, 2.0)),
            Domain::Positive => re(rng.uniform(0.25, 3.0)),
        }
    };
    quantize(dtype, v)
}

pub fn random_values(rng: &mut Rng, dtype: fk_dtype, n: usize, dom: Domain) -> Vec<Cx> {
    (0..n).map(|_| random_value(rng, dtype, dom)).collect()
}

// ------------------------------------------------------------------ comparison

/// `||out - ref|| / ||ref||`; infinity when `out` holds a NaN or an infinity (an
/// unwritten, poisoned element or a wrong result never passes).
pub fn rel_err(out: &[Cx], reference: &[Cx]) -> f64 {
    assert_eq!(out.len(), reference.len(), "lengths differ");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (o, r) in out.iter().zip(reference) {
        assert!(r.is_finite(), "test bug: the reference holds {r:?}");
        if !o.is_finite() {
            return f64::INFINITY;
        }
        let d = o.sub(*r);
        num += d.re * d.re + d.im * d.im;
        den += r.re * r.re + r.im * r.im;
    }
    if den == 0.0 {
        if num == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (num / den).sqrt()
    }
}

/// Asserts `rel_err(out, reference) <= tol`, naming the first bad element.
#[track_caller]
pub fn assert_close(out: &[Cx], reference: &[Cx], tol: f64, what: &str) {
    let e = rel_err(out, reference);
    if e <= tol {
        return;
    }
    let bad = out
        .iter()
        .zip(reference)
        .position(|(o, r)| !o.is_finite() || o.sub(*r).abs() > tol * r.abs().max(1e-3))
        .unwrap_or(0);
    panic!(
        "{what}: relative error {e:e} > {tol:e} over {} elements; e.g. element {bad}: got {:?}, want {:?}",
        out.len(),
        out.get(bad),
        reference.get(bad)
    );
}

/// `assert_close` for real values: every output element must be finite, and
/// `||out - want|| / ||want||` (the absolute `||out - want||` when `want` is all
/// zeros) at most `tol`.
#[track_caller]
pub fn assert_close_reals(out: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(out.len(), want.len(), "{what}: length");
    if let Some(k) = out.iter().position(|x| !x.is_finite()) {
        panic!(
            "{what}: non-finite output {} at {k} (reference {})",
            out[k], want[k]
        );
    }
    let num: f64 = out.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let e = if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    };
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.1e}");
}

// ------------------------------------------------------------------ real values

/// Rounds reals to what `dtype` holds (the inputs the library really sees).
pub fn quantize_reals(dtype: fk_dtype, v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| quantize(dtype, re(x)).re).collect()
}

impl Buf {
    /// A new buffer holding the reals `vals` (one per element).
    pub fn from_reals(ctx: &Ctx, dtype: fk_dtype, shape: &[i64], vals: &[f64]) -> Buf {
        assert_eq!(
            vals.len() as i64,
            numel(shape),
            "values for shape {shape:?}"
        );
        let b = Buf::new(ctx, dtype, shape);
        b.write_reals(vals);
        b
    }
    /// Writes the reals `vals` (one per element).
    pub fn write_reals(&self, vals: &[f64]) {
        let v: Vec<Cx> = vals.iter().map(|&x| re(x)).collect();
        self.write(&v);
    }
    /// A new buffer filled with NaN: a poisoned output, so that an element an op
    /// leaves unwritten fails the comparison.
    pub fn poisoned(ctx: &Ctx, dtype: fk_dtype, shape: &[i64]) -> Buf {
        Buf::from_reals(ctx, dtype, shape, &vec![f64::NAN; numel(shape) as usize])
    }
    /// The elements' real parts.
    pub fn read_reals(&self) -> Vec<f64> {
        self.read().iter().map(|c| c.re).collect()
    }
}

// ------------------------------------------------------------------ strided views

/// A view of `shape` with `strides` (elements) whose first element sits at element
/// `offset` of a 1-D storage of `storage_len` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub offset: i64,
    pub storage_len: i64,
}

pub fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

impl View {
    /// Lays out `shape` with dimensions nested in `order` (outermost first), each
    /// dimension's stride multiplied by `step[d]` (2: every other element, negative:
    /// reversed, 0: broadcast by a zero stride), after `pad` leading elements.
    pub fn build(shape: &[i64], order: &[usize], step: &[i64], pad: i64) -> View {
        let nd = shape.len();
        assert!(order.len() == nd && step.len() == nd);
        let mut strides = vec![0i64; nd];
        let mut acc = 1i64;
        for &d in order.iter().rev() {
            if step[d] != 0 {
                strides[d] = acc * step[d];
                acc *= shape[d].max(1) * step[d].abs();
            }
        }
        if numel(shape) == 0 {
            return View {
                shape: shape.to_vec(),
                strides,
                offset: pad,
                storage_len: pad,
            };
        }
        let (mut lo, mut hi) = (0i64, 0i64);
        for (&n, &s) in shape.iter().zip(&strides) {
            let span = (n - 1) * s;
            lo += span.min(0);
            hi += span.max(0);
        }
        View {
            shape: shape.to_vec(),
            strides,
            offset: pad - lo,
            storage_len: pad + hi - lo + 1,
        }
    }
    pub fn contiguous(shape: &[i64]) -> View {
        let nd = shape.len();
        View::build(shape, &(0..nd).collect::<Vec<_>>(), &vec![1; nd], 0)
    }
    /// Column-major: the transpose of a contiguous tensor.
    pub fn transposed(shape: &[i64]) -> View {
        let nd = shape.len();
        View::build(shape, &(0..nd).rev().collect::<Vec<_>>(), &vec![1; nd], 0)
    }
    /// Every other element along the last dimension (and gaps between rows).
    pub fn every_other(shape: &[i64]) -> View {
        let nd = shape.len();
        let mut step = vec![1; nd];
        if nd > 0 {
            step[nd - 1] = 2;
        }
        View::build(shape, &(0..nd).collect::<Vec<_>>(), &step, 0)
    }
    /// Every dimension reversed (negative strides).
    pub fn reversed(shape: &[i64]) -> View {
        let nd = shape.len();
        View::build(shape, &(0..nd).collect::<Vec<_>>(), &vec![-1; nd], 0)
    }
    /// The first dimension broadcast by a zero stride (inputs only).
    pub fn zero_stride(shape: &[i64]) -> View {
        let nd = shape.len();
        let mut step = vec![1; nd];
        if nd > 0 {
            step[0] = 0;
        }
        View::build(shape, &(0..nd).collect::<Vec<_>>(), &step, 0)
    }
    /// Contiguous, but one element past the storage's (aligned) start.
    pub fn misaligned(shape: &[i64]) -> View {
        let nd = shape.len();
        View::build(shape, &(0..nd).collect::<Vec<_>>(), &vec![1; nd], 1)
    }
    pub fn numel(&self) -> i64 {
        numel(&self.shape)
    }
    /// Whether this is a plain contiguous tensor filling its whole storage.
    pub fn is_plain(&self) -> bool {
        *self == View::contiguous(&self.shape)
    }
    /// Storage index of every element, in row-major order of the view.
    pub fn offsets(&self) -> Vec<usize> {
        let n = self.numel() as usize;
        let nd = self.shape.len();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0i64; nd];
        for _ in 0..n {
            let off: i64 = self.offset
                + idx
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<i64>();
            assert!(off >= 0 && off < self.storage_len);
            out.push(off as usize);
            for d in (0..nd).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
    /// The view as a buffer of `ctx` over storage that starts at `storage` (the
    /// element at `offset` is the view's first).
    ///
    /// # Safety
    /// `storage` holds `storage_len` elements of `dtype` that outlive the buffer.
    pub unsafe fn wrap_at(&self, ctx: &Ctx, dtype: fk_dtype, storage: *mut c_void) -> Buf {
        let data = storage
            .cast::<u8>()
            .wrapping_add(self.offset as usize * dsize(dtype));
        unsafe { Buf::wrap(ctx, data.cast(), dtype, &self.shape, Some(&self.strides)) }
    }
    /// The view's elements (row-major) out of storage values.
    pub fn gather(&self, storage: &[Cx]) -> Vec<Cx> {
        self.offsets().into_iter().map(|i| storage[i]).collect()
    }
}

/// The layout of `layouts(shape, false)` named `name` ("contiguous", "transposed", ...).
pub fn layout(shape: &[i64], name: &str) -> View {
    layouts(shape, false)
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no layout named {name}"))
        .1
}

/// Named layouts of `shape` that any operand may have (outputs: `zero_ok = false`).
pub fn layouts(shape: &[i64], zero_ok: bool) -> Vec<(&'static str, View)> {
    let mut v = vec![
        ("contiguous", View::contiguous(shape)),
        ("transposed", View::transposed(shape)),
        ("every-other", View::every_other(shape)),
        ("reversed", View::reversed(shape)),
        ("misaligned", View::misaligned(shape)),
    ];
    if zero_ok && shape.first().is_some_and(|&d| d > 1) {
        v.push(("zero-stride", View::zero_stride(shape)));
    }
    v
}

/// NumPy broadcast of two shapes (for the reference; `None` when incompatible).
pub fn broadcast_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let at = |s: &[i64], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

/// Row-major values of `shape` broadcast to `target`.
pub fn broadcast_to(vals: &[Cx], shape: &[i64], target: &[i64]) -> Vec<Cx> {
    let view = View {
        shape: target.to_vec(),
        strides: {
            let off = target.len() - shape.len();
            let cs = View::contiguous(shape).strides;
            (0..target.len())
                .map(|i| {
                    if i < off || shape[i - off] == 1 {
                        0
                    } else {
                        cs[i - off]
                    }
                })
                .collect()
        },
        offset: 0,
        storage_len: vals.len() as i64,
    };
    view.gather(vals)
}

// ------------------------------------------------------------------ operands on a device

/// Random storage values for an input laid out as `view`.
#[derive(Clone, Debug)]
pub struct Operand {
    pub view: View,
    pub storage: Vec<Cx>,
}

impl Operand {
    pub fn random(rng: &mut Rng, dtype: fk_dtype, view: View, dom: Domain) -> Operand {
        let storage = random_values(rng, dtype, view.storage_len as usize, dom);
        Operand { view, storage }
    }
    /// The view's logical values (row-major).
    pub fn values(&self) -> Vec<Cx> {
        self.view.gather(&self.storage)
    }
}

/// A view placed on a device: an owned 1-D storage buffer and, unless the view is
/// the plain storage itself, a borrowed strided wrap of it.
pub struct Placed {
    // Declared first: the wrap is destroyed before the storage it borrows.
    pub wrap: Option<Buf>,
    pub storage: Buf,
    pub view: View,
    pub dtype: fk_dtype,
}

impl Placed {
    /// Places storage bytes `bytes` (which must have `view.storage_len` elements).
    pub fn new(ctx: &Ctx, dtype: fk_dtype, view: &View, bytes: &[u8]) -> Placed {
        assert_eq!(bytes.len(), view.storage_len as usize * dsize(dtype));
        if view.is_plain() {
            // An owned buffer of the view's own shape.
            let storage = Buf::new(ctx, dtype, &view.shape);
            storage.write_bytes(bytes);
            return Placed {
                wrap: None,
                storage,
                view: view.clone(),
                dtype,
            };
        }
        let storage = Buf::new(ctx, dtype, &[view.storage_len]);
        storage.write_bytes(bytes);
        // SAFETY: the storage holds the view's storage_len elements and lives as long.
        let wrap = Some(unsafe { view.wrap_at(ctx, dtype, storage.data()) });
        Placed {
            wrap,
            storage,
            view: view.clone(),
            dtype,
        }
    }
    pub fn input(ctx: &Ctx, dtype: fk_dtype, op: &Operand) -> Placed {
        Placed::new(ctx, dtype, &op.view, &encode(dtype, &op.storage))
    }
    /// An output view whose whole storage is poisoned with 0xFF bytes (NaN in every
    /// dtype), so an element the op does not write reads back as NaN.
    pub fn poisoned(ctx: &Ctx, dtype: fk_dtype, view: &View) -> Placed {
        let bytes = vec![0xFFu8; view.storage_len as usize * dsize(dtype)];
        Placed::new(ctx, dtype, view, &bytes)
    }
    pub fn handle(&self) -> *mut fk_buffer {
        self.wrap.as_ref().unwrap_or(&self.storage).raw()
    }
    /// Reads the view's elements back, asserting that every storage element outside
    /// the view still holds the 0xFF poison (nothing was written out of bounds).
    pub fn read_checked(&self) -> Vec<Cx> {
        let bytes = self.storage.read_bytes();
        if self.wrap.is_none() {
            // The view is the whole storage: nothing lies outside it.
            return decode(self.dtype, &bytes);
        }
        let sz = dsize(self.dtype);
        let offs = self.view.offsets();
        let mut inside = vec![false; self.view.storage_len as usize];
        for &o in &offs {
            inside[o] = true;
        }
        for (i, chunk) in bytes.chunks_exact(sz).enumerate() {
            if !inside[i] {
                assert!(
                    chunk.iter().all(|&b| b == 0xFF),
                    "storage element {i}, outside the output view {:?}, was written",
                    self.view
                );
            }
        }
        offs.into_iter()
            .map(|o| decode_one(self.dtype, &bytes[o * sz..(o + 1) * sz]))
            .collect()
    }
}

// ------------------------------------------------------------------ DLPack
//
// Written from dlpack.h (DLPack 1.x), not taken from the crate, so that the tests
// also check the layout the library reads and writes.

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DLDevice {
    /// DLDeviceType: kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13.
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DLDataType {
    /// kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5.
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

pub const K_DL_CPU: i32 = 1;
pub const K_DL_CUDA: i32 = 2;
pub const K_DL_CUDA_HOST: i32 = 3;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const DL_READ_ONLY: u64 = 1;

/// What a test producer's tensor owns; its deleter counts its calls.
pub struct Producer {
    pub calls: Arc<AtomicUsize>,
    pub data: Vec<u8>,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
}

/// The deleter of tensors made by `make_tensor`: frees them and counts the call.
///
/// # Safety
/// `m` must come from `make_tensor` and not have been deleted yet.
pub unsafe extern "C" fn counting_deleter(m: *mut DLManagedTensorVersioned) {
    let m = unsafe { Box::from_raw(m) };
    let p = unsafe { Box::from_raw(m.manager_ctx as *mut Producer) };
    p.calls.fetch_add(1, Ordering::SeqCst);
}

/// A tensor made by `make_tensor`.
pub struct Made {
    pub managed: *mut DLManagedTensorVersioned,
    pub calls: Arc<AtomicUsize>,
    /// The host bytes behind it (or `data` as given).
    pub data: *mut u8,
}

impl Made {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A producer's DLPack 1.1 tensor over host `bytes` (or over `data` when given, e.g.
/// device memory; `bytes` is then ignored), with a counting deleter. NULL `strides`
/// means compact row-major.
pub fn make_tensor(
    bytes: Vec<u8>,
    data: Option<*mut c_void>,
    dtype: DLDataType,
    shape: &[i64],
    strides: Option<&[i64]>,
    device: DLDevice,
) -> Made {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut p = Box::new(Producer {
        calls: calls.clone(),
        data: bytes,
        shape: shape.to_vec(),
        strides: strides.map(|s| s.to_vec()).unwrap_or_default(),
    });
    let ptr = data.map_or(p.data.as_mut_ptr(), |d| d as *mut u8);
    let tensor = DLTensor {
        data: ptr as *mut c_void,
        device,
        ndim: shape.len() as i32,
        dtype,
        shape: p.shape.as_mut_ptr(),
        strides: if strides.is_some() {
            p.strides.as_mut_ptr()
        } else {
            null_mut()
        },
        byte_offset: 0,
    };
    let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: DLPackVersion { major: 1, minor: 1 },
        manager_ctx: Box::into_raw(p) as *mut c_void,
        deleter: Some(counting_deleter),
        flags: 0,
        dl_tensor: tensor,
    }));
    Made {
        managed,
        calls,
        data: ptr,
    }
}

/// `fk_buffer_from_dlpack`.
pub fn import_dlpack(ctx: &Ctx, m: *mut DLManagedTensorVersioned) -> Result<Buf, fk_status> {
    let mut p = null_mut();
    let s = unsafe { fk_buffer_from_dlpack(ctx.raw(), m as *mut c_void, &mut p) };
    if s == FK_OK {
        assert!(!p.is_null());
        Ok(Buf(p))
    } else {
        assert!(p.is_null());
        Err(s)
    }
}

/// `fk_buffer_to_dlpack`.
pub fn export_dlpack(b: &Buf) -> *mut DLManagedTensorVersioned {
    let mut p = null_mut();
    ok(unsafe { fk_buffer_to_dlpack(b.raw(), &mut p) });
    assert!(!p.is_null());
    p as *mut DLManagedTensorVersioned
}

/// Calls a tensor's own deleter (the consumer's duty).
///
/// # Safety
/// `m` must be a live managed tensor.
pub unsafe fn delete_dlpack(m: *mut DLManagedTensorVersioned) {
    unsafe { ((*m).deleter.expect("a deleter"))(m) }
}

// ------------------------------------------------------------------ GPU tests

/// The CUDA context of a `gpu_*` test: without a CUDA device it prints
/// "SKIPPED: no CUDA device" and returns `None`, unless `FK_REQUIRE_GPU=1`.
pub fn gpu() -> Option<Ctx> {
    if device_count() == 0 {
        if std::env::var("FK_REQUIRE_GPU").as_deref() == Ok("1") {
            let mut c = null_mut();
            let s = unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, 0, &mut c) };
            panic!(
                "FK_REQUIRE_GPU=1 but fk_device_count is 0 (FK_DEVICE_CUDA: {}: {})",
                status_name(s),
                last_error()
            );
        }
        println!("SKIPPED: no CUDA device");
        return None;
    }
    Some(Ctx::cuda(0))
}

/// What a CUDA-against-CPU test starts from: the CUDA context (`gpu()`: `None`
/// skips), the CPU context that is its oracle, and the test's generator seeded with
/// `seed`.
pub fn gpu_oracle(seed: u64) -> Option<(Ctx, Ctx, Rng)> {
    let g = gpu()?;
    Some((g, Ctx::cpu(), Rng::new(seed)))
}

/// `FK_SANITIZE=1` (under compute-sanitizer): tests shrink their sizes.
pub fn sanitizing() -> bool {
    std::env::var("FK_SANITIZE").is_ok_and(|v| !v.is_empty() && v != "0")
}
