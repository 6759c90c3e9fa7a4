//! Plans of the elementwise family: the op codes and the plan of a broadcast binary or
//! unary op: what validated code in `ops::elementwise` makes and the backends (`cpu`,
//! `cuda`) execute. Below both; imports no backend.

use crate::addr::Addr;
use crate::dtype::DType;
use crate::error::{FK_ERROR_UNSUPPORTED_DTYPE, Result};
use crate::layout::Dims;

/// `op_codes! { enum Op, ALL: Name = code "NAME", ... }`: an op enum whose
/// discriminants are the kernels' op codes (passed to NVRTC as `-D` definitions,
/// see `cuda::elementwise::defines`), the list `ALL` of its ops in code order, and
/// each op's `name()` in the kernels' spelling, from one table.
macro_rules! op_codes {
    ($(#[$doc:meta])* enum $op:ident, $all:ident: $($(#[$vdoc:meta])* $v:ident = $code:literal $name:literal),+ $(,)?) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $op {
            $($(#[$vdoc])* $v = $code),+
        }

        pub const $all: [$op; [$($code),+].len()] = [$($op::$v),+];

        impl $op {
            pub fn name(self) -> &'static str {
                match self {
                    $($op::$v => $name),+
                }
            }
        }
    };
}

op_codes! {
    /// Binary operations.
    enum BinaryOp, ALL_BINARY:
    Add = 0 "ADD",
    Sub = 1 "SUB",
    Mul = 2 "MUL",
    Div = 3 "DIV",
    /// `alpha*a + beta*b`.
    Axpby = 4 "AXPBY",
}

op_codes! {
    /// Unary operations (`ScalarAdd`/`ScalarMul` use `alpha`).
    enum UnaryOp, ALL_UNARY:
    Neg = 0 "NEG",
    Abs = 1 "ABS",
    Exp = 2 "EXP",
    Log = 3 "LOG",
    Sqrt = 4 "SQRT",
    Sin = 5 "SIN",
    Cos = 6 "COS",
    Tanh = 7 "TANH",
    Sigmoid = 8 "SIGMOID",
    Relu = 9 "RELU",
    ScalarAdd = 10 "SCALAR_ADD",
    ScalarMul = 11 "SCALAR_MUL",
    Copy = 12 "COPY",
}

impl UnaryOp {
    /// Output dtype for input `d`, or an error for unsupported combinations.
    pub fn out_dtype(self, d: DType) -> Result<DType> {
        match (self, d.is_complex()) {
            (UnaryOp::Abs, true) => Ok(d.real()),
            (UnaryOp::Relu, true) => crate::bail!(
                FK_ERROR_UNSUPPORTED_DTYPE,
                "relu is not defined for complex input (a has dtype {d})"
            ),
            _ => Ok(d),
        }
    }
}

/// A complex scalar `(re, im)`; for real dtypes `im` must be 0.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scalar {
    pub re: f64,
    pub im: f64,
}

/// What the backends execute: the output's (coalesced) shape and each operand's
/// strides in elements, with broadcasting already applied.
#[derive(Debug, Clone)]
pub struct Plan {
    pub n: i64,
    pub shape: Dims,
    pub so: Dims,
    pub sa: Dims,
    pub sb: Dims,
    /// `None` only for an empty output, which no backend is handed.
    pub out: Option<Addr>,
    pub a: Option<Addr>,
    /// `None` for the unary ops.
    pub b: Option<Addr>,
    pub in_dtype: DType,
    pub alpha: Scalar,
    pub beta: Scalar,
    /// Every operand dense and in the same order as the output (one dim, stride 1).
    pub contiguous: bool,
}
