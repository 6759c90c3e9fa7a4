//! Launcher for `kernels/geodesic.cu` (docs/geodesic.md has the design).
//!
//! Modules `geodesic_<op>_<dtype>_r<RP>_d<DJ>` hold one fast kernel each (R padded
//! to RP = 8, 16 or 32; D padded to 64*DJ, DJ = 2, 4, 8, 16), and
//! `geodesic_<op>_<dtype>_generic` the generic kernel and, for the backwards,
//! `geo_reduce` (the deterministic second pass of the dU/dW sums). The fast kernel
//! runs when its shared memory (U and W resident, plus tile buffers) fits the
//! device's opt-in limit; otherwise the generic kernel, except for the Christoffel
//! ops and the leapfrog forward, which then run their products in cuBLAS with small
//! elementwise kernels between them (`GemmRoute`; the generic kernel when cuBLAS
//! cannot be loaded or with `FK_GEO_FORCE_GENERIC`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::launch::launch;
use super::{CudaDevice, Workspace};
use crate::dtype::DType;
use crate::error::{CudaContext as _, FK_ERROR_INTERNAL, Result};
use crate::ops::geodesic::{GEO_ALLOW_TF32, GEO_FORCE_GENERIC, Job, Kind};
use crate::stream::Stream;

/// One op's modules for one dtype: the 12 fast configurations (RP-major, DJ-minor,
/// as `RPS` x `DJS`), then the generic module (which also holds `geo_reduce`).
macro_rules! op_modules {
    ($op:literal, $def:literal, $t:literal, $ct:literal, $x:literal) => {
        [
            (concat!("geodesic_", $op, "_", $t, "_r8_d2"), || {
                source($def, $ct, "8", "2", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r8_d4"), || {
                source($def, $ct, "8", "4", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r8_d8"), || {
                source($def, $ct, "8", "8", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r8_d16"), || {
                source($def, $ct, "8", "16", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r16_d2"), || {
                source($def, $ct, "16", "2", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r16_d4"), || {
                source($def, $ct, "16", "4", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r16_d8"), || {
                source($def, $ct, "16", "8", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r16_d16"), || {
                source($def, $ct, "16", "16", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r32_d2"), || {
                source($def, $ct, "32", "2", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r32_d4"), || {
                source($def, $ct, "32", "4", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r32_d8"), || {
                source($def, $ct, "32", "8", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_r32_d16"), || {
                source($def, $ct, "32", "16", $x)
            }),
            (concat!("geodesic_", $op, "_", $t, "_generic"), || {
                source($def, $ct, "", "", $x)
            }),
        ]
    };
}

/// Modules per op and dtype (12 fast + 1 generic).
const PER: usize = 13;
const OPS: [[[(&str, fn() -> String); PER]; 2]; 4] = [
    [
        op_modules!(
            "christoffel_fwd",
            "CHR_FWD",
            "f32",
            "float",
            "#define GEO_TF32 1\n"
        ),
        op_modules!("christoffel_fwd", "CHR_FWD", "f64", "double", ""),
    ],
    [
        op_modules!("christoffel_bwd", "CHR_BWD", "f32", "float", ""),
        op_modules!("christoffel_bwd", "CHR_BWD", "f64", "double", ""),
    ],
    [
        op_modules!(
            "leapfrog_fwd",
            "LF_FWD",
            "f32",
            "float",
            "#define GEO_TF32 1\n"
        ),
        op_modules!("leapfrog_fwd", "LF_FWD", "f64", "double", ""),
    ],
    [
        op_modules!("leapfrog_bwd", "LF_BWD", "f32", "float", ""),
        op_modules!("leapfrog_bwd", "LF_BWD", "f64", "double", ""),
    ],
];

/// `(name, source)` of the family's kernel modules: one per op, dtype and fast
/// configuration, plus a generic one per op and dtype, so a program compiles only the
/// kernels it uses (a few seconds of NVRTC each).
pub const MODULES: [(&str, fn() -> String); 4 * 2 * PER] = {
    let mut all = [OPS[0][0][0]; 4 * 2 * PER];
    let mut i = 0;
    while i < 4 * 2 * PER {
        all[i] = OPS[i / (2 * PER)][(i / PER) % 2][i % PER];
        i += 1;
    }
    all
};

/// A module's source: the op, the element type, the configuration (empty: generic)
/// and `extra` definitions (`GEO_TF32` for the f32 forwards, which also hold the
/// TF32 tensor-core variants of their fast kernel).
fn source(op: &str, t: &str, rp: &str, dj: &str, extra: &str) -> String {
    let cfg = if rp.is_empty() {
        "#define GEO_GENERIC 1\n".to_string()
    } else {
        format!("#define GEO_CFG_RP {rp}\n#define GEO_CFG_DJ {dj}\n")
    };
    format!(
        "// generated by src/cuda/geodesic.rs\n#define GEO_MODULE_{op} 1\n#define GEO_T {t}\n{cfg}{extra}{}",
        include_str!("../../kernels/geodesic.cu")
    )
}

const NT: u32 = 256;
/// Thread groups of `NT` per block of the Christoffel forward's TF32 kernel
/// (`GEO_GROUPS`): each group runs its own tiles with its own buffers. The FFMA
/// kernel runs one group with tiles of twice the rows (`GEO_MB_CF`).
const CHR_FWD_GROUPS: usize = 2;
const NW: usize = 8;
/// Rows per block iteration of the generic kernels.
const GEN_RG: usize = 4;
/// Padded ranks and feature groups of the fast kernels (index order of the name tables).
const RPS: [usize; 3] = [8, 16, 32];
const DJS: [usize; 4] = [2, 4, 8, 16];
/// Upper bound for one op's workspace (state slabs, parameter partials); the grid
/// shrinks to respect it.
const WS_BUDGET: usize = 512 << 20;
/// `GEO_SMEM_MAX` in the kernel source: configurations above it are stubs.
const SMEM_MAX: usize = 232_448;

macro_rules! fast_names {
    ($kind:literal) => {
        [
            [
                concat!("geo_", $kind, "_r8_d2"),
                concat!("geo_", $kind, "_r8_d4"),
                concat!("geo_", $kind, "_r8_d8"),
                concat!("geo_", $kind, "_r8_d16"),
            ],
            [
                concat!("geo_", $kind, "_r16_d2"),
                concat!("geo_", $kind, "_r16_d4"),
                concat!("geo_", $kind, "_r16_d8"),
                concat!("geo_", $kind, "_r16_d16"),
            ],
            [
                concat!("geo_", $kind, "_r32_d2"),
                concat!("geo_", $kind, "_r32_d4"),
                concat!("geo_", $kind, "_r32_d8"),
                concat!("geo_", $kind, "_r32_d16"),
            ],
        ]
    };
}

const FAST: [[[&str; 4]; 3]; 4] = [
    fast_names!("chr_fwd"),
    fast_names!("chr_bwd"),
    fast_names!("lf_fwd"),
    fast_names!("lf_bwd"),
];
/// The TF32 tensor-core variants of the f32 forwards (`Kind` order of the two).
const FAST_TC: [[[&str; 4]; 3]; 2] = [fast_names!("chr_fwd_tc"), fast_names!("lf_fwd_tc")];
const GENERIC: [&str; 4] = [
    "geo_chr_fwd_gen",
    "geo_chr_bwd_gen",
    "geo_lf_fwd_gen",
    "geo_lf_bwd_gen",
];

fn kind_index(k: Kind) -> usize {
    match k {
        Kind::ChristoffelForward => 0,
        Kind::ChristoffelBackward => 1,
        Kind::LeapfrogForward => 2,
        Kind::LeapfrogBackward => 3,
    }
}

/// The module of `kind` for dtype `d`: fast configuration `(ri, di)`, or the generic
/// module (`None`).
fn module_name(k: Kind, d: DType, cfg: Option<(usize, usize)>) -> &'static str {
    let j = cfg.map_or(PER - 1, |(ri, di)| ri * DJS.len() + di);
    OPS[kind_index(k)][usize::from(d != DType::F32)][j].0
}

/// Mirrors `struct GeoArgs` in the kernel source (passed by value).
#[repr(C)]
#[derive(Default)]
struct GeoArgs {
    b: i64,
    d: i64,
    r: i64,
    steps: i64,
    dt: f64,
    c: f64,
    x0: u64,
    v0: u64,
    f: u64,
    u: u64,
    w: u64,
    mu: u64,
    g: u64,
    gx: u64,
    gv: u64,
    x_out: u64,
    v_out: u64,
    traj: u64,
    gamma: u64,
    dx: u64,
    dv: u64,
    df: u64,
    du_part: u64,
    dw_part: u64,
    ws: u64,
    ws_per_cta: i64,
    want: i32,
    vec_ok: i32,
    smem_bytes: u32,
    pad: i32,
}

/// Mirrors `struct ReduceArgs`.
#[repr(C)]
struct ReduceArgs {
    parts: u64,
    out: u64,
    nparts: i64,
    n: i64,
}

const WANT_DV: i32 = 1;
const WANT_DU: i32 = 2;
const WANT_DW: i32 = 4;
const WANT_DF: i32 = 8;
const WANT_DX: i32 = 16;

/// A fast-kernel configuration.
#[derive(Debug, Clone, Copy)]
struct Fast {
    ri: usize,
    di: usize,
    /// rows per tile
    m: usize,
    /// padded D
    dp: usize,
    smem: usize,
    /// the TF32 tensor-core variant
    tc: bool,
}

/// Rows per thread (`GEO_MB_A` / `GEO_MB_B` / `GEO_MB_CF` in the kernel source; the
/// TF32 Christoffel forward: 4).
fn mb(kind: Kind, dj: usize) -> usize {
    match kind {
        Kind::ChristoffelForward => {
            if dj <= 8 {
                8
            } else {
                4
            }
        }
        Kind::LeapfrogBackward => {
            if dj <= 8 {
                2
            } else {
                1
            }
        }
        _ => {
            if dj <= 8 {
                4
            } else {
                2
            }
        }
    }
}

/// Shared memory in bytes of the fast kernel (`smem_*` in the kernel source).
fn fast_smem(kind: Kind, rp: usize, dj: usize, esize: usize) -> (usize, usize) {
    let mb = mb(kind, dj);
    let m = 4 * mb;
    let kw = 8 * dj;
    let dp = NW * kw;
    let su = rp + 4;
    let sv = kw + 4;
    let slice = m * sv.max(su);
    let elems = match kind {
        Kind::ChristoffelForward => 2 * dp * su + NW * slice + m * su,
        Kind::LeapfrogForward => 2 * dp * su + NW * slice + m * su,
        Kind::ChristoffelBackward => 2 * dp * su + 2 * NW * slice + 3 * m * su,
        Kind::LeapfrogBackward => 2 * dp * su + 2 * NW * slice + 5 * m * su + 2 * m * dp,
    };
    (elems * esize, m)
}

fn fast_config(kind: Kind, job: &Job, max_smem: usize) -> Option<Fast> {
    let ri = RPS.iter().position(|&rp| rp >= job.r)?;
    let di = DJS.iter().position(|&dj| 64 * dj >= job.d)?;
    let dp = 64 * DJS[di];
    let (mut smem, mut m) = fast_smem(kind, RPS[ri], DJS[di], job.dtype.size());
    // TF32 variants: f32 forwards with D <= 512; U and W in mma fragment order
    let tc = job.flags & GEO_ALLOW_TF32 != 0
        && job.dtype == DType::F32
        && matches!(kind, Kind::ChristoffelForward | Kind::LeapfrogForward)
        && DJS[di] <= 8;
    if tc {
        smem = if kind == Kind::ChristoffelForward {
            // `SMEM_CHR_FWD_TC`: U and W in fragment order, per group the warps'
            // partials and S (no tile buffer: v goes straight to registers)
            // (tiles of 16 rows)
            let (rp, su) = (RPS[ri], RPS[ri] + 4);
            m = 16;
            (2 * dp * rp + CHR_FWD_GROUPS * (NW + 1) * m * su) * job.dtype.size()
        } else {
            // `SMEM_LF_FWD_TC`: U and W as [DP][RP] (fragment order) instead of
            // [DP][RP + 4] rows
            smem - 2 * dp * 4 * job.dtype.size()
        };
    }
    (smem <= max_smem.min(SMEM_MAX)).then_some(Fast {
        ri,
        di,
        m,
        dp,
        smem,
        tc,
    })
}

/// The device's opt-in shared memory per block, cached per ordinal.
fn max_smem(dev: &CudaDevice) -> Result<usize> {
    static CACHE: Mutex<Option<HashMap<usize, usize>>> = Mutex::new(None);
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = g.as_ref().and_then(|m| m.get(&dev.ordinal)) {
        return Ok(*v);
    }
    dev.bind()?;
    let mut cu_dev: sys::CUdevice = 0;
    // SAFETY: writes one device handle; the device's primary context is current.
    unsafe { sys::cuCtxGetDevice(&mut cu_dev) }
        .result()
        .cuda("cuCtxGetDevice")?;
    // SAFETY: valid device handle.
    let v = unsafe {
        result::device::get_attribute(
            cu_dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
    }
    .cuda("cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")? as usize;
    g.get_or_insert_with(HashMap::new).insert(dev.ordinal, v);
    Ok(v)
}

#[allow(clippy::too_many_arguments)]
fn launch_args(
    dev: &CudaDevice,
    module: &'static str,
    name: &'static str,
    grid: u32,
    threads: u32,
    smem: usize,
    stream: &Stream,
    args: &mut GeoArgs,
) -> Result<()> {
    if smem > 48 << 10 {
        let f = dev.function(module, name)?;
        dev.bind()?;
        // SAFETY: a function of this context; the value was checked against the opt-in limit.
        unsafe {
            result::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
        }
        .cuda(&format!(
            "cuFuncSetAttribute({name}, MAX_DYNAMIC_SHARED_SIZE_BYTES)"
        ))?;
    }
    let mut params = [args as *mut GeoArgs as *mut c_void];
    launch(
        dev,
        module,
        name,
        (grid, 1, 1),
        (threads, 1, 1),
        smem as u32,
        stream.raw,
        &mut params,
    )
}

fn reduce(
    dev: &CudaDevice,
    module: &'static str,
    parts: u64,
    nparts: usize,
    out: usize,
    n: usize,
    stream: &Stream,
) -> Result<()> {
    let mut a = ReduceArgs {
        parts,
        out: out as u64,
        nparts: nparts as i64,
        n: n as i64,
    };
    let grid = n
        .div_ceil(NT as usize)
        .clamp(1, dev.sm_count.max(1) as usize * 8) as u32;
    let mut params = [&mut a as *mut ReduceArgs as *mut c_void];
    launch(
        dev,
        module,
        "geo_reduce",
        (grid, 1, 1),
        (NT, 1, 1),
        0,
        stream.raw,
        &mut params,
    )
}

/// The GEMM route, for the shapes no fast kernel takes (R > 32, D > 1024, f64 with
/// large D*R): the products in cuBLAS, small elementwise kernels of the op's generic
/// module between them; `gamma_raw = (v U)^2 W^T` as `P = v U` (into a `[B, R]`
/// workspace), `P *= P` (`geo_square`), `P W^T`. About three `[B, D]` passes per
/// evaluation against the fast kernels' two (as PyTorch eager), ~10x faster than the
/// generic kernels (BENCHMARKS.md). TF32 products with `FK_GEO_ALLOW_TF32` (f32
/// forwards).
use crate::ops::linalg::{GemmPlan, Mat, Trans, dense};

struct GemmRoute<'a> {
    dev: &'a CudaDevice,
    stream: &'a Stream,
    job: &'a Job,
    module: &'static str,
    slot: std::sync::Arc<std::sync::Mutex<super::cublas::Slot>>,
    p: Workspace<'a>,
    /// The op's own workspace (`extra` bytes at `new`).
    ws: Option<Workspace<'a>>,
}

impl<'a> GemmRoute<'a> {
    /// Takes everything the route needs (cuBLAS's slot, the `[B, R]` products and
    /// `extra` bytes for the op) before any work is queued, so that a failure here
    /// (out of memory) can still leave the op to the generic kernels.
    fn new(
        dev: &'a CudaDevice,
        kind: Kind,
        job: &'a Job,
        stream: &'a Stream,
        extra: usize,
    ) -> Result<Self> {
        Ok(GemmRoute {
            dev,
            stream,
            job,
            module: module_name(kind, job.dtype, None),
            slot: dev.blas.slot(dev, stream.raw)?,
            p: Workspace::new(dev, job.b * job.r * job.dtype.size(), stream.raw)?,
            ws: if extra > 0 {
                Some(Workspace::new(dev, extra, stream.raw)?)
            } else {
                None
            },
        })
    }

    /// The op's workspace.
    fn ws(&self) -> usize {
        self.ws.as_ref().map_or(0, |w| w.ptr as usize)
    }

    /// `c = op_a(a) op_b(b)` (row-major, dense), TF32 products where `tf32`.
    fn gemm(&self, op_a: Trans, a: Mat, op_b: Trans, b: Mat, c: Mat, tf32: bool) -> Result<()> {
        let g = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        super::cublas::gemm_ex(
            &g,
            &GemmPlan::new(self.job.dtype, op_a, a, op_b, b, c, 1.0, 0.0, 1, tf32),
        )
    }

    /// `s = p * p` over the `[B, R]` products (`s` may be `p`).
    fn square(&self, s: usize, p: usize) -> Result<()> {
        self.ew("geo_square", s, p, (self.job.b * self.job.r) as i64, 0.0)
    }

    /// An elementwise step of the generic module (`EwArgs`): `y[i]` from `y[i]`,
    /// `x[i]` and `c`, `i < n`.
    fn ew(&self, name: &'static str, y: usize, x: usize, n: i64, c: f64) -> Result<()> {
        #[repr(C)]
        struct EwArgs {
            y: u64,
            x: u64,
            n: i64,
            c: f64,
        }
        let mut a = EwArgs {
            y: y as u64,
            x: x as u64,
            n,
            c,
        };
        self.launch(name, n, &mut [&mut a as *mut EwArgs as *mut c_void])
    }

    /// `out = (v U)^2 W^T` (`out` may be `v`: `v` is read before `out` is written).
    fn gamma_raw(&self, v: usize, out: usize) -> Result<()> {
        let j = self.job;
        let (b, d, r) = (j.b as i64, j.d as i64, j.r as i64);
        let tf32 = j.flags & GEO_ALLOW_TF32 != 0 && j.dtype == DType::F32;
        let p = self.p.ptr as usize;
        self.gemm(
            Trans::N,
            dense(v, b, d, 0),
            Trans::N,
            dense(j.u, d, r, 0),
            dense(p, b, r, 0),
            tf32,
        )?;
        self.square(p, p)?;
        self.gemm(
            Trans::N,
            dense(p, b, r, 0),
            Trans::T,
            dense(j.w, d, r, 0),
            dense(out, b, d, 0),
            tf32,
        )
    }

    /// An elementwise kernel of the generic module over `n` elements.
    fn launch(&self, name: &'static str, n: i64, params: &mut [*mut c_void]) -> Result<()> {
        let grid = (n.max(1) as usize)
            .div_ceil(NT as usize)
            .clamp(1, self.dev.sm_count.max(1) as usize * 8);
        launch(
            self.dev,
            self.module,
            name,
            (grid as u32, 1, 1),
            (NT, 1, 1),
            0,
            self.stream.raw,
            params,
        )
    }
}

/// The Christoffel forward through the GEMM route: `gamma_raw`, then the clamp in
/// place (skipped for `c = +inf`).
fn chr_fwd_gemm(route: GemmRoute) -> Result<()> {
    let job = route.job;
    route.gamma_raw(job.v0, job.gamma)?;
    if job.c.is_finite() {
        route.ew("geo_clamp", job.gamma, 0, (job.b * job.d) as i64, job.c)?;
    }
    Ok(())
}

/// The leapfrog forward through the GEMM route: the state lives in `x_out`, `v_out`
/// (copied from `x0`, `v0` unless in place), each step is `gamma_raw(v)` into a
/// `[B, D]` workspace, the first kick with the drift, `gamma_raw(vh)`, the second
/// kick; the kicks also write the trajectory rows.
fn lf_fwd_gemm(route: GemmRoute) -> Result<()> {
    let (dev, job, stream) = (route.dev, route.job, route.stream);
    #[repr(C)]
    struct KickArgs {
        n: i64,
        d: i64,
        x: u64,
        v: u64,
        raw: u64,
        f: u64,
        mu: u64,
        tx: u64,
        tv: u64,
        h: f64,
        dt: f64,
        c: f64,
    }
    let bytes = job.b * job.d * job.dtype.size();
    let raw = route.ws() as u64;
    for (dst, src) in [(job.x_out, job.x0), (job.v_out, job.v0)] {
        if dst != src {
            dev.memcpy_async(dst as u64, src as u64, bytes, stream.raw)?;
        }
    }
    let n = (job.b * job.d) as i64;
    let traj = |t: usize, k: usize| -> u64 {
        if job.traj == 0 {
            0
        } else {
            (job.traj + (2 * t + k) * bytes) as u64
        }
    };
    for t in 0..job.steps {
        for first in [true, false] {
            route.gamma_raw(job.v_out, raw as usize)?;
            let mut a = KickArgs {
                n,
                d: job.d as i64,
                x: if first { job.x_out as u64 } else { 0 },
                v: job.v_out as u64,
                raw,
                f: job.f as u64,
                mu: job.mu as u64,
                tx: if first { traj(t, 0) } else { 0 },
                tv: if first { 0 } else { traj(t, 1) },
                h: 0.5 * job.dt,
                dt: job.dt,
                c: job.c,
            };
            route.launch("geo_kick", n, &mut [&mut a as *mut KickArgs as *mut c_void])?;
        }
    }
    Ok(())
}

/// The Christoffel backward through the GEMM route (strict products; the flag is
/// ignored as in the fast kernels): `P = v U`, `S = P^2`, `raw = S W^T` into a
/// `[B, D]` workspace, `g' = g 1[|raw| <= c]` there (`geo_mask`), `dW = g'^T S`,
/// `Q = g' W`, `dP = 2 P Q` (`geo_dp`), `dv = dP U^T`, `dU = v^T dP`. cuBLAS's
/// products are deterministic, so dU and dW are reproducible run to run.
fn chr_bwd_gemm(route: GemmRoute) -> Result<()> {
    let job = route.job;
    let (b, d, r) = (job.b as i64, job.d as i64, job.r as i64);
    let br = job.b * job.r * job.dtype.size();
    let p = route.p.ptr as usize;
    let (s, q) = (route.ws(), route.ws() + br);
    let raw = route.ws() + 2 * br;
    route.gemm(
        Trans::N,
        dense(job.v0, b, d, 0),
        Trans::N,
        dense(job.u, d, r, 0),
        dense(p, b, r, 0),
        false,
    )?;
    route.square(s, p)?;
    route.gemm(
        Trans::N,
        dense(s, b, r, 0),
        Trans::T,
        dense(job.w, d, r, 0),
        dense(raw, b, d, 0),
        false,
    )?;
    route.ew("geo_mask", raw, job.g, b * d, job.c)?;
    if job.dw != 0 {
        route.gemm(
            Trans::T,
            dense(raw, b, d, 0),
            Trans::N,
            dense(s, b, r, 0),
            dense(job.dw, d, r, 0),
            false,
        )?;
    }
    if job.dv == 0 && job.du == 0 {
        return Ok(());
    }
    route.gemm(
        Trans::N,
        dense(raw, b, d, 0),
        Trans::N,
        dense(job.w, d, r, 0),
        dense(q, b, r, 0),
        false,
    )?;
    route.ew("geo_dp", q, p, b * r, 0.0)?;
    if job.dv != 0 {
        route.gemm(
            Trans::N,
            dense(q, b, r, 0),
            Trans::T,
            dense(job.u, d, r, 0),
            dense(job.dv, b, d, 0),
            false,
        )?;
    }
    if job.du != 0 {
        route.gemm(
            Trans::T,
            dense(job.v0, b, d, 0),
            Trans::N,
            dense(q, b, r, 0),
            dense(job.du, d, r, 0),
            false,
        )?;
    }
    Ok(())
}

/// Runs one geodesic op on `stream` (validated by `ops::geodesic`).
pub fn run(dev: &CudaDevice, kind: Kind, job: &Job, stream: &Stream) -> Result<()> {
    let esize = job.dtype.size();
    let sms = dev.sm_count.max(1) as usize;
    let fast = if job.flags & GEO_FORCE_GENERIC != 0 {
        None
    } else {
        fast_config(kind, job, max_smem(dev)?)
    };
    // no fast kernel for the Christoffel forward: cuBLAS, when it loads (cuBLAS takes
    // 32-bit sizes)
    // (B = 0 stays with the kernels, which write the zero parameter gradients)
    if fast.is_none()
        && job.flags & GEO_FORCE_GENERIC == 0
        && job.b > 0
        && job.b.max(job.d).max(job.r) <= i32::MAX as usize
        && super::cublas::load().is_ok()
    {
        let (bd, br) = (job.b * job.d * esize, job.b * job.r * esize);
        let extra = match kind {
            Kind::ChristoffelForward => Some(0),
            Kind::LeapfrogForward => Some(bd),
            Kind::ChristoffelBackward => Some(2 * br + bd),
            Kind::LeapfrogBackward => None,
        };
        if let Some(extra) = extra {
            match GemmRoute::new(dev, kind, job, stream, extra) {
                Ok(route) => {
                    return match kind {
                        Kind::ChristoffelForward => chr_fwd_gemm(route),
                        Kind::LeapfrogForward => lf_fwd_gemm(route),
                        _ => chr_bwd_gemm(route),
                    };
                }
                // nothing queued yet: the generic kernels, which need less memory
                Err(e) if e.status == crate::error::FK_ERROR_OUT_OF_MEMORY => {}
                Err(e) => return Err(e),
            }
        }
    }
    let want = (if job.dv != 0 { WANT_DV } else { 0 })
        | (if job.du != 0 { WANT_DU } else { 0 })
        | (if job.dw != 0 { WANT_DW } else { 0 })
        | (if job.df != 0 { WANT_DF } else { 0 })
        | (if job.dx != 0 { WANT_DX } else { 0 });
    let params =
        job.d * job.r * usize::from(job.du != 0) + job.d * job.r * usize::from(job.dw != 0);
    let no_traj_slab = kind == Kind::LeapfrogBackward && job.traj == 0 && job.steps > 1;
    // grid, per-block workspace (elements), kernel name, dynamic smem
    let (mut grid, ws_per_cta, name, smem, module) = match fast {
        Some(f) => {
            let tiles = job.b.div_ceil(f.m);
            let ws = if no_traj_slab {
                (job.steps - 1) * f.m * f.dp
            } else {
                0
            };
            (
                tiles.clamp(1, sms),
                ws,
                if f.tc {
                    FAST_TC[kind_index(kind) / 2][f.ri][f.di]
                } else {
                    FAST[kind_index(kind)][f.ri][f.di]
                },
                f.smem,
                module_name(kind, job.dtype, Some((f.ri, f.di))),
            )
        }
        None => {
            let (d, r) = (job.d, job.r);
            let ws = match kind {
                Kind::ChristoffelForward | Kind::LeapfrogForward => GEN_RG * r,
                Kind::ChristoffelBackward => 3 * GEN_RG * r + GEN_RG * d,
                Kind::LeapfrogBackward => {
                    5 * GEN_RG * r
                        + 4 * GEN_RG * d
                        + if job.traj == 0 {
                            job.steps.saturating_sub(1) * GEN_RG * d
                        } else {
                            0
                        }
                }
            };
            (
                job.b.div_ceil(GEN_RG).clamp(1, sms * 4),
                ws,
                GENERIC[kind_index(kind)],
                0,
                module_name(kind, job.dtype, None),
            )
        }
    };
    let per_cta_bytes = (ws_per_cta + params) * esize;
    if let Some(fit) = WS_BUDGET.checked_div(per_cta_bytes) {
        grid = grid.min(fit.max(1));
    }
    let total = grid * per_cta_bytes;
    let ws = if total > 0 {
        Some(Workspace::new(dev, total, stream.raw)?)
    } else {
        None
    };
    let base = ws.as_ref().map_or(0, |w| w.ptr);
    let ws_bytes = grid * ws_per_cta * esize;
    let du_part = if job.du != 0 {
        base + ws_bytes as u64
    } else {
        0
    };
    let dw_part = if job.dw != 0 {
        base + (ws_bytes + grid * job.d * job.r * esize * usize::from(job.du != 0)) as u64
    } else {
        0
    };
    let vec_ok = job.v0 % 16 == 0 && (job.d * esize) % 16 == 0;
    let mut args = GeoArgs {
        b: job.b as i64,
        d: job.d as i64,
        r: job.r as i64,
        steps: job.steps as i64,
        dt: job.dt,
        c: job.c,
        x0: job.x0 as u64,
        v0: job.v0 as u64,
        f: job.f as u64,
        u: job.u as u64,
        w: job.w as u64,
        mu: job.mu as u64,
        g: job.g as u64,
        gx: job.gx as u64,
        gv: job.gv as u64,
        x_out: job.x_out as u64,
        v_out: job.v_out as u64,
        traj: job.traj as u64,
        gamma: job.gamma as u64,
        dx: job.dx as u64,
        dv: job.dv as u64,
        df: job.df as u64,
        du_part,
        dw_part,
        ws: base,
        ws_per_cta: ws_per_cta as i64,
        want,
        vec_ok: vec_ok as i32,
        smem_bytes: smem as u32,
        pad: 0,
    };
    crate::ensure!(
        grid <= u32::MAX as usize,
        FK_ERROR_INTERNAL,
        "grid of {grid} blocks"
    );
    // the Christoffel forward's TF32 kernel runs CHR_FWD_GROUPS groups of NT threads
    let threads = match (fast, kind) {
        (Some(f), Kind::ChristoffelForward) if f.tc => NT * CHR_FWD_GROUPS as u32,
        _ => NT,
    };
    launch_args(
        dev,
        module,
        name,
        grid as u32,
        threads,
        smem,
        stream,
        &mut args,
    )?;
    let n = job.d * job.r;
    let generic = module_name(kind, job.dtype, None); // holds geo_reduce
    if job.du != 0 {
        reduce(dev, generic, du_part, grid, job.du, n, stream)?;
    }
    if job.dw != 0 {
        reduce(dev, generic, dw_part, grid, job.dw, n, stream)?;
    }
    drop(ws);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Module names are unique and every kernel's module is found.
    #[test]
    fn module_table() {
        let mut names: Vec<&str> = MODULES.iter().map(|m| m.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), MODULES.len());
        assert_eq!(
            module_name(Kind::LeapfrogBackward, DType::F64, Some((2, 3))),
            "geodesic_leapfrog_bwd_f64_r32_d16"
        );
        assert_eq!(
            module_name(Kind::ChristoffelForward, DType::F32, None),
            "geodesic_christoffel_fwd_f32_generic"
        );
        assert!(
            MODULES[0].1()
                .contains("#define GEO_CFG_RP 8\n#define GEO_CFG_DJ 2\n#define GEO_TF32 1")
        );
        assert_eq!(FAST_TC[1][2][2], "geo_lf_fwd_tc_r32_d8");
    }

    /// The H100 configuration of the performance goals fits its 227 KB opt-in limit.
    #[test]
    fn fast_configs_for_the_benchmark_shape() {
        let limit = 232_448;
        for kind in [
            Kind::ChristoffelForward,
            Kind::ChristoffelBackward,
            Kind::LeapfrogForward,
            Kind::LeapfrogBackward,
        ] {
            let (smem, _) = fast_smem(kind, 32, 8, 4);
            assert!(smem <= limit, "{kind:?} needs {smem} bytes");
        }
        assert_eq!(fast_smem(Kind::ChristoffelForward, 32, 8, 4).0, 221_696);
        assert_eq!(fast_smem(Kind::ChristoffelBackward, 32, 8, 4).0, 224_000);
    }
}
