//! A `#[repr(C)]` mirror of the parts of XLA's FFI C API (`xla/ffi/api/c_api.h`)
//! that fusekit's handlers use, and nothing else. Written from the header of jaxlib
//! 0.10.2 (`XLA_FFI_API_MAJOR 0`, `XLA_FFI_API_MINOR 3`); no jaxlib header is read
//! at build time. The layout tests at the end assert every size and offset against
//! the values that header gives on x86-64 / aarch64 Linux (LP64).
//!
//! Compatibility: every struct XLA hands over starts with `struct_size`, and the
//! handlers read a field only when that size covers it (the API table's functions
//! included). The fields used here exist from API version 0.1 on, except
//! `XLA_FFI_DeviceOrdinal_Get` (read only when the framework reports 0.3 or newer
//! and its table is long enough; see `mod.rs`).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// The API version the handlers report in the metadata probe: the lowest one XLA
/// accepts (0.1), which has everything fusekit reads unconditionally.
pub const API_MAJOR: i32 = 0;
pub const API_MINOR: i32 = 1;

/// `XLA_FFI_Extension_Type`.
pub const XLA_FFI_EXTENSION_METADATA: i32 = 1;

/// `XLA_FFI_Error_Code` (abseil's status codes); the ones fusekit returns.
pub const XLA_FFI_ERROR_CODE_INVALID_ARGUMENT: i32 = 3;
pub const XLA_FFI_ERROR_CODE_NOT_FOUND: i32 = 5;
pub const XLA_FFI_ERROR_CODE_RESOURCE_EXHAUSTED: i32 = 8;
pub const XLA_FFI_ERROR_CODE_FAILED_PRECONDITION: i32 = 9;
pub const XLA_FFI_ERROR_CODE_UNIMPLEMENTED: i32 = 12;
pub const XLA_FFI_ERROR_CODE_INTERNAL: i32 = 13;
pub const XLA_FFI_ERROR_CODE_UNAVAILABLE: i32 = 14;

/// `XLA_FFI_DataType` (= xla::PrimitiveType): the values fusekit maps, and the
/// scalar types of attributes.
pub const XLA_FFI_DATATYPE_PRED: i32 = 1;
pub const XLA_FFI_DATATYPE_S8: i32 = 2;
pub const XLA_FFI_DATATYPE_S16: i32 = 3;
pub const XLA_FFI_DATATYPE_S32: i32 = 4;
pub const XLA_FFI_DATATYPE_S64: i32 = 5;
pub const XLA_FFI_DATATYPE_U8: i32 = 6;
pub const XLA_FFI_DATATYPE_U16: i32 = 7;
pub const XLA_FFI_DATATYPE_U32: i32 = 8;
pub const XLA_FFI_DATATYPE_U64: i32 = 9;
pub const XLA_FFI_DATATYPE_F16: i32 = 10;
pub const XLA_FFI_DATATYPE_F32: i32 = 11;
pub const XLA_FFI_DATATYPE_F64: i32 = 12;
pub const XLA_FFI_DATATYPE_C64: i32 = 15;
pub const XLA_FFI_DATATYPE_BF16: i32 = 16;
pub const XLA_FFI_DATATYPE_C128: i32 = 18;

/// `XLA_FFI_ArgType_BUFFER`, `XLA_FFI_RetType_BUFFER`.
pub const XLA_FFI_ARGTYPE_BUFFER: i32 = 1;
pub const XLA_FFI_RETTYPE_BUFFER: i32 = 1;

/// `XLA_FFI_AttrType_SCALAR` (the only attribute kind fusekit's handlers take).
pub const XLA_FFI_ATTRTYPE_SCALAR: i32 = 3;

/// `XLA_FFI_ExecutionStage_EXECUTE` (0.1 and later numbering).
pub const XLA_FFI_EXECUTION_STAGE_EXECUTE: i32 = 3;

/// `XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE`.
pub const XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE: u32 = 1;

/// Opaque types.
#[repr(C)]
pub struct XLA_FFI_Error {
    _private: [u8; 0],
}
#[repr(C)]
pub struct XLA_FFI_ExecutionContext {
    _private: [u8; 0],
}

#[repr(C)]
pub struct XLA_FFI_Extension_Base {
    pub struct_size: usize,
    pub type_: i32,
    pub next: *mut XLA_FFI_Extension_Base,
}

#[repr(C)]
pub struct XLA_FFI_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub major_version: i32,
    pub minor_version: i32,
}

#[repr(C)]
pub struct XLA_FFI_Error_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub message: *const c_char,
    pub errc: i32,
}
/// `XLA_FFI_Error_Create_Args_STRUCT_SIZE` (up to the end of `errc`).
pub const XLA_FFI_ERROR_CREATE_ARGS_STRUCT_SIZE: usize = 28;

