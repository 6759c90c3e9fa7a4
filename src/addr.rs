//! Typed memory addresses: what a validated plan hands a backend.
//!
//! A plan (`ops::gaussian::Inputs`, `ops::elementwise::Plan`, ...) carries the
//! address of each operand's first element as an `Option<Addr>`: `None` is an
//! operand that is absent (a gradient nobody asked for, the second input of a
//! unary op) or empty (a buffer of zero elements may have no memory). An `Addr` is
//! never 0, so `Option<Addr>` has the size and bits of a `u64` with 0 for `None`,
//! which is what the kernels' argument structs carry (`raw`).
//!
//! The same type names device memory (CUDA backends: a `CUdeviceptr`) and host
//! memory (CPU backend: a pointer); the plan's device says which.
//!
//! # Soundness: every `Addr` is vouched for
//!
//! An `Addr` is a promise, not just a number: only `unsafe` code makes one
//! (`from_raw`, `from_ptr`; the arithmetic `byte_add`, `offset`, `align_up`), and
//! its contract is that the address is live memory of the device it will be used
//! on, valid for the extent its consumer will use. So the backends may take plans
//! in safe signatures: safe code cannot hand them a forged address. The places
//! that make addresses are few, each with a `// SAFETY:` line:
//! - `Buffer` construction (`buffer.rs`: owned and pinned allocations, `wrap`'s
//!   caller memory under `fk_buffer_wrap`'s contract; `dlpack.rs`: an import under
//!   the DLPack contract); plans take them through `Addr::of`;
//! - scratch allocations: `gpu::Workspace` (a fresh pool allocation) and the CPU
//!   backend's `Vec` scratch (`Addr::from_ptr` over a vector kept alive while used);
//! - offsets inside a vouched allocation (a batch's matrix, a tile's corner, a
//!   workspace piece), whose callers state why the offset stays inside.
//!
//! Reading the number (`get`, `raw`) or making a raw pointer (`ptr`) is safe;
//! dereferencing one is not (`cpu::host_slice`, a library call, a kernel launch).

use std::num::NonZeroU64;

/// The non-zero address of memory that its maker vouched for (see the module
/// documentation): device or host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Addr(NonZeroU64);

impl Addr {
    /// The address `raw`, or `None` for 0.
    ///
    /// # Safety
    ///
    /// `raw` is 0 or the address of live memory of the device the address will be
    /// used on (host memory for a CPU plan, device memory of the plan's CUDA
    /// context), and that memory stays live and valid for every byte that any
    /// consumer of the address, or of an address derived from it, reads or writes,
    /// for as long as it is used (the extent a plan's shape describes; for an
    /// allocation, its whole size).
    pub const unsafe fn from_raw(raw: u64) -> Option<Addr> {
        match NonZeroU64::new(raw) {
            Some(a) => Some(Addr(a)),
            None => None,
        }
    }

    /// The address of the host pointer `p`, or `None` for NULL.
    ///
    /// # Safety
    ///
    /// As `from_raw`: `p` is NULL or points at live host memory valid for what its
    /// consumers will touch, for as long as they use it.
    pub unsafe fn from_ptr<T>(p: *const T) -> Option<Addr> {
        // SAFETY: the caller's contract is `from_raw`'s.
        unsafe { Addr::from_raw(p as usize as u64) }
    }

    /// The address as a number (a kernel argument, a driver call, an alignment
    /// test).
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The address as a pointer to `T`. Safe to make; dereferencing it is under
    /// the address's contract (and, on the CPU, `cpu::host_slice`'s).
    pub const fn ptr<T>(self) -> *mut T {
        self.0.get() as usize as *mut T
    }

    /// The address `bytes` further on.
    ///
    /// # Safety
    ///
    /// The result lies inside the memory `self` was vouched for (the same
    /// allocation, at most one past its end), and is used only within it. Panics
    /// rather than wrap.
    pub const unsafe fn byte_add(self, bytes: u64) -> Addr {
        match self.0.get().checked_add(bytes) {
            Some(a) => Addr(NonZeroU64::new(a).expect("a sum of a non-zero address")),
            None => panic!("address overflow"),
        }
    }

    /// The address `bytes` away, either way (`Mat::at`'s batch strides, workspace
    /// offsets).
    ///
    /// # Safety
    ///
    /// As `byte_add`: the result stays inside the memory `self` was vouched for.
    /// Panics on overflow or 0 rather than wrap.
    pub const unsafe fn offset(self, bytes: i64) -> Addr {
        match self.0.get().checked_add_signed(bytes) {
            Some(a) => match NonZeroU64::new(a) {
                Some(a) => Addr(a),
                None => panic!("address offset reaches 0"),
            },
            None => panic!("address offset overflows"),
        }
    }

    /// The address rounded up to a multiple of `align` (a power of two).
    ///
    /// # Safety
    ///
    /// As `byte_add`: the rounded address stays inside the memory `self` was
    /// vouched for (a workspace sized with the padding).
    pub const unsafe fn align_up(self, align: u64) -> Addr {
        // SAFETY: the caller's contract.
        unsafe { self.byte_add(self.0.get().next_multiple_of(align) - self.0.get()) }
    }
}

/// The number a kernel argument struct or a driver call carries for an optional
/// address: 0 for `None`.
pub const fn raw(a: Option<Addr>) -> u64 {
    match a {
        Some(a) => a.get(),
        None => 0,
    }
}

/// The optional address as a pointer to `T` (NULL for `None`): what a library call
/// (cuBLAS, cuSOLVER) or the CPU's views take. Dereferencing it is the consumer's
/// `unsafe`.
pub const fn ptr<T>(a: Option<Addr>) -> *mut T {
    match a {
        Some(a) => a.ptr(),
        None => std::ptr::null_mut(),
    }
}

// An absent address costs nothing: the same bits as a u64 with 0 for `None`.
const _: () = assert!(size_of::<Option<Addr>>() == size_of::<u64>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_absent_and_raw_round_trips() {
        // SAFETY (all): the addresses are compared and offset, never dereferenced.
        unsafe {
            assert_eq!(Addr::from_raw(0), None);
            assert_eq!(Addr::from_ptr::<u8>(std::ptr::null()), None);
            assert_eq!(raw(None), 0);
            let a = Addr::from_raw(0x1000).unwrap();
            assert_eq!(a.get(), 0x1000);
            assert_eq!(a.ptr::<u8>() as usize, 0x1000);
            assert_eq!(raw(Some(a)), 0x1000);
            assert_eq!(ptr::<u32>(Some(a)) as usize, 0x1000);
            assert!(ptr::<u8>(None).is_null());
            assert_eq!(a.byte_add(24).get(), 0x1018);
            assert_eq!(a.offset(24).get(), 0x1018);
            assert_eq!(a.offset(-0x800).get(), 0x800);
            assert_eq!(a.byte_add(1).align_up(256).get(), 0x1100);
            assert_eq!(a.align_up(256), a);
        }
    }
}
