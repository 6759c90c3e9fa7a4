//! XLA FFI handlers: fusekit's ops as XLA custom calls (JAX's `jax.ffi.ffi_call`),
//! on the CPU and on CUDA, with nothing compiled against jaxlib.
//!
//! Every handler is an `extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error`,
//! exported twice per op as `fk_xla_<op>_cpu` and `fk_xla_<op>_cuda` (XLA registers a
//! handler per (name, platform), and nothing in the call frame says which platform
//! calls; `fusekit/jax/__init__.py` registers each under its platform). One handler call:
//!
//! 1. **Metadata probe.** When the call frame's extension chain holds the metadata
//!    extension (XLA does this once, at registration), the handler writes the API
//!    version it implements (`api::API_MAJOR`.`api::API_MINOR`, 0.1) and its traits
//!    (`XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE` exactly for the ops that
//!    are capturable AND allocate nothing while captured: XLA nests a handler's
//!    capture in its command buffer as a child graph, and CUDA refuses a child
//!    graph that holds memory-allocation nodes (on the H100, the linear backward's
//!    stream-ordered scratch failed with CUDA_ERROR_NOT_SUPPORTED, "Failed to create
//!    a child graph node"). So the ops with stream-ordered scratch under capture
//!    (linear backward, the geodesic and optimizer ops) declare no trait and XLA
//!    runs them outside its graphs) and returns NULL.
//! 2. **Decoding** (`Call`): arguments and results as fusekit buffers wrapping
//!    XLA's memory (`Buffer::wrap`: a borrowed view, no copy), attributes by name
//!    (scalars; ints as i64, floats as f64, either accepted where the other is
//!    wanted), XLA's stream (CUDA), one fusekit context per (platform, device
//!    ordinal), created at the first call and shared by all of XLA's threads.
//! 3. **The op**, through the `ops::` layer: the same validation as the C ABI. An
//!    error becomes an `XLA_FFI_Error` whose message is `"<handler>: <fusekit's
//!    message> (<FK_STATUS>)"`; a panic is caught as in `abi::guard` and reported
//!    as an internal error. Nothing ever reads device memory on the host, so a
//!    handler may be traced into a CUDA graph with uninitialised inputs.
//!
//! The handlers and the few helpers (`fk_xla_call_count`, ...) are not part of
//! `include/fusekit.h` (they take XLA's types; docs/jax.md is their contract).

pub mod api;
mod elementwise;
mod gaussian;
mod geodesic;
mod linalg;
mod mlp;
mod optim;

use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use api::*;

use crate::buffer::Buffer;
use crate::context::{Context, FK_DEVICE_CPU, FK_DEVICE_CUDA, fk_device_kind};
use crate::dtype::DType;
use crate::error::{
    Error, FK_ERROR_INVALID_ARGUMENT, FK_ERROR_UNSUPPORTED_DTYPE, Result, fk_status, status_name,
};
use crate::stream::Stream;

/// The platform a handler was exported for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Platform {
    Cpu,
    Cuda,
}

/// Whether XLA may trace a handler into a command buffer (a CUDA graph).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Graph {
    Capturable,
    NotCapturable,
}

// ------------------------------------------------------------------ call counter

static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Turns the debug counter of handler executions on (`on != 0`) or off; returns
/// whether it was on. Off (the default), a handler pays one relaxed atomic load.
#[unsafe(no_mangle)]
pub extern "C" fn fk_xla_set_call_counting(on: i32) -> i32 {
    COUNTING.swap(on != 0, Ordering::Relaxed) as i32
}

/// How many times fusekit's XLA handlers were entered to execute (metadata probes
/// not counted) while the counter was on, since the process started. A handler
/// replayed from a CUDA graph is not entered, so this tells replays from calls.
#[unsafe(no_mangle)]
pub extern "C" fn fk_xla_call_count() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

// ------------------------------------------------------------------ contexts

static CPU_CONTEXT: OnceLock<Arc<Context>> = OnceLock::new();
static CUDA_CONTEXTS: Mutex<Vec<Option<Arc<Context>>>> = Mutex::new(Vec::new());

