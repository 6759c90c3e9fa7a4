//! Shared pieces of fusekit's fuzz targets (fuzz/fuzz_targets/*.rs): a byte reader
//! that turns the fuzzer's input into arguments, the oracle on every status, and
//! buffers a C host could legitimately pass (owned buffers, views of a host arena
//! whose every addressed element lies inside the arena, DLPack imports).
//!
//! Every fusekit call goes through the crate's `extern "C"` fk_* functions, exactly
//! as a C host calls them.

use std::ffi::{CStr, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicIsize, Ordering};

pub use fusekit::abi::core::*;
pub use fusekit::abi::elementwise::*;
pub use fusekit::abi::gaussian::*;
pub use fusekit::abi::geodesic::*;
pub use fusekit::abi::linalg::*;
pub use fusekit::abi::optim::*;
pub use fusekit::abi::runtime::*;
pub use fusekit::abi::{fk_buffer, fk_context, fk_event, fk_scalar, fk_stream};
pub use fusekit::dlpack::{
    DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
pub use fusekit::error::*;

/// AddressSanitizer defaults for every target, wherever it runs: an allocation
/// larger than 1 GiB returns NULL (fusekit must turn that into
/// FK_ERROR_OUT_OF_MEMORY) instead of aborting, and leaks are reported.
#[unsafe(no_mangle)]
pub extern "C" fn __asan_default_options() -> *const std::ffi::c_char {
    c"allocator_may_return_null=1:max_allocation_size_mb=1024:detect_leaks=1".as_ptr()
}

pub const DTYPES: [i32; 6] = [1, 2, 3, 4, 5, 6];

/// Reads arguments from the fuzzer's bytes; past the end every read is 0.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    pub fn u8(&mut self) -> u8 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.u8();
        }
        u64::from_le_bytes(b)
    }
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    /// An index below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }
    /// True with probability about 1/n.
    pub fn one_in(&mut self, n: u8) -> bool {
        self.u8() % n == 0
    }
    /// A dtype: mostly a valid one, sometimes an unknown value.
    pub fn dtype(&mut self) -> i32 {
        match self.u8() {
            0..=239 => DTYPES[self.below(6)],
            240..=243 => 0,
            244..=247 => 7,
            248..=251 => -1,
            _ => i32::MIN + self.u8() as i32,
        }
    }
    /// A dimension size: mostly 0..=4, sometimes huge or negative.
    pub fn dim(&mut self) -> i64 {
        match self.u8() {
            0..=229 => (self.u8() % 5) as i64,
            230..=235 => 5 + (self.u8() % 12) as i64,
            236..=239 => -1 - (self.u8() as i64),
            240..=243 => 1 << (31 + self.u8() % 32),
            244..=247 => i64::MAX - (self.u8() as i64),
            248..=251 => i64::MIN + (self.u8() as i64),
            // Raw bits, kept out of the range of sizes that allocate but take
            // seconds to compute (negative, or at least 2^31 elements).
            _ => {
                let v = self.u64() as i64;
                if v >= 0 { v | 1 << 31 } else { v }
            }
        }
    }
    /// A stride for a dimension whose contiguous stride is `natural`.
    pub fn stride(&mut self, natural: i64) -> i64 {
        match self.u8() {
            0..=99 => natural,
            100..=139 => 0,
            140..=179 => -natural,
            180..=219 => (self.u8() % 9) as i64 - 4,
            220..=239 => natural.saturating_mul(2),
            240..=247 => i64::MAX / (1 + self.u8() as i64),
            _ => self.u64() as i64,
        }
    }
    /// A scalar: ordinary values mostly, and every non-finite and extreme kind.
    pub fn f64(&mut self) -> f64 {
        match self.u8() {
            0..=159 => (self.u8() as i8) as f64 / 8.0,
            160..=169 => f64::NAN,
            170..=174 => f64::INFINITY,
            175..=179 => f64::NEG_INFINITY,
            180..=184 => -0.0,
            185..=189 => f64::MAX,
            190..=194 => f64::MIN_POSITIVE / 4.0,
            195..=199 => 1e-300,
            200..=204 => 1e30,
            205..=209 => -1e5,
            _ => f64::from_bits(self.u64()),
        }
    }
    pub fn scalar(&mut self) -> fk_scalar {
        let re = self.f64();
        let im = if self.one_in(6) { self.f64() } else { 0.0 };
        fk_scalar { re, im }
    }
}

