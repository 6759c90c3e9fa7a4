//! Status codes, the crate's `Error`, and the thread-local last-error message.
//!
//! Status values are part of the ABI: they are explicit, never renumbered and only
//! ever added. The constants below are copied verbatim into `include/fusekit.h` by
//! cbindgen; `status_name` is the single table of their names.

use std::cell::RefCell;
use std::ffi::CString;

/// Result status of every fusekit entry point (`int32_t`; 0 is success).
#[allow(non_camel_case_types)]
pub type fk_status = i32;

/// Success.
pub const FK_OK: fk_status = 0;
/// An argument has an invalid value (an unknown enum value, a negative size, a
/// non-finite scalar where a finite one is required, ...).
pub const FK_ERROR_INVALID_ARGUMENT: fk_status = 1;
/// A required pointer argument is NULL.
pub const FK_ERROR_NULL_POINTER: fk_status = 2;
/// The element type is not supported by this operation.
pub const FK_ERROR_UNSUPPORTED_DTYPE: fk_status = 3;
/// Shapes of the arguments do not agree.
pub const FK_ERROR_SHAPE_MISMATCH: fk_status = 4;
/// Arguments live on different devices (or a stream belongs to another device).
pub const FK_ERROR_DEVICE_MISMATCH: fk_status = 5;
/// An output overlaps an input in a way the operation does not allow.
pub const FK_ERROR_ALIASING: fk_status = 6;
/// An allocation failed (device or host memory).
pub const FK_ERROR_OUT_OF_MEMORY: fk_status = 7;
/// CUDA was requested but no usable driver or device is present.
pub const FK_ERROR_CUDA_UNAVAILABLE: fk_status = 8;
/// A run-time dependency (libnvrtc, the CUDA headers, ...) could not be found.
pub const FK_ERROR_LIBRARY_NOT_FOUND: fk_status = 9;
/// NVRTC failed to compile a kernel module (the message holds the compiler log).
pub const FK_ERROR_KERNEL_COMPILE: fk_status = 10;
/// A CUDA driver call failed (the message names the call and the driver's error).
pub const FK_ERROR_CUDA: fk_status = 11;
/// The caller was built against an incompatible `FK_ABI_VERSION`.
pub const FK_ERROR_ABI_MISMATCH: fk_status = 12;
/// A caller-provided output buffer (e.g. for a message) is too small.
pub const FK_ERROR_BUFFER_TOO_SMALL: fk_status = 13;
/// The operation is not supported by this backend or in this configuration.
pub const FK_ERROR_UNSUPPORTED: fk_status = 14;
/// An internal error (a Rust panic was caught at the ABI boundary). Please report it.
pub const FK_ERROR_INTERNAL: fk_status = 15;
/// An I/O error (kernel cache directory, ...).
pub const FK_ERROR_IO: fk_status = 16;
/// Arguments that must share an element type do not.
pub const FK_ERROR_DTYPE_MISMATCH: fk_status = 17;
/// An iterative method did not reach its tolerance (the outputs hold its last
/// iterate; the message gives the residual).
pub const FK_ERROR_NOT_CONVERGED: fk_status = 18;

/// Static name of a status, e.g. `"FK_ERROR_SHAPE_MISMATCH"`.
pub fn status_name(s: fk_status) -> &'static str {
    match s {
        FK_OK => "FK_OK",
        FK_ERROR_INVALID_ARGUMENT => "FK_ERROR_INVALID_ARGUMENT",
        FK_ERROR_NULL_POINTER => "FK_ERROR_NULL_POINTER",
        FK_ERROR_UNSUPPORTED_DTYPE => "FK_ERROR_UNSUPPORTED_DTYPE",
        FK_ERROR_SHAPE_MISMATCH => "FK_ERROR_SHAPE_MISMATCH",
        FK_ERROR_DEVICE_MISMATCH => "FK_ERROR_DEVICE_MISMATCH",
        FK_ERROR_ALIASING => "FK_ERROR_ALIASING",
        FK_ERROR_OUT_OF_MEMORY => "FK_ERROR_OUT_OF_MEMORY",
        FK_ERROR_CUDA_UNAVAILABLE => "FK_ERROR_CUDA_UNAVAILABLE",
        FK_ERROR_LIBRARY_NOT_FOUND => "FK_ERROR_LIBRARY_NOT_FOUND",
        FK_ERROR_KERNEL_COMPILE => "FK_ERROR_KERNEL_COMPILE",
        FK_ERROR_CUDA => "FK_ERROR_CUDA",
        FK_ERROR_ABI_MISMATCH => "FK_ERROR_ABI_MISMATCH",
        FK_ERROR_BUFFER_TOO_SMALL => "FK_ERROR_BUFFER_TOO_SMALL",
        FK_ERROR_UNSUPPORTED => "FK_ERROR_UNSUPPORTED",
        FK_ERROR_INTERNAL => "FK_ERROR_INTERNAL",
        FK_ERROR_IO => "FK_ERROR_IO",
        FK_ERROR_DTYPE_MISMATCH => "FK_ERROR_DTYPE_MISMATCH",
        FK_ERROR_NOT_CONVERGED => "FK_ERROR_NOT_CONVERGED",
        _ => "FK_UNKNOWN_STATUS",
    }
}

