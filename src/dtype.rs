//! Element types.

use crate::error::{FK_ERROR_INVALID_ARGUMENT, Result};

/// Element type selector (`int32_t`). Values are part of the ABI.
#[allow(non_camel_case_types)]
pub type fk_dtype = i32;

/// IEEE 754 binary16.
pub const FK_DTYPE_F16: fk_dtype = 1;
/// bfloat16.
pub const FK_DTYPE_BF16: fk_dtype = 2;
/// IEEE 754 binary32.
pub const FK_DTYPE_F32: fk_dtype = 3;
/// IEEE 754 binary64.
pub const FK_DTYPE_F64: fk_dtype = 4;
/// Complex of two binary32 (interleaved re, im; 8 bytes).
pub const FK_DTYPE_C64: fk_dtype = 5;
/// Complex of two binary64 (interleaved re, im; 16 bytes).
pub const FK_DTYPE_C128: fk_dtype = 6;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
}

pub const ALL_DTYPES: [DType; 6] = [
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C64,
    DType::C128,
];

impl DType {
    /// Validates an ABI value; `what` names the argument for the message.
    pub fn from_abi(v: fk_dtype, what: &str) -> Result<DType> {
        Ok(match v {
            FK_DTYPE_F16 => DType::F16,
            FK_DTYPE_BF16 => DType::BF16,
            FK_DTYPE_F32 => DType::F32,
            FK_DTYPE_F64 => DType::F64,
            FK_DTYPE_C64 => DType::C64,
            FK_DTYPE_C128 => DType::C128,
            _ => crate::bail!(
                FK_ERROR_INVALID_ARGUMENT,
                "{what} = {v} is not a valid fk_dtype (expected FK_DTYPE_F16=1 .. FK_DTYPE_C128=6)"
            ),
        })
    }

    pub fn to_abi(self) -> fk_dtype {
        match self {
            DType::F16 => FK_DTYPE_F16,
            DType::BF16 => FK_DTYPE_BF16,
            DType::F32 => FK_DTYPE_F32,
            DType::F64 => FK_DTYPE_F64,
            DType::C64 => FK_DTYPE_C64,
            DType::C128 => FK_DTYPE_C128,
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    pub fn is_complex(self) -> bool {
        matches!(self, DType::C64 | DType::C128)
    }

    /// The real type of the components (or the type itself when real).
    pub fn real(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    /// DLPack `(code, bits, lanes)`.
    pub fn to_dlpack(self) -> (u8, u8, u16) {
        const FLOAT: u8 = 2;
        const BFLOAT: u8 = 4;
        const COMPLEX: u8 = 5;
        match self {
            DType::F16 => (FLOAT, 16, 1),
            DType::BF16 => (BFLOAT, 16, 1),
            DType::F32 => (FLOAT, 32, 1),
            DType::F64 => (FLOAT, 64, 1),
            DType::C64 => (COMPLEX, 64, 1),
            DType::C128 => (COMPLEX, 128, 1),
        }
    }

    pub fn from_dlpack(code: u8, bits: u8, lanes: u16) -> Option<DType> {
        ALL_DTYPES
            .into_iter()
            .find(|d| d.to_dlpack() == (code, bits, lanes))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
