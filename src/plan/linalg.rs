//! Plans of the linear-algebra family: GEMM operands and plans, the fused linear
//! layer's plans and activations, the Kronecker product's plan: what validated code in
//! `ops::linalg` makes and the backends (`cpu`, `cuda`) execute. Below both; imports no
//! backend.

use crate::addr::Addr;
use crate::dtype::DType;
use crate::plan::elementwise::Scalar;

/// `op(X)` of a GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trans {
    /// `X`
    N = 0,
    /// `X^T`
    T = 1,
    /// `X^H` (conjugate transpose; the same as `T` for real dtypes)
    C = 2,
}

impl Trans {
    pub fn name(self) -> &'static str {
        match self {
            Trans::N => "FK_OP_N",
            Trans::T => "FK_OP_T",
            Trans::C => "FK_OP_C",
        }
    }
    pub fn transposed(self) -> bool {
        self != Trans::N
    }
}

/// Activation of the fused linear layer. The discriminants are the kernels' codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None = 0,
    Relu = 1,
    /// GELU, tanh approximation: `0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))`,
    /// the formula of cuBLASLt's GELU epilogue (torch's `gelu(approximate="tanh")`).
    GeluTanh = 2,
    /// GELU, exact: `0.5 z (1 + erf(z / sqrt(2)))` (torch's default `gelu`).
    GeluErf = 3,
}

/// `sqrt(2 / pi)` and the cubic coefficient of the tanh GELU, in f32 as every
/// backend computes it (the CPU's `gelu_tanh`; the kernels assert theirs equal).
pub(crate) const GELU_TANH_C: f32 = 0.797_884_6;

pub(crate) const GELU_TANH_A: f32 = 0.044715;

impl Activation {
    pub fn name(self) -> &'static str {
        match self {
            Activation::None => "FK_ACT_NONE",
            Activation::Relu => "FK_ACT_RELU",
            Activation::GeluTanh => "FK_ACT_GELU_TANH",
            Activation::GeluErf => "FK_ACT_GELU_ERF",
        }
    }
    /// Whether the forward can keep an aux tensor for the backward (the
    /// pre-activation, the GELUs only: ReLU's backward reads the output `y`).
    pub fn has_aux(self) -> bool {
        matches!(self, Activation::GeluTanh | Activation::GeluErf)
    }
}

/// A row-major matrix operand: `batch` matrices of `rows x cols`, row stride `ld`,
/// consecutive matrices `batch_stride` elements apart (0: one matrix for all).
/// `addr` is `None` for an operand without memory (an empty buffer).
#[derive(Debug, Clone, Copy)]
pub struct Mat {
    pub addr: Option<Addr>,
    pub rows: i64,
    pub cols: i64,
    pub ld: i64,
    pub batch_stride: i64,
}

impl Mat {
    /// Address of matrix `i` of the batch (`elem` bytes an element). The batch
    /// stride of empty matrices is unchecked and may be huge, so an empty matrix
    /// keeps its first address (it is never dereferenced).
    ///
    /// # Safety
    ///
    /// `i` indexes a matrix of the operand this `Mat` describes (`i` below the
    /// plan's batch; any `i` when `batch_stride` is 0), so the offset stays inside
    /// the operand's memory (`Addr::offset`'s contract).
    pub unsafe fn at(&self, i: i64, elem: usize) -> Option<Addr> {
        if self.rows == 0 || self.cols == 0 {
            return self.addr;
        }
        let off = i
            .checked_mul(self.batch_stride)
            .and_then(|o| o.checked_mul(elem as i64))
            .expect("batch offset of a validated matrix fits i64");
        // SAFETY: the caller's contract.
        self.addr.map(|a| unsafe { a.offset(off) })
    }

    /// Address of element `(row, col)` of the first matrix (`elem` bytes an
    /// element): the corner of a tile.
    ///
    /// # Safety
    ///
    /// `(row, col)` is an element of the first matrix (`row < rows`, `col < cols`).
    pub unsafe fn elem(&self, row: i64, col: i64, elem: usize) -> Option<Addr> {
        let off = (row * self.ld + col) * elem as i64;
        // SAFETY: the caller's contract: the element lies inside the operand.
        self.addr.map(|a| unsafe { a.offset(off) })
    }
}