/// The handlers' context of `platform` / `ordinal`, created at first use.
pub(crate) fn context(platform: Platform, ordinal: usize) -> Result<Arc<Context>> {
    match platform {
        Platform::Cpu => Ok(CPU_CONTEXT.get_or_init(Context::cpu).clone()),
        Platform::Cuda => {
            let mut all = CUDA_CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(Some(c)) = all.get(ordinal) {
                return Ok(c.clone());
            }
            let c = Context::cuda(ordinal)?;
            if all.len() <= ordinal {
                all.resize(ordinal + 1, None);
            }
            all[ordinal] = Some(c.clone());
            Ok(c)
        }
    }
}

fn platform_of(kind: fk_device_kind) -> Result<Platform> {
    match kind {
        FK_DEVICE_CPU => Ok(Platform::Cpu),
        FK_DEVICE_CUDA => Ok(Platform::Cuda),
        _ => crate::bail!(
            FK_ERROR_INVALID_ARGUMENT,
            "kind = {kind} must be FK_DEVICE_CPU (1) or FK_DEVICE_CUDA (2)"
        ),
    }
}

/// Compiles (or loads from the kernel cache) every kernel module of the handlers'
/// context for `kind` / `ordinal`, so that no first call compiles while XLA
/// captures a CUDA graph. A no-op on the CPU. Returns an `fk_status`, with the
/// thread's last error message set on failure.
#[unsafe(no_mangle)]
pub extern "C" fn fk_xla_warmup(kind: fk_device_kind, ordinal: i32) -> fk_status {
    crate::abi::guard("fk_xla_warmup", || {
        let p = platform_of(kind)?;
        crate::ensure!(
            ordinal >= 0,
            FK_ERROR_INVALID_ARGUMENT,
            "ordinal = {ordinal} must be >= 0"
        );
        context(p, ordinal as usize)?.warmup(crate::cuda::modules())
    })
}

/// Bytes of the workspace result the Gaussian backward handlers take, for `b`
/// points and `n` Gaussians of `dtype` on `kind` (0 on the CPU), written to
/// `*bytes`. The same number as `fk_gaussian_backward_workspace_size` on a context
/// of that kind.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fk_xla_gaussian_workspace_bytes(
    kind: fk_device_kind,
    dtype: crate::dtype::fk_dtype,
    b: i64,
    n: i64,
    bytes: *mut usize,
) -> fk_status {
    crate::abi::guard("fk_xla_gaussian_workspace_bytes", || {
        let p = platform_of(kind)?;
        let d = DType::from_abi(dtype, "dtype")?;
        let v = match p {
            Platform::Cpu => crate::ops::gaussian::backward_workspace_bytes(
                &*context(Platform::Cpu, 0)?,
                d,
                b,
                n,
            )?,
            Platform::Cuda => {
                // the size is a function of (dtype, b, n) alone: checked as the ops
                // layer checks it, without opening a device
                crate::ops::gaussian::backward_workspace_bytes(
                    &*context(Platform::Cpu, 0)?,
                    d,
                    b,
                    n,
                )?;
                crate::cuda::gaussian::workspace_bytes(d, b, n)
            }
        };
        crate::ensure!(
            !bytes.is_null(),
            crate::error::FK_ERROR_NULL_POINTER,
            "bytes is NULL"
        );
        // SAFETY: non-NULL out-parameter of the caller.
        unsafe { bytes.write(v) };
        Ok(())
    })
}

// ------------------------------------------------------------------ decoding

/// What went wrong in a handler: fusekit's error, or one XLA's API returned (passed
/// on to XLA as it is).
enum Fail {
    Fk(Error),
    Xla(*mut XLA_FFI_Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Fk(e)
    }
}

fn invalid(msg: String) -> Error {
    Error::new(FK_ERROR_INVALID_ARGUMENT, msg)
}

/// One execution of a handler: the decoded call frame.
pub(crate) struct Call<'a> {
    frame: &'a XLA_FFI_CallFrame,
    pub ctx: Arc<Context>,
    pub stream: Arc<Stream>,
}

fn dtype_of(v: i32, what: &str) -> Result<DType> {
    Ok(match v {
        XLA_FFI_DATATYPE_F16 => DType::F16,
        XLA_FFI_DATATYPE_BF16 => DType::BF16,
        XLA_FFI_DATATYPE_F32 => DType::F32,
        XLA_FFI_DATATYPE_F64 => DType::F64,
        XLA_FFI_DATATYPE_C64 => DType::C64,
        XLA_FFI_DATATYPE_C128 => DType::C128,
        _ => crate::bail!(
            FK_ERROR_UNSUPPORTED_DTYPE,
            "{what} has XLA element type {v}, which is not a fusekit dtype (f16, bf16, f32, f64, complex64, complex128)"
        ),
    })
}

