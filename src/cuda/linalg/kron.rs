//! The batched Kronecker product: the launch shape (`kron_config`) and the launch.

use std::ffi::c_void;

use super::MODULE;
use crate::addr::raw;
use crate::cuda::launch::{Names, launch, per_dtype};
use crate::dtype::DType;
use crate::error::Result;
use crate::gpu::CudaDevice;
use crate::gpu::kargs::kernel_args;
use crate::plan::linalg::KronPlan;
use crate::stream::Stream;

kernel_args! {
    /// The Kronecker kernels' argument.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct KronArgs {
        batch: i64,
        m: i64,
        n: i64,
        p: i64,
        q: i64,
        sa0: i64,
        sa1: i64,
        sa2: i64,
        sb0: i64,
        sb1: i64,
        sb2: i64,
        a: u64,
        b: u64,
        out: u64,
        /// n * q
        cols: i64,
        /// store units per output row (cols / W)
        units: i64,
        /// rows of a per lane and task
        rows: i64,
        /// ceil(p / bs)
        s_blocks: i64,
        /// ceil(m / (rows * il))
        i_chunks: i64,
        /// batch * i_chunks * s_blocks
        tasks: i64,
        /// blockDim.y = bs * il
        bs: i32,
        il: i32,
        /// q % W == 0: the W columns of a unit lie in one segment (one a element)
        uniform: i32,
        /// cols, tasks < 2^32: 32-bit divisions in the setup
        small: i32,
    }
}

/// The Kronecker kernels by `(W, split)`: `W` elements per store (`W * size <= 16`),
/// or complex output aligned only to its components, stored as them (`split`). Named
/// `kron_<store>_<dtype>`: the entry points `FK_KRON_KERNEL(t, W)` (store `w<W>`) and
/// `FK_KRON_SPLIT(t)` (store `split`) of `kernels/linalg.cu`.
pub(super) const KRON: [((i64, bool), Names); 5] = [
    ((8, false), per_dtype!("kron_w8": f16, bf16)),
    ((4, false), per_dtype!("kron_w4": f16, bf16, f32)),
    ((2, false), per_dtype!("kron_w2": f16, bf16, f32, f64, c64)),
    (
        (1, false),
        per_dtype!("kron_w1": f16, bf16, f32, f64, c64, c128),
    ),
    ((1, true), per_dtype!("kron_split": c64, c128)),
];

/// The kernel for `d` with `w` elements per store, or the split stores; an error
/// for a combination no kernel is built for.
pub(super) fn kron_name(d: DType, w: i64, split: bool) -> Result<&'static str> {
    match KRON.iter().find(|(store, _)| *store == (w, split)) {
        Some((_, names)) => names.get(d),
        None => crate::bail!(
            crate::error::FK_ERROR_UNSUPPORTED,
            "no Kronecker kernel for {w}-element{} stores",
            if split { " split" } else { "" }
        ),
    }
}

/// Threads per block of the Kronecker kernel (its `__launch_bounds__`;
/// `kernels/linalg.cu` asserts the number).
pub(super) const KRON_THREADS: i64 = 256;

/// A Kronecker launch: kernel, arguments, grid and block.
#[derive(Debug)]
struct KronLaunch {
    name: &'static str,
    args: KronArgs,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
}

/// Chooses the store width and the launch shape (see `kernels/linalg.cu`):
/// - `W`, elements per store: the widest power of two with `W * size <= 16` that
///   divides the row length `n * q` and whose `W * size` bytes the output's address
///   is aligned to (so every row starts aligned); complex output aligned only to
///   its components gets the split kernel;
/// - block `(bx, bs * il)`: `bx` threads over the row's units (up to 256), the rest
///   over rows `s` of b (`bs`) and lanes over rows of a (`il`);
/// - rows of a per lane and task: halved from all of them until the grid has about
///   8 blocks per multiprocessor (or one row per lane).
fn kron_config(p: &KronPlan, sm_count: i32) -> Result<KronLaunch> {
    let es = p.dtype.size() as i64;
    let comp = if p.dtype.is_complex() { es / 2 } else { es } as u64;
    for (ptr, what) in [(raw(p.a), "a"), (raw(p.b), "b"), (raw(p.out), "out")] {
        crate::ensure!(
            ptr % comp == 0,
            crate::error::FK_ERROR_UNSUPPORTED,
            "{what}'s data pointer {ptr:#x} is not aligned to {comp} bytes, the size of a {} {}",
            p.dtype,
            if p.dtype.is_complex() {
                "component"
            } else {
                "element"
            }
        );
    }
    let cols = p.n * p.q;
    let out = raw(p.out) as i64;
    let mut w = (16 / es).max(1);
    while w > 1 && !(cols % w == 0 && out % (w * es) == 0) {
        w /= 2;
    }
    let split = out % es != 0;
    let name = kron_name(p.dtype, w, split)?;
    let units = cols / w;
    let bx = (units.max(1) as u64)
        .next_power_of_two()
        .min(KRON_THREADS as u64) as i64;
    let by = KRON_THREADS / bx;
    let bs = p.p.clamp(1, by);
    let il = (by / bs).max(1);
    let s_blocks = (p.p + bs - 1) / bs;
    let gx = (units + bx - 1) / bx;
    crate::ensure!(
        gx <= i32::MAX as i64,
        crate::error::FK_ERROR_UNSUPPORTED,
        "the output rows of {cols} elements are too long for one grid ({gx} blocks)"
    );
    let target = sm_count.max(1) as i64 * 8;
    let mut rows = (p.m + il - 1) / il;
    let shape = |rows: i64| {
        let i_chunks = (p.m + rows * il - 1) / (rows * il);
        (i_chunks, p.batch * i_chunks * s_blocks)
    };
    while rows > 1 && gx * shape(rows).1 < target {
        rows = (rows + 1) / 2;
    }
    let (i_chunks, tasks) = shape(rows);
    let small = cols <= u32::MAX as i64 && tasks <= u32::MAX as i64;
    let args = KronArgs {
        batch: p.batch,
        m: p.m,
        n: p.n,
        p: p.p,
        q: p.q,
        sa0: p.sa[0],
        sa1: p.sa[1],
        sa2: p.sa[2],
        sb0: p.sb[0],
        sb1: p.sb[1],
        sb2: p.sb[2],
        a: raw(p.a),
        b: raw(p.b),
        out: raw(p.out),
        cols,
        units,
        rows,
        s_blocks,
        i_chunks,
        tasks,
        bs: bs as i32,
        il: il as i32,
        uniform: (p.q % w == 0) as i32,
        small: small as i32,
    };
    Ok(KronLaunch {
        name,
        args,
        grid: (gx as u32, tasks.min(65535) as u32, 1),
        block: (bx as u32, (bs * il) as u32, 1),
    })
}

/// `out = kron(a, b)`, batched.
pub fn kron(dev: &CudaDevice, p: &KronPlan, stream: &Stream) -> Result<()> {
    let mut l = kron_config(p, dev.sm_count)?;
    launch(
        dev,
        MODULE,
        l.name,
        l.grid,
        l.block,
        0,
        stream.raw,
        &mut [&mut l.args as *mut KronArgs as *mut c_void],
    )
}

#[cfg(test)]
mod tests;