/// The thread's last error message.
pub fn last_message() -> String {
    let p = fk_last_error_message();
    assert!(!p.is_null(), "fk_last_error_message returned NULL");
    // SAFETY: fusekit returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The oracle on every status: success, or a documented failure status (never
/// FK_ERROR_INTERNAL, a caught panic) whose message names the function and says
/// something after it. Returns whether the call succeeded.
#[track_caller]
pub fn check(status: fk_status, name: &str) -> bool {
    if status == FK_OK {
        return true;
    }
    let msg = last_message();
    assert!(
        status != FK_ERROR_INTERNAL,
        "{name} returned FK_ERROR_INTERNAL (a panic): {msg}"
    );
    assert!(
        ALL_STATUSES.contains(&status),
        "{name} returned the unknown status {status}: {msg}"
    );
    let prefix = format!("{name}: ");
    assert!(
        msg.starts_with(&prefix) && msg.len() > prefix.len(),
        "{name} failed with {} but the message does not name it: {msg:?}",
        status_name(status)
    );
    false
}

/// A CPU context (the fuzz targets never touch CUDA). The first call pins the CPU
/// backend's thread pools (rayon, matrixmultiply) to one thread: executions stay
/// deterministic and do not wait on worker wake-ups.
pub fn cpu_context() -> *mut fk_context {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs before fusekit starts any thread (its first call is below).
        unsafe {
            std::env::set_var("RAYON_NUM_THREADS", "1");
            std::env::set_var("MATMUL_NUM_THREADS", "1");
        }
    });
    let mut ctx = null_mut();
    // SAFETY: valid out-parameter.
    let st = unsafe { fk_context_create(fk_abi_version(), 1, 0, &mut ctx) };
    assert!(check(st, "fk_context_create") && !ctx.is_null());
    ctx
}

/// Element size of a valid dtype (1..=6), 0 otherwise.
pub fn elem_size(dtype: i32) -> usize {
    match dtype {
        1 | 2 => 2,
        3 => 4,
        4 | 5 => 8,
        6 => 16,
        _ => 0,
    }
}

/// Lowest and highest element offset a (shape, strides) view addresses, in i128
/// so that no input overflows here; None when it has no elements.
pub fn extent(shape: &[i64], strides: &[i64]) -> Option<(i128, i128)> {
    if shape.iter().any(|&d| d == 0) {
        return None;
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        // Saturating: anything near the i128 limits fits nowhere anyway.
        let span = (d as i128 - 1).saturating_mul(s as i128);
        if span < 0 {
            lo = lo.saturating_add(span)
        } else {
            hi = hi.saturating_add(span)
        }
    }
    Some((lo, hi))
}

pub fn contiguous(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc = acc.saturating_mul(shape[i].max(1));
    }
    s
}

/// Host memory that views are cut from; 16-byte aligned.
pub struct Arena {
    mem: Vec<u128>,
}

pub const ARENA_BYTES: usize = 4096;