#[repr(C)]
pub struct XLA_FFI_Buffer {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub dtype: i32,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *mut i64,
}

#[repr(C)]
pub struct XLA_FFI_ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

#[repr(C)]
pub struct XLA_FFI_Scalar {
    pub dtype: i32,
    pub value: *mut c_void,
}

#[repr(C)]
pub struct XLA_FFI_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub size: i64,
    pub types: *mut i32,
    pub args: *mut *mut c_void,
}

#[repr(C)]
pub struct XLA_FFI_Rets {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub size: i64,
    pub types: *mut i32,
    pub rets: *mut *mut c_void,
}

#[repr(C)]
pub struct XLA_FFI_Attrs {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub size: i64,
    pub types: *mut i32,
    pub names: *mut *mut XLA_FFI_ByteSpan,
    pub attrs: *mut *mut c_void,
}

#[repr(C)]
pub struct XLA_FFI_CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub api: *const XLA_FFI_Api,
    pub ctx: *mut XLA_FFI_ExecutionContext,
    pub stage: i32,
    pub args: XLA_FFI_Args,
    pub rets: XLA_FFI_Rets,
    pub attrs: XLA_FFI_Attrs,
    /// Asynchronous completion (0.1 on); fusekit's handlers are synchronous and
    /// never touch it.
    pub future: *mut c_void,
}
/// `XLA_FFI_CallFrame_STRUCT_SIZE` (up to the end of `attrs`).
pub const XLA_FFI_CALL_FRAME_STRUCT_SIZE: usize = 168;

#[repr(C)]
pub struct XLA_FFI_Stream_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub ctx: *mut XLA_FFI_ExecutionContext,
    pub stream: *mut c_void,
}
pub const XLA_FFI_STREAM_GET_ARGS_STRUCT_SIZE: usize = 32;

#[repr(C)]
pub struct XLA_FFI_DeviceOrdinal_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub ctx: *mut XLA_FFI_ExecutionContext,
    pub device_ordinal: i32,
}
pub const XLA_FFI_DEVICE_ORDINAL_GET_ARGS_STRUCT_SIZE: usize = 28;

#[repr(C)]
pub struct XLA_FFI_Metadata {
    pub struct_size: usize,
    pub api_version: XLA_FFI_Api_Version,
    pub traits: u32,
    // (0.3 adds `XLA_FFI_TypeId state_type_id` here; fusekit's handlers are
    // stateless and leave it alone.)
}

#[repr(C)]
pub struct XLA_FFI_Metadata_Extension {
    pub extension_base: XLA_FFI_Extension_Base,
    pub metadata: *mut XLA_FFI_Metadata,
}