/// Every status value, in order (used by tests and bindings generators).
pub const ALL_STATUSES: [fk_status; 19] = [
    FK_OK,
    FK_ERROR_INVALID_ARGUMENT,
    FK_ERROR_NULL_POINTER,
    FK_ERROR_UNSUPPORTED_DTYPE,
    FK_ERROR_SHAPE_MISMATCH,
    FK_ERROR_DEVICE_MISMATCH,
    FK_ERROR_ALIASING,
    FK_ERROR_OUT_OF_MEMORY,
    FK_ERROR_CUDA_UNAVAILABLE,
    FK_ERROR_LIBRARY_NOT_FOUND,
    FK_ERROR_KERNEL_COMPILE,
    FK_ERROR_CUDA,
    FK_ERROR_ABI_MISMATCH,
    FK_ERROR_BUFFER_TOO_SMALL,
    FK_ERROR_UNSUPPORTED,
    FK_ERROR_INTERNAL,
    FK_ERROR_IO,
    FK_ERROR_DTYPE_MISMATCH,
    FK_ERROR_NOT_CONVERGED,
];

/// The crate's error: a status and a human-readable message naming the argument
/// and the cause. The ABI layer prefixes the entry point's name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub status: fk_status,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(status: fk_status, message: impl Into<String>) -> Self {
        Error {
            status,
            message: message.into(),
        }
    }

    /// Prefixes the message with `what` (e.g. which arguments a shape rule was
    /// applied to): `"<what>: <message>"`.
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

/// `bail!(STATUS, "fmt", args)` returns early with an `Error`.
#[macro_export]
macro_rules! bail {
    ($status:expr, $($arg:tt)*) => {
        return Err($crate::error::Error::new($status, format!($($arg)*)))
    };
}

/// `ensure!(cond, STATUS, "fmt", args)` bails unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $status:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($status, $($arg)*);
        }
    };
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        use cudarc::driver::sys::CUresult;
        let name = e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = e
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let status = match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => FK_ERROR_OUT_OF_MEMORY,
            CUresult::CUDA_ERROR_NO_DEVICE | CUresult::CUDA_ERROR_NOT_INITIALIZED => {
                FK_ERROR_CUDA_UNAVAILABLE
            }
            _ => FK_ERROR_CUDA,
        };
        Error::new(
            status,
            format!("CUDA driver error {name} ({:?}): {text}", e.0),
        )
    }
}

/// Adds context (which driver call failed) to a driver result.
pub trait CudaContext<T> {
    fn cuda(self, what: &str) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn cuda(self, what: &str) -> Result<T> {
        self.map_err(|e| {
            let mut err = Error::from(e);
            err.message = format!("{what} failed: {}", err.message);
            err
        })
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `msg` as this thread's last error message.
pub fn set_last_error(msg: &str) {
    let clean: String = msg
        .chars()
        .map(|c| if c == '\0' { '?' } else { c })
        .collect();
    let c = CString::new(clean).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = c);
}

/// Clears this thread's last error message.
pub fn clear_last_error() {
    LAST_ERROR.with(|slot| *slot.borrow_mut() = CString::default());
}

/// Pointer to this thread's last error message; valid until the next fusekit call
/// on this thread.
pub fn last_error_ptr() -> *const libc::c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

/// Copy of this thread's last error message.
pub fn last_error() -> String {
    LAST_ERROR.with(|slot| slot.borrow().to_string_lossy().into_owned())
}

/// Locks `m`, taking the data even when a panic poisoned it: every C entry point
/// catches panics (`abi::guard`), and the state fusekit keeps under locks (caches,
/// pools, handles) is left consistent by the code that can panic while holding it.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