impl Arena {
    pub fn new(b: &mut Bytes) -> Self {
        let mut mem = vec![0u128; ARENA_BYTES / 16];
        // A pattern of small values, with raw fuzzer bytes at the start.
        let seed = b.u8() as u128;
        for (i, x) in mem.iter_mut().enumerate() {
            *x = (i as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835) ^ seed;
        }
        Arena { mem }
    }
    /// Whether every element a view at `data` addresses lies inside the arena
    /// (always for a view without elements).
    pub fn contains(&self, data: *mut u8, dtype: i32, shape: &[i64], strides: &[i64]) -> bool {
        let Some((lo, hi)) = extent(shape, strides) else {
            return true;
        };
        let es = elem_size(dtype) as i128;
        let base = self.mem.as_ptr() as i128;
        let (a, z) = (
            (data as i128).saturating_add(lo.saturating_mul(es)),
            (data as i128)
                .saturating_add(hi.saturating_mul(es))
                .saturating_add(es),
        );
        es > 0 && a >= base && z <= base + ARENA_BYTES as i128 && (data as i128 - base) % es == 0
    }
    pub fn snapshot(&self) -> Vec<u128> {
        self.mem.clone()
    }
    /// Asserts that the only arena bytes that changed since `before` belong to `out`.
    pub fn assert_only_changed(&self, before: &[u128], out: &View) {
        let base = self.mem.as_ptr() as usize;
        let es = elem_size(out.dtype);
        let mut allowed = vec![false; ARENA_BYTES];
        for_each_index(&out.shape, |idx| {
            let p = out.data as isize + byte_offset(out, idx);
            let off = p - base as isize;
            if off >= 0 && (off as usize) < ARENA_BYTES {
                for k in 0..es {
                    allowed[off as usize + k] = true;
                }
            }
        });
        let (now, was) = (self.bytes_of(&self.mem), self.bytes_of(before));
        for i in 0..ARENA_BYTES {
            assert!(
                now[i] == was[i] || allowed[i],
                "arena byte {i} outside out changed"
            );
        }
    }
    fn bytes_of<'b>(&self, m: &'b [u128]) -> &'b [u8] {
        // SAFETY: plain bytes of a u128 slice.
        unsafe { std::slice::from_raw_parts(m.as_ptr() as *const u8, m.len() * 16) }
    }
    pub fn base(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr() as *mut u8
    }
    /// Where a view of (dtype, shape, strides) may start so that every element it
    /// addresses lies inside the arena (`pick` chooses among the candidates); None
    /// when it cannot fit.
    pub fn place(
        &mut self,
        dtype: i32,
        shape: &[i64],
        strides: &[i64],
        pick: u16,
    ) -> Option<*mut u8> {
        let es = elem_size(dtype) as i128;
        if es == 0 {
            return None;
        }
        let Some((lo, hi)) = extent(shape, strides) else {
            return Some(self.base());
        };
        let (lo_b, hi_b) = (
            lo.saturating_mul(es),
            hi.saturating_mul(es).saturating_add(es),
        );
        let room = (ARENA_BYTES as i128).saturating_sub(hi_b.saturating_sub(lo_b));
        if room < 0 {
            return None;
        }
        let slots = room / es + 1;
        let start = -lo_b + (pick as i128 % slots) * es;
        // SAFETY: start is within the arena.
        Some(unsafe { self.base().add(start as usize) })
    }
}

/// Handles made during one execution, destroyed at its end.
#[derive(Default)]
pub struct Owned {
    pub buffers: Vec<*mut fk_buffer>,
}

impl Owned {
    pub fn push(&mut self, b: *mut fk_buffer) -> *mut fk_buffer {
        if !b.is_null() {
            self.buffers.push(b);
        }
        b
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        for &b in self.buffers.iter().rev() {
            // SAFETY: each was made by fusekit and is destroyed once.
            assert!(check(unsafe { fk_buffer_destroy(b) }, "fk_buffer_destroy"));
        }
    }
}

