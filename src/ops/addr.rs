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
//! memory (CPU backend: a pointer); the plan's device says which. An `Addr` is
//! only a number: turning one into host memory is `unsafe`
//! (`cpu::host_slice`, `cpu::host_slice_mut`), under the contract written there.

use std::num::NonZeroU64;

use crate::buffer::Buffer;

/// The non-zero address of a buffer's first element, device or host (see the
/// module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Addr(NonZeroU64);

impl Addr {
    /// The address `raw`, or `None` for 0.
    pub const fn from_raw(raw: u64) -> Option<Addr> {
        match NonZeroU64::new(raw) {
            Some(a) => Some(Addr(a)),
            None => None,
        }
    }

    /// The address `raw` as the ABI layer holds it (`Buffer::data`), or `None` for 0.
    pub const fn from_usize(raw: usize) -> Option<Addr> {
        Addr::from_raw(raw as u64)
    }

    /// The address of `buf`'s first element (`None` if it has no memory).
    pub fn of(buf: &Buffer) -> Option<Addr> {
        Addr::from_usize(buf.data)
    }

    /// The address `buf` of an optional operand, `None` when it is absent.
    pub fn of_opt(buf: Option<&Buffer>) -> Option<Addr> {
        buf.and_then(Addr::of)
    }

    /// The address as a number.
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The address as a host pointer-sized number.
    pub const fn as_usize(self) -> usize {
        self.0.get() as usize
    }

    /// The address `bytes` further on (inside the same allocation: the caller
    /// knows the allocation holds them, so this never wraps to 0).
    pub const fn byte_add(self, bytes: u64) -> Addr {
        match NonZeroU64::new(self.0.get() + bytes) {
            Some(a) => Addr(a),
            None => panic!("address overflow"),
        }
    }

    /// The address `bytes` away, either way (`Mat::at`'s batch strides, workspace
    /// offsets): inside the same allocation, so neither overflow nor 0 can happen
    /// for a validated operand; both panic.
    pub const fn offset(self, bytes: i64) -> Addr {
        match self.0.get().checked_add_signed(bytes) {
            Some(a) => match NonZeroU64::new(a) {
                Some(a) => Addr(a),
                None => panic!("address offset reaches 0"),
            },
            None => panic!("address offset overflows"),
        }
    }

    /// The address rounded up to a multiple of `align` (a power of two).
    pub const fn align_up(self, align: u64) -> Addr {
        self.byte_add(self.0.get().next_multiple_of(align) - self.0.get())
    }
}

/// The number a kernel argument struct carries for an optional address: 0 for `None`.
pub const fn raw(a: Option<Addr>) -> u64 {
    match a {
        Some(a) => a.get(),
        None => 0,
    }
}

/// The optional address as a host pointer-sized number (0 for `None`): what a
/// library call (cuBLAS, cuSOLVER) or the CPU's pointer arithmetic takes.
pub const fn ptr(a: Option<Addr>) -> usize {
    raw(a) as usize
}

// An absent address costs nothing: the same bits as a u64 with 0 for `None`.
const _: () = assert!(size_of::<Option<Addr>>() == size_of::<u64>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_absent_and_raw_round_trips() {
        assert_eq!(Addr::from_raw(0), None);
        assert_eq!(Addr::from_usize(0), None);
        assert_eq!(raw(None), 0);
        let a = Addr::from_raw(0x1000).unwrap();
        assert_eq!(a.get(), 0x1000);
        assert_eq!(a.as_usize(), 0x1000);
        assert_eq!(raw(Some(a)), 0x1000);
        assert_eq!(ptr(Some(a)), 0x1000);
        assert_eq!(ptr(None), 0);
        assert_eq!(a.byte_add(24).get(), 0x1018);
        assert_eq!(a.offset(24).get(), 0x1018);
        assert_eq!(a.offset(-0x800).get(), 0x800);
        assert_eq!(a.byte_add(1).align_up(256).get(), 0x1100);
        assert_eq!(a.align_up(256), a);
    }
}