pub type XLA_FFI_Error_Create =
    unsafe extern "C" fn(args: *mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error;
pub type XLA_FFI_Stream_Get =
    unsafe extern "C" fn(args: *mut XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error;
pub type XLA_FFI_DeviceOrdinal_Get =
    unsafe extern "C" fn(args: *mut XLA_FFI_DeviceOrdinal_Get_Args) -> *mut XLA_FFI_Error;
/// A function of the table fusekit does not call.
pub type Unused = Option<unsafe extern "C" fn()>;

/// `XLA_FFI_Api`, the function table of API version 0.3.
#[repr(C)]
pub struct XLA_FFI_Api {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub api_version: XLA_FFI_Api_Version,
    pub internal_api: *const c_void,
    pub error_create: Option<XLA_FFI_Error_Create>,
    pub error_get_message: Unused,
    pub error_destroy: Unused,
    pub handler_register: Unused,
    pub stream_get: Option<XLA_FFI_Stream_Get>,
    pub type_register: Unused,
    pub execution_context_get: Unused,
    pub state_set: Unused,
    pub state_get: Unused,
    pub device_memory_allocate: Unused,
    pub device_memory_free: Unused,
    pub thread_pool_schedule: Unused,
    pub thread_pool_num_threads: Unused,
    pub future_create: Unused,
    pub future_set_available: Unused,
    pub future_set_error: Unused,
    pub run_id_get: Unused,
    pub device_ordinal_get: Option<XLA_FFI_DeviceOrdinal_Get>,
}

/// The end of field `f` of struct `T`, in bytes: a `struct_size` must reach it
/// before the field is read.
macro_rules! end_of {
    ($t:ty, $f:ident) => {
        std::mem::offset_of!($t, $f) + {
            fn size_of_field<F>(_: impl FnOnce(&$t) -> &F) -> usize {
                std::mem::size_of::<F>()
            }
            size_of_field(|s: &$t| &s.$f)
        }
    };
}
pub(crate) use end_of;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `offsets!(T { a: 8, b: 16 })`: the offset of each field of `T`, in bytes.
    macro_rules! offsets {
        ($t:ty { $($f:ident: $off:expr),+ $(,)? }) => {
            $(assert_eq!(offset_of!($t, $f), $off, concat!(stringify!($t), ".", stringify!($f)));)+
        };
    }

    // The numbers below are those of c_api.h (jaxlib 0.10.2, API 0.3) on LP64:
    // pointers and size_t 8 bytes, enums 4.

    #[test]
    fn extension_and_version() {
        assert_eq!(size_of::<XLA_FFI_Extension_Base>(), 24);
        offsets!(XLA_FFI_Extension_Base { type_: 8, next: 16 });
        assert_eq!(size_of::<XLA_FFI_Api_Version>(), 24);
        offsets!(XLA_FFI_Api_Version {
            major_version: 16,
            minor_version: 20
        });
    }

    #[test]
    fn error_and_stream_args() {
        offsets!(XLA_FFI_Error_Create_Args {
            message: 16,
            errc: 24
        });
        assert_eq!(
            end_of!(XLA_FFI_Error_Create_Args, errc),
            XLA_FFI_ERROR_CREATE_ARGS_STRUCT_SIZE
        );
        offsets!(XLA_FFI_Stream_Get_Args {
            ctx: 16,
            stream: 24
        });
        assert_eq!(
            end_of!(XLA_FFI_Stream_Get_Args, stream),
            XLA_FFI_STREAM_GET_ARGS_STRUCT_SIZE
        );
        offsets!(XLA_FFI_DeviceOrdinal_Get_Args { device_ordinal: 24 });
        assert_eq!(
            end_of!(XLA_FFI_DeviceOrdinal_Get_Args, device_ordinal),
            XLA_FFI_DEVICE_ORDINAL_GET_ARGS_STRUCT_SIZE
        );
    }

    #[test]
    fn buffer_scalar_bytespan() {
        assert_eq!(size_of::<XLA_FFI_Buffer>(), 48);
        offsets!(XLA_FFI_Buffer {
            dtype: 16,
            data: 24,
            rank: 32,
            dims: 40
        });
        assert_eq!(size_of::<XLA_FFI_ByteSpan>(), 16);
        offsets!(XLA_FFI_ByteSpan { len: 8 });
        assert_eq!(size_of::<XLA_FFI_Scalar>(), 16);
        offsets!(XLA_FFI_Scalar { value: 8 });
    }

    #[test]
    fn call_frame() {
        assert_eq!(size_of::<XLA_FFI_Args>(), 40);
        offsets!(XLA_FFI_Args {
            size: 16,
            types: 24,
            args: 32
        });
        assert_eq!(size_of::<XLA_FFI_Rets>(), 40);
        offsets!(XLA_FFI_Rets { rets: 32 });
        assert_eq!(size_of::<XLA_FFI_Attrs>(), 48);
        offsets!(XLA_FFI_Attrs {
            types: 24,
            names: 32,
            attrs: 40
        });
        offsets!(XLA_FFI_CallFrame {
            api: 16,
            ctx: 24,
            stage: 32,
            args: 40,
            rets: 80,
            attrs: 120,
            future: 168,
        });
        assert_eq!(size_of::<XLA_FFI_CallFrame>(), 176);
        assert_eq!(
            end_of!(XLA_FFI_CallFrame, attrs),
            XLA_FFI_CALL_FRAME_STRUCT_SIZE
        );
    }

    #[test]
    fn metadata() {
        offsets!(XLA_FFI_Metadata {
            api_version: 8,
            traits: 32
        });
        // XLA_FFI_Metadata_STRUCT_SIZE ends at traits
        assert_eq!(end_of!(XLA_FFI_Metadata, traits), 36);
        offsets!(XLA_FFI_Metadata_Extension { metadata: 24 });
        assert_eq!(size_of::<XLA_FFI_Metadata_Extension>(), 32);
    }

    #[test]
    fn api_table() {
        offsets!(XLA_FFI_Api {
            api_version: 16,
            internal_api: 40,
            error_create: 48,
            stream_get: 80,
            device_ordinal_get: 184,
        });
        // XLA_FFI_Api_STRUCT_SIZE of API 0.3 ends at XLA_FFI_DeviceOrdinal_Get
        assert_eq!(size_of::<XLA_FFI_Api>(), 192);
        assert_eq!(end_of!(XLA_FFI_Api, device_ordinal_get), 192);
    }
}