/// Creates an owned buffer of `shape` and fills it from the fuzzer (a pattern of
/// small values, some raw bytes). Null when fusekit refuses the shape.
pub fn owned_buffer(
    ctx: *const fk_context,
    dtype: i32,
    shape: &[i64],
    b: &mut Bytes,
) -> *mut fk_buffer {
    let mut out = null_mut();
    // SAFETY: valid pointers.
    let st = unsafe {
        fk_buffer_create(
            ctx,
            dtype,
            shape.len() as i32,
            shape.as_ptr(),
            std::ptr::null(),
            &mut out,
        )
    };
    if !check(st, "fk_buffer_create") {
        return null_mut();
    }
    let mut nbytes = 0usize;
    // SAFETY: live buffer.
    assert!(check(
        unsafe { fk_buffer_nbytes(out, &mut nbytes) },
        "fk_buffer_nbytes"
    ));
    if nbytes > 0 && nbytes <= 1 << 16 {
        let mut host = vec![0u8; nbytes];
        fill(&mut host, dtype, b);
        // SAFETY: host holds nbytes bytes.
        let st = unsafe {
            fk_buffer_copy_from_host(
                out,
                host.as_ptr() as *const c_void,
                nbytes,
                std::ptr::null(),
            )
        };
        assert!(
            check(st, "fk_buffer_copy_from_host"),
            "copy into a fresh buffer failed"
        );
    }
    out
}

/// Fills `host` with elements of `dtype`: small values, and now and then a value
/// taken from the fuzzer (non-finite ones included).
pub fn fill(host: &mut [u8], dtype: i32, b: &mut Bytes) {
    let es = elem_size(dtype).max(1);
    let seed = b.u8() as i64;
    for (i, chunk) in host.chunks_exact_mut(es).enumerate() {
        let v = if b.one_in(16) {
            b.f64()
        } else {
            ((i as i64 * 7 + seed) % 9 - 4) as f64 / 2.0
        };
        write_elem(chunk, dtype, v);
    }
}

pub fn write_elem(dst: &mut [u8], dtype: i32, v: f64) {
    match dtype {
        1 => dst.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        2 => dst.copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        3 => dst.copy_from_slice(&(v as f32).to_le_bytes()),
        4 => dst.copy_from_slice(&v.to_le_bytes()),
        5 => {
            dst[..4].copy_from_slice(&(v as f32).to_le_bytes());
            dst[4..].copy_from_slice(&((v * 0.5) as f32).to_le_bytes());
        }
        6 => {
            dst[..8].copy_from_slice(&v.to_le_bytes());
            dst[8..].copy_from_slice(&(-v).to_le_bytes());
        }
        _ => {}
    }
}

/// Reads one real element (f16, bf16, f32, f64) at `p`.
///
/// # Safety
/// `p` must address a readable element of that dtype.
pub unsafe fn read_real(p: *const u8, dtype: i32) -> f64 {
    unsafe {
        match dtype {
            1 => half::f16::from_bits((p as *const u16).read_unaligned()).to_f64(),
            2 => half::bf16::from_bits((p as *const u16).read_unaligned()).to_f64(),
            3 => (p as *const f32).read_unaligned() as f64,
            4 => (p as *const f64).read_unaligned(),
            _ => unreachable!("read_real of dtype {dtype}"),
        }
    }
}

/// `v` rounded to a real dtype.
pub fn round_to(v: f64, dtype: i32) -> f64 {
    match dtype {
        1 => half::f16::from_f64(v).to_f64(),
        2 => half::bf16::from_f64(v).to_f64(),
        3 => v as f32 as f64,
        _ => v,
    }
}

/// Largest finite value of a real dtype.
pub fn max_finite(dtype: i32) -> f64 {
    match dtype {
        1 => 65504.0,
        2 => half::bf16::MAX.to_f64(),
        3 => f32::MAX as f64,
        _ => f64::MAX,
    }
}

/// What one buffer handle looks like through the ABI's getters.
pub struct View {
    pub dtype: i32,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub data: *mut u8,
}