impl<'a> Call<'a> {
    /// Number of buffer arguments.
    pub fn n_args(&self) -> usize {
        self.frame.args.size.max(0) as usize
    }
    /// Number of buffer results.
    pub fn n_rets(&self) -> usize {
        self.frame.rets.size.max(0) as usize
    }

    /// Requires between `lo` and `hi` arguments and exactly... (inclusive bounds).
    pub fn expect(&self, args: (usize, usize), rets: (usize, usize)) -> Result<()> {
        let (na, nr) = (self.n_args(), self.n_rets());
        crate::ensure!(
            (args.0..=args.1).contains(&na) && (rets.0..=rets.1).contains(&nr),
            FK_ERROR_INVALID_ARGUMENT,
            "the call has {na} operands and {nr} results; this handler takes {} operands and {} results",
            range(args),
            range(rets)
        );
        Ok(())
    }

    fn wrap(&self, p: *mut c_void, what: &str) -> Result<Buffer> {
        crate::ensure!(
            !p.is_null(),
            FK_ERROR_INVALID_ARGUMENT,
            "{what} is NULL in the call frame"
        );
        // SAFETY: XLA passes an XLA_FFI_Buffer for every buffer operand and result.
        let b = unsafe { &*(p as *const XLA_FFI_Buffer) };
        let dtype = dtype_of(b.dtype, what)?;
        crate::ensure!(
            (0..=crate::layout::FK_MAX_DIMS as i64).contains(&b.rank),
            FK_ERROR_INVALID_ARGUMENT,
            "{what} has rank {}, more than fusekit's {} dimensions",
            b.rank,
            crate::layout::FK_MAX_DIMS
        );
        let dims: &[i64] = if b.rank == 0 {
            &[]
        } else {
            // SAFETY: `dims` holds `rank` entries (c_api.h).
            unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) }
        };
        // SAFETY: XLA's buffer of this call: memory of the call's device holding
        // `dims` dense elements of `dtype`, alive until the handler returns, which
        // the wrapped buffer (and any plan made from it) does not outlive.
        unsafe { Buffer::wrap(&self.ctx, b.data, dtype, dims, None) }.map_err(|e| e.context(what))
    }

    /// Buffer operand `i`, named `what` in messages.
    pub fn arg(&self, i: usize, what: &str) -> Result<Buffer> {
        let a = &self.frame.args;
        let list = (self.n_args(), a.types.cast_const(), a.args.cast_const());
        self.buffer_in("operand", list, XLA_FFI_ARGTYPE_BUFFER, i, what)
    }

    /// Buffer result `i`, named `what` in messages.
    pub fn ret(&self, i: usize, what: &str) -> Result<Buffer> {
        let r = &self.frame.rets;
        let list = (self.n_rets(), r.types.cast_const(), r.rets.cast_const());
        self.buffer_in("result", list, XLA_FFI_RETTYPE_BUFFER, i, what)
    }

    /// Result `i`, a workspace XLA allocated for the handler's scratch (any dtype):
    /// None when it is empty (the CPU backends need none).
    pub fn workspace(&self, i: usize) -> Result<Option<Buffer>> {
        let ws = self.ret(i, "workspace")?;
        Ok(if ws.nbytes() == 0 { None } else { Some(ws) })
    }

    /// Operand `i` when the call has it, None when it has fewer operands (a trailing
    /// optional operand; `expect` bounds the count).
    pub fn opt_arg(&self, i: usize, what: &str) -> Result<Option<Buffer>> {
        if i < self.n_args() {
            self.arg(i, what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Result `i` when the call has it, None when it has fewer results (as `opt_arg`).
    pub fn opt_ret(&self, i: usize, what: &str) -> Result<Option<Buffer>> {
        if i < self.n_rets() {
            self.ret(i, what).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Entry `i` of the frame's operands or results (`kind`), a list of `n` types
    /// and pointers, as a buffer (`buffer`: the list's type of a buffer entry).
    fn buffer_in(
        &self,
        kind: &str,
        (n, types, ptrs): (usize, *const i32, *const *mut c_void),
        buffer: i32,
        i: usize,
        what: &str,
    ) -> Result<Buffer> {
        crate::ensure!(
            i < n,
            FK_ERROR_INVALID_ARGUMENT,
            "{kind} {i} ({what}) is missing"
        );
        // SAFETY: `types` and the pointers hold `size` entries.
        let (t, p) = unsafe { (*types.add(i), *ptrs.add(i)) };
        crate::ensure!(
            t == buffer,
            FK_ERROR_INVALID_ARGUMENT,
            "{kind} {i} ({what}) is not a buffer"
        );
        self.wrap(p, what)
    }

    /// The scalar attribute `name` as (XLA dtype, pointer to its value), or None.
    fn scalar(&self, name: &str) -> Result<Option<(i32, *const c_void)>> {
        let a = &self.frame.attrs;
        for i in 0..a.size.max(0) as usize {
            // SAFETY: `types`, `names` and `attrs` hold `size` entries; a name is a
            // byte span (not NUL-terminated).
            let (t, n, p) = unsafe { (*a.types.add(i), &**a.names.add(i), *a.attrs.add(i)) };
            let key = unsafe { std::slice::from_raw_parts(n.ptr as *const u8, n.len) };
            if key != name.as_bytes() {
                continue;
            }
            crate::ensure!(
                t == XLA_FFI_ATTRTYPE_SCALAR,
                FK_ERROR_INVALID_ARGUMENT,
                "attribute {name} is not a scalar (XLA attribute type {t})"
            );
            // SAFETY: a scalar attribute is an XLA_FFI_Scalar.
            let s = unsafe { &*(p as *const XLA_FFI_Scalar) };
            return Ok(Some((s.dtype, s.value)));
        }
        Ok(None)
    }

    /// Integer attribute (any integer or bool type; a float with an integral value
    /// is accepted too).
    pub fn attr_i64_or(&self, name: &str, default: Option<i64>) -> Result<i64> {
        let Some((t, p)) = self.scalar(name)? else {
            return default.ok_or_else(|| invalid(format!("attribute {name} is missing")));
        };
        // SAFETY: `p` points to a value of type `t`.
        let v = unsafe {
            match t {
                XLA_FFI_DATATYPE_PRED | XLA_FFI_DATATYPE_S8 => *(p as *const i8) as i64,
                XLA_FFI_DATATYPE_U8 => *(p as *const u8) as i64,
                XLA_FFI_DATATYPE_S16 => *(p as *const i16) as i64,
                XLA_FFI_DATATYPE_U16 => *(p as *const u16) as i64,
                XLA_FFI_DATATYPE_S32 => *(p as *const i32) as i64,
                XLA_FFI_DATATYPE_U32 => *(p as *const u32) as i64,
                XLA_FFI_DATATYPE_S64 => *(p as *const i64),
                XLA_FFI_DATATYPE_U64 => {
                    let v = *(p as *const u64);
                    i64::try_from(v).map_err(|_| {
                        invalid(format!("attribute {name} = {v} does not fit in int64"))
                    })?
                }
                XLA_FFI_DATATYPE_F32 | XLA_FFI_DATATYPE_F64 => {
                    let f = if t == XLA_FFI_DATATYPE_F32 {
                        *(p as *const f32) as f64
                    } else {
                        *(p as *const f64)
                    };
                    crate::ensure!(
                        f.fract() == 0.0 && f.abs() < 9.0e15,
                        FK_ERROR_INVALID_ARGUMENT,
                        "attribute {name} = {f} must be an integer"
                    );
                    f as i64
                }
                _ => crate::bail!(
                    FK_ERROR_INVALID_ARGUMENT,
                    "attribute {name} has XLA type {t}; an integer is wanted"
                ),
            }
        };
        Ok(v)
    }

    pub fn attr_i64(&self, name: &str) -> Result<i64> {
        self.attr_i64_or(name, None)
    }

    /// Real attribute (f32 or f64; integers accepted).
    pub fn attr_f64_or(&self, name: &str, default: Option<f64>) -> Result<f64> {
        match self.scalar(name)? {
            None => default.ok_or_else(|| invalid(format!("attribute {name} is missing"))),
            // SAFETY: `p` points to a value of type `t`.
            Some((XLA_FFI_DATATYPE_F64, p)) => Ok(unsafe { *(p as *const f64) }),
            Some((XLA_FFI_DATATYPE_F32, p)) => Ok(unsafe { *(p as *const f32) } as f64),
            Some(_) => Ok(self.attr_i64(name)? as f64),
        }
    }

    pub fn attr_f64(&self, name: &str) -> Result<f64> {
        self.attr_f64_or(name, None)
    }

    /// A 32-bit set of flags (`flags` of the C ABI), 0 when absent.
    pub fn attr_flags(&self, name: &str) -> Result<u32> {
        let v = self.attr_i64_or(name, Some(0))?;
        u32::try_from(v).map_err(|_| invalid(format!("{name} = {v} is not a 32-bit set of flags")))
    }

    /// A boolean attribute (0 or 1), `default` when absent.
    pub fn attr_bool(&self, name: &str, default: bool) -> Result<bool> {
        match self.attr_i64_or(name, Some(default as i64))? {
            0 => Ok(false),
            1 => Ok(true),
            v => crate::bail!(
                FK_ERROR_INVALID_ARGUMENT,
                "attribute {name} = {v} must be 0 or 1"
            ),
        }
    }

    /// Operands in order, some of them optional: see `Cursor`.
    pub fn operands(&self) -> Cursor<'_, 'a> {
        Cursor {
            call: self,
            next: 0,
            take: Call::arg,
        }
    }

    /// Results in order, some of them optional: see `Cursor`.
    pub fn results(&self) -> Cursor<'_, 'a> {
        Cursor {
            call: self,
            next: 0,
            take: Call::ret,
        }
    }
}

/// A cursor over a call's operands (or results), for handlers whose optional
/// operands are present or not as attributes say (`has_f`, ...): each `next` /
/// `opt` takes the following one.
pub(crate) struct Cursor<'c, 'a> {
    call: &'c Call<'a>,
    next: usize,
    take: fn(&Call<'a>, usize, &str) -> Result<Buffer>,
}

impl Cursor<'_, '_> {
    pub fn next(&mut self, what: &str) -> Result<Buffer> {
        self.next += 1;
        (self.take)(self.call, self.next - 1, what)
    }
    pub fn opt(&mut self, present: bool, what: &str) -> Result<Option<Buffer>> {
        if present {
            self.next(what).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn range((lo, hi): (usize, usize)) -> String {
    if lo == hi {
        format!("{lo}")
    } else {
        format!("{lo} to {hi}")
    }
}

// ------------------------------------------------------------------ the entry

/// The XLA error code for a fusekit status.
fn error_code(status: fk_status) -> i32 {
    use crate::error::*;
    match status {
        FK_ERROR_OUT_OF_MEMORY => XLA_FFI_ERROR_CODE_RESOURCE_EXHAUSTED,
        FK_ERROR_CUDA_UNAVAILABLE => XLA_FFI_ERROR_CODE_UNAVAILABLE,
        FK_ERROR_LIBRARY_NOT_FOUND => XLA_FFI_ERROR_CODE_NOT_FOUND,
        FK_ERROR_UNSUPPORTED => XLA_FFI_ERROR_CODE_UNIMPLEMENTED,
        FK_ERROR_NOT_CONVERGED => XLA_FFI_ERROR_CODE_FAILED_PRECONDITION,
        FK_ERROR_KERNEL_COMPILE
        | FK_ERROR_CUDA
        | FK_ERROR_INTERNAL
        | FK_ERROR_IO
        | FK_ERROR_ABI_MISMATCH => XLA_FFI_ERROR_CODE_INTERNAL,
        _ => XLA_FFI_ERROR_CODE_INVALID_ARGUMENT,
    }
}

/// An `XLA_FFI_Error` made through the frame's API; the message is copied by XLA.
unsafe fn xla_error(api: *const XLA_FFI_Api, errc: i32, msg: &str) -> *mut XLA_FFI_Error {
    let create = if api.is_null() {
        None
    } else {
        // SAFETY: a non-NULL api pointer of the call frame; `error_create` is the
        // first function of every version's table, read only when covered.
        let api = unsafe { &*api };
        if api.struct_size >= end_of!(XLA_FFI_Api, error_create) {
            api.error_create
        } else {
            None
        }
    };
    let Some(create) = create else {
        // No way to report an error to XLA: returning NULL would claim success.
        eprintln!("fusekit: XLA handler error with no XLA_FFI_Error_Create to report it: {msg}");
        std::process::abort();
    };
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let mut args = XLA_FFI_Error_Create_Args {
        struct_size: XLA_FFI_ERROR_CREATE_ARGS_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc,
    };
    // SAFETY: XLA's own function with arguments of its layout.
    unsafe { create(&mut args) }
}

/// Answers the metadata probe when the frame carries the metadata extension.
unsafe fn answer_probe(frame: &XLA_FFI_CallFrame, graph: Graph) -> bool {
    let mut ext = frame.extension_start;
    while !ext.is_null() {
        // SAFETY: a chain of extensions, each starting with XLA_FFI_Extension_Base.
        let base = unsafe { &*ext };
        if base.type_ == XLA_FFI_EXTENSION_METADATA
            && base.struct_size >= end_of!(XLA_FFI_Metadata_Extension, metadata)
        {
            // SAFETY: the metadata extension's layout.
            let m = unsafe { (*(ext as *const XLA_FFI_Metadata_Extension)).metadata };
            if !m.is_null() {
                // SAFETY: XLA's metadata struct; fields written only when its size
                // covers them.
                let m = unsafe { &mut *m };
                if m.struct_size >= end_of!(XLA_FFI_Metadata, api_version) {
                    m.api_version.major_version = API_MAJOR;
                    m.api_version.minor_version = API_MINOR;
                }
                if m.struct_size >= end_of!(XLA_FFI_Metadata, traits) {
                    m.traits = match graph {
                        Graph::Capturable => XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE,
                        Graph::NotCapturable => 0,
                    };
                }
            }
            return true;
        }
        ext = base.next;
    }
    false
}

/// XLA's stream of this call (CUDA).
unsafe fn stream_of(
    frame: &XLA_FFI_CallFrame,
    api: &XLA_FFI_Api,
) -> std::result::Result<usize, Fail> {
    let get = if api.struct_size >= end_of!(XLA_FFI_Api, stream_get) {
        api.stream_get
    } else {
        None
    };
    let Some(get) = get else {
        return Err(Fail::Fk(invalid(
            "this XLA's FFI API has no XLA_FFI_Stream_Get".into(),
        )));
    };
    let mut args = XLA_FFI_Stream_Get_Args {
        struct_size: XLA_FFI_STREAM_GET_ARGS_STRUCT_SIZE,
        extension_start: std::ptr::null_mut(),
        ctx: frame.ctx,
        stream: std::ptr::null_mut(),
    };
    // SAFETY: XLA's function with arguments of its layout.
    let e = unsafe { get(&mut args) };
    if !e.is_null() {
        return Err(Fail::Xla(e));
    }
    Ok(args.stream as usize)
}

/// The CUDA device ordinal of this call: `XLA_FFI_DeviceOrdinal_Get` where the
/// framework's API (0.3 or newer) has it, else the device of XLA's stream.
unsafe fn ordinal_of(
    frame: &XLA_FFI_CallFrame,
    api: &XLA_FFI_Api,
    stream: usize,
) -> std::result::Result<usize, Fail> {
    let v = &api.api_version;
    let recent = (v.major_version, v.minor_version) >= (0, 3);
    let get = if recent && api.struct_size >= end_of!(XLA_FFI_Api, device_ordinal_get) {
        api.device_ordinal_get
    } else {
        None
    };
    if let Some(get) = get {
        let mut args = XLA_FFI_DeviceOrdinal_Get_Args {
            struct_size: XLA_FFI_DEVICE_ORDINAL_GET_ARGS_STRUCT_SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: frame.ctx,
            device_ordinal: -1,
        };
        // SAFETY: XLA's function with arguments of its layout.
        let e = unsafe { get(&mut args) };
        if !e.is_null() {
            return Err(Fail::Xla(e));
        }
        return usize::try_from(args.device_ordinal).map_err(|_| {
            Fail::Fk(invalid(format!(
                "XLA reports device ordinal {}",
                args.device_ordinal
            )))
        });
    }
    Ok(stream_device_ordinal(stream)?)
}

/// The device ordinal of a `CUstream` through the driver (`cuStreamGetCtx`, then
/// `cuCtxGetDevice` with that context pushed): for frameworks older than FFI 0.3.
fn stream_device_ordinal(stream: usize) -> Result<usize> {
    use crate::error::CudaContext;
    use cudarc::driver::sys;
    crate::gpu::driver()?;
    // SAFETY: plain driver queries on XLA's live stream; the pushed context is
    // popped before returning.
    unsafe {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        sys::cuStreamGetCtx(stream as sys::CUstream, &mut ctx)
            .result()
            .cuda("cuStreamGetCtx")?;
        sys::cuCtxPushCurrent_v2(ctx)
            .result()
            .cuda("cuCtxPushCurrent")?;
        let mut dev: sys::CUdevice = 0;
        let r = sys::cuCtxGetDevice(&mut dev).result();
        let mut old: sys::CUcontext = std::ptr::null_mut();
        let _ = sys::cuCtxPopCurrent_v2(&mut old);
        r.cuda("cuCtxGetDevice")?;
        Ok(dev as usize)
    }
}

/// Runs one handler call: the probe, or decoding, the op and error reporting.
///
/// # Safety
/// `frame` is NULL or XLA's call frame (or one built with the same layout).
pub(crate) unsafe fn entry(
    frame: *mut XLA_FFI_CallFrame,
    name: &str,
    platform: Platform,
    graph: Graph,
    body: fn(&Call) -> Result<()>,
) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: XLA's call frame.
    let api = unsafe { (*frame).api };
    let run = || -> std::result::Result<(), Fail> {
        // SAFETY: XLA's call frame; its leading fields exist in every version.
        let f = unsafe { &*frame };
        if unsafe { answer_probe(f, graph) } {
            return Ok(());
        }
        if f.stage != XLA_FFI_EXECUTION_STAGE_EXECUTE {
            return Ok(());
        }
        if f.struct_size < XLA_FFI_CALL_FRAME_STRUCT_SIZE || f.api.is_null() {
            return Err(Fail::Fk(invalid(format!(
                "the call frame is {} bytes, older than XLA FFI 0.1 ({XLA_FFI_CALL_FRAME_STRUCT_SIZE})",
                f.struct_size
            ))));
        }
        if COUNTING.load(Ordering::Relaxed) {
            CALLS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: checked non-NULL above; XLA's table.
        let api = unsafe { &*f.api };
        let (ctx, stream) = match platform {
            Platform::Cpu => {
                let ctx = context(Platform::Cpu, 0)?;
                let s = Stream::default_for(&ctx);
                (ctx, s)
            }
            Platform::Cuda => {
                let raw = unsafe { stream_of(f, api) }?;
                let ordinal = unsafe { ordinal_of(f, api, raw) }?;
                let ctx = context(Platform::Cuda, ordinal)?;
                let s = Stream::wrap(&ctx, raw)?;
                (ctx, s)
            }
        };
        let call = Call {
            frame: f,
            ctx,
            stream,
        };
        Ok(body(&call)?)
    };
    let msg = match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(Fail::Xla(e))) => return e,
        Ok(Err(Fail::Fk(e))) => (
            error_code(e.status),
            format!("{name}: {} ({})", e.message, status_name(e.status)),
        ),
        Err(payload) => {
            let m = crate::abi::panic_message(payload.as_ref());
            (
                XLA_FFI_ERROR_CODE_INTERNAL,
                format!(
                    "{name}: internal error (caught panic: {m}); please report it (FK_ERROR_INTERNAL)"
                ),
            )
        }
    };
    // SAFETY: the frame's api pointer (or NULL, handled there).
    unsafe { xla_error(api, msg.0, &msg.1) }
}

/// `handlers! { doc; op: cpu_symbol, cuda_symbol, Graph, body; ... }` exports each
/// op's two handlers.
macro_rules! handlers {
    (@one $(#[$doc:meta])* $platform:ident $name:literal, $sym:ident, $graph:expr, $body:expr) => {
        $(#[$doc])*
        ///
        #[doc = concat!(" XLA FFI handler for the ", $name, " platform (see `src/xla/mod.rs`).")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sym(
            frame: *mut $crate::xla::api::XLA_FFI_CallFrame,
        ) -> *mut $crate::xla::api::XLA_FFI_Error {
            // SAFETY: XLA's call frame.
            unsafe {
                $crate::xla::entry(frame, stringify!($sym), $crate::xla::Platform::$platform, $graph, $body)
            }
        }
    };
    ($($(#[$doc:meta])* $op:literal: $cpu:ident, $cuda:ident, $graph:expr, $body:expr;)*) => {$(
        handlers!(@one $(#[$doc])* Cpu "CPU", $cpu, $graph, $body);
        handlers!(@one $(#[$doc])* Cuda "CUDA", $cuda, $graph, $body);
    )*};
}
pub(crate) use handlers;

#[cfg(test)]
pub(crate) mod testing;