/// What the backends execute for a GEMM: `C[i] = alpha op(A[i]) op(B[i]) + beta C[i]`
/// for `i < batch`, `op(A)` `m x k`, `op(B)` `k x n`, `C` `m x n`.
#[derive(Debug, Clone, Copy)]
pub struct GemmPlan {
    pub dtype: DType,
    pub op_a: Trans,
    pub op_b: Trans,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub batch: i64,
    pub a: Mat,
    pub b: Mat,
    pub c: Mat,
    pub alpha: Scalar,
    pub beta: Scalar,
    /// f32 / complex64 may use TF32 tensor cores (`FK_GEMM_ALLOW_TF32`).
    pub allow_tf32: bool,
}

/// A contiguous row-major `[rows, cols]` matrix at `addr`, `batch_stride` elements
/// between consecutive matrices (0: one for the whole batch).
pub fn dense(addr: Option<Addr>, rows: i64, cols: i64, batch_stride: i64) -> Mat {
    Mat {
        addr,
        rows,
        cols,
        ld: cols.max(1),
        batch_stride,
    }
}

impl GemmPlan {
    /// `c = alpha op(a) op(b) + beta c` over `batch` matrices; `a`, `b`, `c` give the
    /// stored matrices (`op` applied on top).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dtype: DType,
        op_a: Trans,
        a: Mat,
        op_b: Trans,
        b: Mat,
        c: Mat,
        alpha: f64,
        beta: f64,
        batch: i64,
        allow_tf32: bool,
    ) -> GemmPlan {
        let (m, k) = if op_a.transposed() {
            (a.cols, a.rows)
        } else {
            (a.rows, a.cols)
        };
        let n = if op_b.transposed() { b.rows } else { b.cols };
        GemmPlan {
            dtype,
            op_a,
            op_b,
            m,
            n,
            k,
            batch,
            a,
            b,
            c,
            alpha: Scalar { re: alpha, im: 0.0 },
            beta: Scalar { re: beta, im: 0.0 },
            allow_tf32: allow_tf32 && dtype == DType::F32,
        }
    }
}

/// `FK_GEMM_ALLOW_TF32` (`abi::linalg` states the ABI constant and asserts that the
/// two agree).
pub(crate) const GEMM_ALLOW_TF32: u32 = 1;

/// What the backends execute for `y = act(x W^T + b)`: `x [m, k]`, `W [n, k]`,
/// `b [n]`, `y [m, n]`, `aux [m, n]` (the pre-activation, GELU only), all contiguous.
#[derive(Debug, Clone, Copy)]
pub struct LinearPlan {
    pub dtype: DType,
    pub act: Activation,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub x: Option<Addr>,
    pub w: Option<Addr>,
    pub bias: Option<Addr>,
    pub y: Option<Addr>,
    pub aux: Option<Addr>,
}

/// The backward: `dz = dy * act'(z)` (`saved`: `y` for ReLU, the pre-activation `z`
/// for GELU), `dx = dz W`, `dW = dz^T x`, `db = sum_rows dz`, each optional.
#[derive(Debug, Clone, Copy)]
pub struct LinearBwdPlan {
    pub dtype: DType,
    pub act: Activation,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub dy: Option<Addr>,
    pub x: Option<Addr>,
    pub w: Option<Addr>,
    pub saved: Option<Addr>,
    pub dx: Option<Addr>,
    pub dw: Option<Addr>,
    pub db: Option<Addr>,
}

/// `out[i, r*p + s, c*q + t] = A[i, r, c] * B[i, s, t]`; inputs with any strides
/// (batch stride 0 broadcasts), `out` contiguous.
#[derive(Debug, Clone, Copy)]
pub struct KronPlan {
    pub dtype: DType,
    pub batch: i64,
    pub m: i64,
    pub n: i64,
    pub p: i64,
    pub q: i64,
    pub a: Option<Addr>,
    /// (batch, row, col) strides of A in elements.
    pub sa: [i64; 3],
    pub b: Option<Addr>,
    pub sb: [i64; 3],
    pub out: Option<Addr>,
}