/// Queries a live buffer through the getters, checking that they agree.
pub fn view(buf: *const fk_buffer) -> View {
    let (mut dtype, mut ndim, mut data) = (0i32, 0i32, null_mut::<c_void>());
    let mut shape = [0i64; 8];
    let mut strides = [0i64; 8];
    let (mut numel, mut contig) = (0i64, 0i32);
    // SAFETY: live buffer, valid out-parameters (8 = FK_MAX_DIMS entries).
    unsafe {
        assert!(check(fk_buffer_dtype(buf, &mut dtype), "fk_buffer_dtype"));
        assert!(check(fk_buffer_ndim(buf, &mut ndim), "fk_buffer_ndim"));
        assert!(check(
            fk_buffer_shape(buf, shape.as_mut_ptr()),
            "fk_buffer_shape"
        ));
        assert!(check(
            fk_buffer_strides(buf, strides.as_mut_ptr()),
            "fk_buffer_strides"
        ));
        assert!(check(fk_buffer_data(buf, &mut data), "fk_buffer_data"));
        assert!(check(fk_buffer_numel(buf, &mut numel), "fk_buffer_numel"));
        assert!(check(
            fk_buffer_is_contiguous(buf, &mut contig),
            "fk_buffer_is_contiguous"
        ));
    }
    assert!((0..=8).contains(&ndim), "fk_buffer_ndim gave {ndim}");
    let nd = ndim as usize;
    let shape = shape[..nd].to_vec();
    let strides = strides[..nd].to_vec();
    let product = shape.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    assert_eq!(
        product,
        Some(numel),
        "fk_buffer_numel disagrees with the shape {shape:?}"
    );
    let dense = numel == 0
        || shape
            .iter()
            .zip(contiguous(&shape))
            .zip(&strides)
            .all(|((&d, c), &s)| d == 1 || c == s);
    assert_eq!(
        contig != 0,
        dense,
        "fk_buffer_is_contiguous for {shape:?} / {strides:?}"
    );
    View {
        dtype,
        shape,
        strides,
        data: data as *mut u8,
    }
}

/// Row-major indices of a shape, calling `f` with each multi-index.
pub fn for_each_index(shape: &[i64], mut f: impl FnMut(&[i64])) {
    if shape.iter().any(|&d| d <= 0) {
        return;
    }
    let mut idx = vec![0i64; shape.len()];
    loop {
        f(&idx);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Byte offset of a multi-index in a view.
pub fn byte_offset(v: &View, idx: &[i64]) -> isize {
    let es = elem_size(v.dtype) as isize;
    idx.iter()
        .zip(&v.strides)
        .map(|(&i, &s)| i as isize * s as isize)
        .sum::<isize>()
        * es
}

/// Live managed tensors made by `managed_tensor` and not yet deleted.
pub static LIVE_MANAGED: AtomicIsize = AtomicIsize::new(0);

#[repr(C)]
struct Holder {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn holder_deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: `m` is the first field of a boxed Holder made by managed_tensor.
    drop(unsafe { Box::from_raw(m as *mut Holder) });
    let left = LIVE_MANAGED.fetch_sub(1, Ordering::SeqCst);
    assert!(
        left > 0,
        "a DLPack deleter ran more often than tensors were made"
    );
}

/// The deleter `managed_tensor` installs, for freeing a tensor by hand.
pub fn holder_deleter_ptr() -> *const c_void {
    holder_deleter as *const c_void
}

/// A `DLManagedTensorVersioned` as a DLPack producer would make it, over `data`
/// (which must outlive it); freed by its deleter.
#[allow(clippy::too_many_arguments)]
pub fn managed_tensor(
    version: (u32, u32),
    device: DLDevice,
    dtype: DLDataType,
    data: *mut u8,
    byte_offset: u64,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    flags: u64,
    shape_null: bool,
) -> *mut DLManagedTensorVersioned {
    let ndim = shape.len() as i32;
    let has_strides = strides.is_some();
    let mut h = Box::new(Holder {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: version.0,
                minor: version.1,
            },
            manager_ctx: null_mut(),
            deleter: Some(holder_deleter),
            flags,
            dl_tensor: DLTensor {
                data: data as *mut c_void,
                device,
                ndim,
                dtype,
                shape: null_mut(),
                strides: null_mut(),
                byte_offset,
            },
        },
        shape,
        strides: strides.unwrap_or_default(),
    });
    if !shape_null {
        h.managed.dl_tensor.shape = h.shape.as_mut_ptr();
    }
    if has_strides {
        h.managed.dl_tensor.strides = h.strides.as_mut_ptr();
    }
    LIVE_MANAGED.fetch_add(1, Ordering::SeqCst);
    Box::into_raw(h) as *mut DLManagedTensorVersioned
}

/// The DLPack dtype of a fusekit dtype.
pub fn dl_dtype(dtype: i32) -> DLDataType {
    let (code, bits) = match dtype {
        1 => (2, 16),
        2 => (4, 16),
        3 => (2, 32),
        4 => (2, 64),
        5 => (5, 64),
        6 => (5, 128),
        _ => (2, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// Builds the buffer arguments of one op call: mostly the shape the op wants,
/// otherwise NULL, another dtype, a perturbed shape, a strided view of the arena
/// (zero, negative, overlapping strides), an exact alias of an earlier argument, a
/// view overlapping an earlier one, a read-only DLPack import, or a handle of the
/// wrong kind.
pub struct Maker {
    pub ctx: *mut fk_context,
    pub arena: Arena,
    pub owned: Owned,
    pub made: Vec<*mut fk_buffer>,
    pub stream: *mut fk_stream,
    last_view: Option<(i32, Vec<i64>, Vec<i64>, *mut u8)>,
}

impl Maker {
    pub fn new(b: &mut Bytes) -> Self {
        let ctx = cpu_context();
        let mut stream = null_mut();
        // SAFETY: live context, valid out-parameter.
        assert!(check(
            unsafe { fk_stream_create(ctx, &mut stream) },
            "fk_stream_create"
        ));
        Maker {
            ctx,
            arena: Arena::new(b),
            owned: Owned::default(),
            made: vec![],
            stream,
            last_view: None,
        }
    }

    /// The stream argument of a call: NULL, a stream of the context, or a handle of
    /// the wrong kind.
    pub fn stream_arg(&mut self, b: &mut Bytes) -> *const fk_stream {
        match b.u8() {
            0..=199 => std::ptr::null(),
            200..=249 => self.stream,
            _ => self.ctx as *const fk_stream,
        }
    }

    fn view(
        &mut self,
        dtype: i32,
        shape: &[i64],
        strides: Vec<i64>,
        at: *mut u8,
    ) -> *mut fk_buffer {
        let mut out = null_mut();
        // SAFETY: every element the view addresses lies in the arena.
        let st = unsafe {
            fk_buffer_wrap(
                self.ctx,
                at as *mut c_void,
                dtype,
                shape.len() as i32,
                shape.as_ptr(),
                strides.as_ptr(),
                &mut out,
            )
        };
        if !check(st, "fk_buffer_wrap") {
            return null_mut();
        }
        self.last_view = Some((dtype, shape.to_vec(), strides, at));
        self.owned.push(out)
    }

    fn strided(&mut self, b: &mut Bytes, dtype: i32, shape: &[i64]) -> *mut fk_buffer {
        let strides: Vec<i64> = contiguous(shape).into_iter().map(|n| b.stride(n)).collect();
        let pick = b.u16();
        match self.arena.place(dtype, shape, &strides, pick) {
            Some(at) => self.view(dtype, shape, strides, at),
            None => self.owned(b, dtype, shape),
        }
    }

    fn owned(&mut self, b: &mut Bytes, dtype: i32, shape: &[i64]) -> *mut fk_buffer {
        let buf = owned_buffer(self.ctx, dtype, shape, b);
        self.owned.push(buf)
    }

    /// An argument meant to be a `dtype` buffer of `shape`.
    pub fn arg(&mut self, b: &mut Bytes, dtype: i32, shape: &[i64]) -> *mut fk_buffer {
        let buf = match b.u8() {
            0..=149 => self.owned(b, dtype, shape),
            150..=174 => self.strided(b, dtype, shape),
            175..=184 => null_mut(),
            185..=194 => {
                let d = b.dtype();
                self.owned(b, d, shape)
            }
            195..=209 => {
                let mut s = shape.to_vec();
                match b.u8() % 4 {
                    0 if !s.is_empty() => {
                        let i = b.below(s.len());
                        s[i] = b.dim();
                    }
                    1 if s.len() < 8 => s.insert(b.below(s.len() + 1), b.dim()),
                    2 if !s.is_empty() => {
                        s.remove(b.below(s.len()));
                    }
                    _ => {
                        if let Some(x) = s.last_mut() {
                            *x += 1
                        }
                    }
                }
                self.owned(b, dtype, &s)
            }
            210..=224 if !self.made.is_empty() => self.made[b.below(self.made.len())],
            225..=234 => self.read_only(b, dtype, shape),
            235..=239 => self.stream as *mut fk_buffer,
            240..=255 if self.last_view.is_some() => {
                // Same dtype, shape and strides as the last view, shifted by a few
                // elements: a partial overlap.
                let (d, s, st, at) = self.last_view.clone().unwrap();
                let shift = (b.u8() % 7) as isize - 3;
                let es = elem_size(d) as isize;
                let base = self.arena.base() as isize;
                let (lo, hi) = extent(&s, &st)
                    .map(|(l, h)| (l as isize * es, h as isize * es + es))
                    .unwrap_or((0, 0));
                let start = at as isize + shift * es;
                if start + lo >= base && start + hi <= base + ARENA_BYTES as isize {
                    self.view(d, &s, st, start as *mut u8)
                } else {
                    self.strided(b, dtype, shape)
                }
            }
            _ => self.strided(b, dtype, shape),
        };
        if !buf.is_null() && buf != self.stream as *mut fk_buffer {
            self.made.push(buf);
        }
        buf
    }

    /// A read-only DLPack import of a contiguous arena view.
    fn read_only(&mut self, b: &mut Bytes, dtype: i32, shape: &[i64]) -> *mut fk_buffer {
        let strides = contiguous(shape);
        let pick = b.u16();
        let Some(at) = self.arena.place(dtype, shape, &strides, pick) else {
            return self.owned(b, dtype, shape);
        };
        let m = managed_tensor(
            (1, 1),
            DLDevice {
                device_type: 1,
                device_id: 0,
            },
            dl_dtype(dtype),
            at,
            0,
            shape.to_vec(),
            None,
            1,
            false,
        );
        let mut out = null_mut();
        // SAFETY: a valid managed tensor over arena memory.
        let st = unsafe { fk_buffer_from_dlpack(self.ctx, m as *mut c_void, &mut out) };
        if !check(st, "fk_buffer_from_dlpack") {
            // SAFETY: ownership stayed with us on failure.
            unsafe { (*m).deleter.unwrap()(m) };
            return null_mut();
        }
        self.owned.push(out)
    }
}

impl Drop for Maker {
    fn drop(&mut self) {
        for b in std::mem::take(&mut self.owned.buffers).into_iter().rev() {
            // SAFETY: made by fusekit, destroyed once.
            assert!(check(unsafe { fk_buffer_destroy(b) }, "fk_buffer_destroy"));
        }
        // SAFETY: live handles, destroyed once.
        unsafe {
            assert!(check(fk_stream_destroy(self.stream), "fk_stream_destroy"));
            assert!(check(fk_context_destroy(self.ctx), "fk_context_destroy"));
        }
        assert_eq!(
            LIVE_MANAGED.load(Ordering::SeqCst),
            0,
            "a DLPack deleter did not run"
        );
    }
}
