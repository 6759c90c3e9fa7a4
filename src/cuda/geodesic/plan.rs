//! Which kernel runs an op, as a pure function of the op, the job and the device's
//! limits: `plan` returns the route (fast kernel, cuBLAS route or generic kernel), the
//! variant of the fast kernel, its tile, threads, grid and shared memory, and the
//! workspace layout. The launcher (`super::run`) only packs arguments, allocates and
//! launches what the plan says. docs/geodesic.md has the measurements behind the
//! choices.
//!
//! The shared-memory sizes of the fast kernels are computed in `config` only
//! (`smem`): every fast module's source gets them as `#define`s (`config::defines`),
//! and the plan takes the same values for its launches.

use crate::dtype::DType;
use crate::error::{FK_ERROR_INTERNAL, Result};
use crate::plan::geodesic::{GEO_ALLOW_TF32, GEO_ALLOW_TF32X3, GEO_FORCE_GENERIC, Job, Kind};

use super::config::{
    CHR_FWD_GROUPS, GEN_RG, NT, SMEM_MAX, TC_M, Tile, Variant, WANT_DF, WANT_DU, WANT_DV, WANT_DW,
    WANT_DX, smem, sw_m,
};
use super::names;

/// Upper bound for one op's workspace (state slabs, parameter partials); the grid
/// shrinks to respect it.
const WS_BUDGET: usize = 512 << 20;

/// A fast kernel's launch: its tile, variant, rows per tile and shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Fast {
    pub tile: Tile,
    pub variant: Variant,
    /// rows per tile
    pub m: usize,
    pub smem: usize,
}

/// The fast kernel for `kind` where one fits `max_smem` (the device's opt-in shared
/// memory per block), with the variant the flags permit.
fn fast(kind: Kind, job: &Job, max_smem: usize) -> Option<Fast> {
    let tile = Tile::fitting(job.r, job.d)?;
    let s = smem(kind, tile, job.dtype);
    let limit = max_smem.min(SMEM_MAX);
    let (variant, m, bytes) = match s.tc {
        // TF32 where permitted; the leapfrog's v stage where it fits (the kernel sees it
        // in `smem_bytes`)
        Some(tc) if job.flags & GEO_ALLOW_TF32 != 0 => match s.stage {
            Some(stage) if tc + stage <= limit => (Variant::Tf32Staged, TC_M, tc + stage),
            _ => (Variant::Tf32, TC_M, tc),
        },
        // 3xTF32 where permitted, T >= 2 and it fits; otherwise the strict kernel
        _ => match (s.tc3, s.rs) {
            (Some(tc3), _)
                if job.flags & GEO_ALLOW_TF32X3 != 0 && job.steps >= 2 && tc3 <= limit =>
            {
                (Variant::Tf32x3, s.m, tc3)
            }
            // the register kernel where its shared memory fits, T >= 2
            (_, Some(rs)) if job.steps >= 2 && rs <= limit => {
                (Variant::StrictRegisters, s.m, s.strict.max(rs))
            }
            _ => (Variant::Strict, s.m, s.strict),
        },
    };
    (bytes <= limit).then_some(Fast {
        tile,
        variant,
        m,
        smem: bytes,
    })
}

/// How a backward's per-block parameter partials are laid out: `[D][R]` (generic
/// kernels), or the fast kernels' parameter layout (`param_store`: `DP x RP` elements,
/// accumulator-major, so that the blocks' stores are coalesced), which `geo_reduce`
/// maps back to `[D][R]`. Only the backwards write partials (dU, dW).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PartLayout {
    /// elements per partial
    pub n: usize,
    /// the gradient's shape `[D][R]`
    pub d: usize,
    pub r: usize,
    /// `Cfg::KW`, `PV`, `RQ` of the coalesced layout's configuration (`kw` 0: `[D][R]`)
    pub kw: i32,
    pub pv: i32,
    pub rq: i32,
}

impl PartLayout {
    fn new(tile: Option<Tile>, d: usize, r: usize) -> PartLayout {
        match tile {
            Some(t) => PartLayout {
                n: t.dp() * t.rp,
                d,
                r,
                kw: 8 * t.dj as i32,
                pv: t.dj.min(4) as i32,
                rq: t.rp as i32 / 4,
            },
            None => PartLayout {
                n: d * r,
                d,
                r,
                kw: 0,
                pv: 0,
                rq: 0,
            },
        }
    }
}

/// A kernel launch (fast or generic) and its workspace: per-block slabs of `per_cta`
/// elements, then the dU partials, then the dW partials (`grid` of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KernelPlan {
    pub variant: Variant,
    pub fast: Option<Fast>,
    pub module: &'static str,
    pub kernel: &'static str,
    /// the module holding `geo_reduce` (the op's generic module)
    pub reduce_module: &'static str,
    pub grid: usize,
    pub threads: u32,
    pub smem: usize,
    /// `GeoArgs::want`
    pub want: i32,
    /// workspace elements per block (`GeoArgs::ws_per_cta`)
    pub per_cta: usize,
    pub parts: PartLayout,
    /// byte offsets of the dU and dW partials in the workspace (where wanted)
    pub du_part: Option<usize>,
    pub dw_part: Option<usize>,
    /// the workspace's bytes (0: none)
    pub ws_bytes: usize,
}

/// The cuBLAS route's choices (`super::route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RoutePlan {
    /// the op's generic module (its elementwise kernels)
    pub module: &'static str,
    /// TF32 products (the f32 forwards with `FK_GEO_ALLOW_TF32`)
    pub tf32: bool,
    /// `geo_sw`'s shared memory where the route fuses it (`Steps::fused`), else 0
    pub sw_smem: usize,
    pub layout: Layout,
}

/// What runs an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// A fast or generic kernel.
    Kernel(KernelPlan),
    /// The cuBLAS route, and the generic kernel where its memory cannot be had.
    Route {
        route: RoutePlan,
        fallback: KernelPlan,
    },
}

/// What the plan needs to know of the device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// opt-in shared memory per block
    pub max_smem: usize,
    /// multiprocessors (at least 1)
    pub sms: usize,
    /// whether cuBLAS loads (asked only where `route_possible`)
    pub cublas: bool,
}

/// Whether the op may take the cuBLAS route: no fast kernel fits, `GEO_FORCE_GENERIC`
/// is not set, B > 0 (B = 0 stays with the kernels, which write the zero parameter
/// gradients) and the sizes fit cuBLAS's 32-bit ints.
pub(super) fn route_possible(kind: Kind, job: &Job, max_smem: usize) -> bool {
    job.flags & GEO_FORCE_GENERIC == 0
        && job.b > 0
        && job.b.max(job.d).max(job.r) <= i32::MAX as usize
        && fast(kind, job, max_smem).is_none()
}

/// The plan for `kind` on `job` (validated by `ops::geodesic`) under `lim`.
pub(super) fn plan(kind: Kind, job: &Job, lim: &Limits) -> Result<Plan> {
    let fast = if job.flags & GEO_FORCE_GENERIC != 0 {
        None
    } else {
        fast(kind, job, lim.max_smem)
    };
    if fast.is_none() && lim.cublas && route_possible(kind, job, lim.max_smem) {
        let sw_smem = route_sw_smem(kind, job, lim.max_smem);
        if let Some(layout) = Layout::new(kind, job, sw_smem > 0) {
            return Ok(Plan::Route {
                route: RoutePlan {
                    module: names::module(kind, job.dtype, None)?,
                    tf32: route_tf32(kind, job),
                    sw_smem,
                    layout,
                },
                fallback: kernel(kind, job, None, lim.sms)?,
            });
        }
    }
    Ok(Plan::Kernel(kernel(kind, job, fast, lim.sms)?))
}

/// The launch of the fast kernel `fast`, or of the generic kernel.
fn kernel(kind: Kind, job: &Job, fast: Option<Fast>, sms: usize) -> Result<KernelPlan> {
    let esize = job.dtype.size();
    let want = (if job.dv.is_some() { WANT_DV } else { 0 })
        | (if job.du.is_some() { WANT_DU } else { 0 })
        | (if job.dw.is_some() { WANT_DW } else { 0 })
        | (if job.df.is_some() { WANT_DF } else { 0 })
        | (if job.dx.is_some() { WANT_DX } else { 0 });
    let parts = PartLayout::new(fast.map(|f| f.tile), job.d, job.r);
    let params = parts.n * usize::from(job.du.is_some()) + parts.n * usize::from(job.dw.is_some());
    let (mut grid, per_cta, variant, smem) = match fast {
        Some(f) => {
            // without a trajectory the leapfrog backward keeps the recomputed states
            let per_cta = if kind == Kind::LeapfrogBackward && job.traj.is_none() && job.steps > 1 {
                (job.steps - 1) * f.m * f.tile.dp()
            } else {
                0
            };
            (
                job.b.div_ceil(f.m).clamp(1, sms),
                per_cta,
                f.variant,
                f.smem,
            )
        }
        None => {
            let (d, r) = (job.d, job.r);
            let per_cta = match kind {
                Kind::ChristoffelForward | Kind::LeapfrogForward => GEN_RG * r,
                Kind::ChristoffelBackward => 3 * GEN_RG * r + GEN_RG * d,
                Kind::LeapfrogBackward => {
                    5 * GEN_RG * r
                        + 4 * GEN_RG * d
                        + if job.traj.is_none() {
                            job.steps.saturating_sub(1) * GEN_RG * d
                        } else {
                            0
                        }
                }
            };
            (
                job.b.div_ceil(GEN_RG).clamp(1, sms * 4),
                per_cta,
                Variant::Generic,
                0,
            )
        }
    };
    let per_cta_bytes = (per_cta + params) * esize;
    if let Some(fit) = WS_BUDGET.checked_div(per_cta_bytes) {
        grid = grid.min(fit.max(1));
    }
    crate::ensure!(
        grid <= u32::MAX as usize,
        FK_ERROR_INTERNAL,
        "grid of {grid} blocks"
    );
    let slabs = grid * per_cta * esize;
    let du_bytes = grid * parts.n * esize * usize::from(job.du.is_some());
    let tile = fast.map(|f| f.tile);
    Ok(KernelPlan {
        variant,
        fast,
        module: names::module(kind, job.dtype, tile)?,
        kernel: names::kernel(kind, job.dtype, variant, tile)?,
        reduce_module: names::module(kind, job.dtype, None)?,
        grid,
        // the Christoffel forward's TF32 kernel runs CHR_FWD_GROUPS groups of NT threads
        threads: if kind == Kind::ChristoffelForward && variant == Variant::Tf32 {
            NT * CHR_FWD_GROUPS as u32
        } else {
            NT
        },
        smem,
        want,
        per_cta,
        parts,
        du_part: (job.du.is_some()).then_some(slabs),
        dw_part: (job.dw.is_some()).then_some(slabs + du_bytes),
        ws_bytes: grid * per_cta_bytes,
    })
}

/// Whether the route's forward products are TF32 (`FK_GEO_ALLOW_TF32`, f32 forwards).
pub(super) fn route_tf32(kind: Kind, job: &Job) -> bool {
    job.flags & GEO_ALLOW_TF32 != 0
        && job.dtype == DType::F32
        && matches!(kind, Kind::ChristoffelForward | Kind::LeapfrogForward)
}

/// Shared memory of `geo_sw` in bytes: W as `[D][RS]` and a tile of S (`sw_m` rows, at
/// most `RS` columns), `RS` R rounded up to 4 and to an odd number of 16-byte chunks
/// (`geo_sw_stride`); `None` on overflow.
fn sw_smem(job: &Job) -> Option<usize> {
    let q = job.r.div_ceil(4);
    let rs = 4 * if q % 2 == 0 { q + 1 } else { q };
    job.d
        .checked_add(sw_m(job.dtype))?
        .checked_mul(rs)?
        .checked_mul(job.dtype.size())
}

/// `geo_sw`'s shared memory for this op where the route takes it: strict products
/// (with TF32 allowed cuBLAS's TF32 product stays) and W with a tile within
/// `max_smem`; else 0.
fn route_sw_smem(kind: Kind, job: &Job, max_smem: usize) -> usize {
    match sw_smem(job) {
        Some(b) if b <= max_smem && !route_tf32(kind, job) => b,
        _ => 0,
    }
}

/// Byte offsets of the route's pieces in its workspace (the `extra` bytes of
/// `GemmRoute::new`), each rounded up to 256 bytes, and the total. Which pieces an op
/// takes: the Christoffel forward none; the leapfrog forward `raw`; the Christoffel
/// backward `s`, `raw`; the leapfrog backward (unless it only writes `dx0`) `s`, `p0`,
/// `s1`, `raw`, `raw1`, `vh`, `lv` (without `dv0`, which otherwise holds it) and
/// `slab` (without a trajectory, T > 1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    /// `[B, R]`: `S = P^2` (the Christoffel backward; the leapfrog backward's at
    /// `v_t`), also `Q` of the vjp once `S` is consumed
    pub s: usize,
    /// `[B, R]`: the leapfrog backward's `P` at `v_t` (its `P` at `vh` is
    /// `GemmRoute::p`) and `S` at `vh`
    pub p0: usize,
    pub s1: usize,
    /// `[B, D]`: `gamma_raw` (at `v_t` in the leapfrog backward), then `g'`
    pub raw: usize,
    /// `[B, D]`, the leapfrog backward: `gamma_raw` at `vh`, then `g'`; `vh`; the
    /// adjoint `lv`
    pub raw1: usize,
    pub vh: usize,
    pub lv: usize,
    /// `[T - 1]` x `[B, D]` (stride `bd`): the recomputed `v_1 .. v_{T-1}`
    pub slab: usize,
    pub bd: usize,
    pub bytes: usize,
}

impl Layout {
    /// `None` where the sizes overflow (the route is then not taken). `fused`: the
    /// route runs `geo_sw` (`Steps::fused`), so the forwards' raw never goes to memory.
    pub(super) fn new(kind: Kind, job: &Job, fused: bool) -> Option<Layout> {
        let e = job.dtype.size();
        let piece = |rows: usize, cols: usize| {
            rows.checked_mul(cols)?
                .checked_mul(e)?
                .checked_next_multiple_of(256)
        };
        let (br, bd) = (piece(job.b, job.r)?, piece(job.b, job.d)?);
        let mut end = 0usize;
        let mut take = |bytes: usize| -> Option<usize> {
            let at = end;
            end = end.checked_add(bytes)?;
            Some(at)
        };
        let mut l = Layout {
            bd,
            ..Layout::default()
        };
        match kind {
            Kind::ChristoffelForward => {}
            Kind::LeapfrogForward => {
                if !fused {
                    l.raw = take(bd)?;
                }
            }
            Kind::ChristoffelBackward => {
                l.s = take(br)?;
                l.raw = take(bd)?;
            }
            Kind::LeapfrogBackward => {
                if lf_bwd_sweeps(job) {
                    l.s = take(br)?;
                    l.p0 = take(br)?;
                    l.s1 = take(br)?;
                    l.raw = take(bd)?;
                    l.raw1 = take(bd)?;
                    l.vh = take(bd)?;
                    if job.dv.is_none() {
                        l.lv = take(bd)?;
                    }
                    if job.traj.is_none() && job.steps > 1 {
                        l.slab = take((job.steps - 1).checked_mul(bd)?)?;
                    }
                }
            }
        }
        l.bytes = end;
        Some(l)
    }
}

/// Whether the leapfrog backward runs its adjoint sweep (any output but `dx0`).
pub(super) fn lf_bwd_sweeps(job: &Job) -> bool {
    job.dv.is_some() || job.df.is_some() || job.du.is_some() || job.dw.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;

    /// A stand-in address (the plan only asks whether an operand is present).
    fn some(a: u64) -> Option<Addr> {
        // SAFETY: never dereferenced: the plan only asks whether it is present.
        unsafe { Addr::from_raw(a) }
    }

    const H100: usize = 232_448;

    fn job(dtype: DType, b: usize, d: usize, r: usize, steps: usize, flags: u32) -> Job {
        let mut j = Job::absent(dtype, b, d, r);
        j.steps = steps;
        j.flags = flags;
        j
    }

    /// The fast kernel's choice, table-driven: (op, dtype, D, R, T, flags, the device's
    /// shared memory) -> (variant, tile rows, shared-memory bytes), or no fast kernel.
    #[test]
    fn fast_kernel_table() {
        use DType::{F32, F64};
        use Kind::*;
        use Variant::*;
        const TF32: u32 = GEO_ALLOW_TF32;
        const X3: u32 = GEO_ALLOW_TF32X3;
        type Row = (
            Kind,
            DType,
            usize,
            usize,
            usize,
            u32,
            usize,
            Option<(Variant, usize, usize)>,
        );
        #[rustfmt::skip]
        let table: [Row; 24] = [
            // the benchmark shape (B = 65536, D = 512, R = 32) on the H100
            (ChristoffelForward, F32, 512, 32, 1, 0, H100, Some((Strict, 32, 213_504))),
            (ChristoffelBackward, F32, 512, 32, 1, 0, H100, Some((Strict, 16, 207_616))),
            (LeapfrogBackward, F32, 512, 32, 8, 0, H100, Some((Strict, 8, 204_416))),
            (ChristoffelForward, F32, 512, 32, 1, TF32, H100, Some((Tf32, 16, 4 * (2 * 512 * 32 + 2 * 9 * 16 * 36)))),
            // the strict leapfrog forward: U and W in registers at T >= 2 where they fit
            (LeapfrogForward, F32, 512, 32, 8, 0, H100, Some((StrictRegisters, 16, 215_040))),
            (LeapfrogForward, F32, 300, 17, 8, 0, H100, Some((StrictRegisters, 16, 215_040))),
            (LeapfrogForward, F32, 512, 32, 1, 0, H100, Some((Strict, 16, 4 * (512 * 36 + 512 * 32 + 8 * 16 * 68 + 16 * 36)))),
            (LeapfrogForward, F32, 512, 32, 8, 0, 200_000, Some((Strict, 16, 4 * (512 * 36 + 512 * 32 + 8 * 16 * 68 + 16 * 36)))),
            (LeapfrogForward, F32, 512, 16, 8, 0, H100, Some((Strict, 16, 4 * (512 * 20 + 512 * 20 + 8 * 16 * 68 + 16 * 20)))),
            // 3xTF32: f32 leapfrog forward, T >= 2, without TF32 (which wins), where it fits
            (LeapfrogForward, F32, 512, 32, 8, X3, H100, Some((Tf32x3, 16, 221_696))),
            (LeapfrogForward, F32, 512, 32, 1, X3, H100, Some((Strict, 16, 4 * (512 * 36 + 512 * 32 + 8 * 16 * 68 + 16 * 36)))),
            (LeapfrogForward, F32, 512, 32, 8, X3, 200_000, Some((Strict, 16, 4 * (512 * 36 + 512 * 32 + 8 * 16 * 68 + 16 * 36)))),
            (ChristoffelForward, F32, 512, 32, 1, X3, H100, Some((Strict, 32, 213_504))),
            (LeapfrogForward, F64, 64, 8, 8, X3, H100, Some((Strict, 16, 8 * (128 * 12 * 2 + 8 * 16 * 20 + 16 * 12)))),
            // TF32 leapfrog: with its v stage where it fits, without where only it fits
            (LeapfrogForward, F32, 512, 32, 8, TF32 | X3, H100, Some((Tf32Staged, 16, 4 * (2 * 8 * 16 * 68 + 16 * 36 + 2 * 16 * 512 + 512)))),
            (LeapfrogForward, F32, 512, 32, 8, TF32, 4 * (8 * 16 * 68 + 16 * 36 + 2 * 16 * 512 + 512), Some((Tf32, 16, 4 * (8 * 16 * 68 + 16 * 36 + 2 * 16 * 512 + 512)))),
            // TF32 is for D <= 512: the strict kernel above
            (ChristoffelForward, F32, 1024, 8, 1, TF32, H100, Some((Strict, 16, 4 * (1024 * 12 * 2 + 8 * 16 * 132 + 16 * 12)))),
            // the TF32 kernel that does not fit leaves no fast kernel (the route)
            (ChristoffelForward, F32, 512, 32, 1, TF32, 100_000, None),
            // the smallest tile
            (ChristoffelBackward, F64, 1, 1, 1, 0, H100, Some((Strict, 16, 8 * (2 * 128 * 12 + 2 * 8 * 16 * 20 + 3 * 16 * 12)))),
            // R > 32, D > 1024, f64 with large D R, a small device: none
            (ChristoffelForward, F32, 512, 33, 1, 0, H100, None),
            (LeapfrogBackward, F32, 1025, 8, 1, 0, H100, None),
            (LeapfrogForward, F64, 512, 32, 8, X3, H100, None),
            (ChristoffelForward, F32, 512, 32, 1, 0, 48 << 10, None),
            // the kernel source's limit caps a larger device
            (ChristoffelForward, F32, 1024, 32, 1, 0, 1 << 20, None),
        ];
        for (i, &(kind, dtype, d, r, t, flags, max, want)) in table.iter().enumerate() {
            let got = fast(kind, &job(dtype, 65536, d, r, t, flags), max)
                .map(|f| (f.variant, f.m, f.smem));
            assert_eq!(
                got, want,
                "row {i}: {kind:?} {dtype:?} D={d} R={r} T={t} flags={flags}"
            );
        }
    }

    /// The sizes the kernel source's `Cfg` computes, at the benchmark tile.
    #[test]
    fn smem_at_the_benchmark_tile() {
        let t = Tile { rp: 32, dj: 8 };
        for kind in [
            Kind::ChristoffelForward,
            Kind::ChristoffelBackward,
            Kind::LeapfrogForward,
            Kind::LeapfrogBackward,
        ] {
            let s = smem(kind, t, DType::F32);
            // with the TF32 leapfrog's v stage (on the larger FFMA layout: an upper bound)
            assert!(s.strict + s.stage.unwrap_or(0) <= H100, "{kind:?}: {s:?}");
            assert!(s.vl, "{kind:?}");
        }
        let lf = smem(Kind::LeapfrogForward, t, DType::F32);
        assert_eq!((lf.tc3, lf.rs), (Some(221_696), Some(215_040)));
        let f64 = smem(Kind::LeapfrogForward, t, DType::F64);
        assert_eq!(
            (f64.tc, f64.stage, f64.tc3, f64.rs, f64.vl),
            (None, None, None, None, false)
        );
        let bwd = smem(
            Kind::ChristoffelBackward,
            Tile { rp: 32, dj: 16 },
            DType::F32,
        );
        assert_eq!((bwd.m, bwd.tc, bwd.vl), (8, None, false));
    }

    /// Route, kernel, grid, threads and workspace, table-driven over ops and devices.
    #[test]
    fn plan_table() {
        let lim = |cublas| Limits {
            max_smem: H100,
            sms: 132,
            cublas,
        };
        let geo = |b: usize, d: usize, r: usize, steps: usize, flags: u32| {
            let mut j = job(DType::F32, b, d, r, steps, flags);
            (j.du, j.dw) = (some(0x100), some(0x200));
            j
        };
        // (op, job, cuBLAS loads) -> (route taken, kernel, module, grid, threads, smem)
        let table = [
            (
                Kind::ChristoffelForward,
                geo(65536, 512, 32, 1, 0),
                true,
                false,
                "geo_chr_fwd_r32_d8_f32",
                "geodesic_christoffel_fwd_r32_d8_f32",
                132,
                256,
                213_504,
            ),
            (
                Kind::ChristoffelForward,
                geo(65536, 512, 32, 1, GEO_ALLOW_TF32),
                true,
                false,
                "geo_chr_fwd_tc_r32_d8_f32",
                "geodesic_christoffel_fwd_r32_d8_f32",
                132,
                512,
                4 * (2 * 512 * 32 + 2 * 9 * 16 * 36),
            ),
            (
                Kind::LeapfrogForward,
                geo(65536, 512, 32, 8, GEO_ALLOW_TF32X3),
                true,
                false,
                "geo_lf_fwd_tc3_r32_d8_f32",
                "geodesic_leapfrog_fwd_r32_d8_f32",
                132,
                256,
                221_696,
            ),
            (
                Kind::LeapfrogForward,
                geo(10, 100, 3, 2, 0),
                true,
                false,
                "geo_lf_fwd_r8_d2_f32",
                "geodesic_leapfrog_fwd_r8_d2_f32",
                1,
                256,
                4 * (128 * 12 * 2 + 8 * 16 * 20 + 16 * 12),
            ),
            // no fast kernel: the route where cuBLAS loads, else the generic kernel
            (
                Kind::LeapfrogBackward,
                geo(1000, 512, 64, 2, 0),
                true,
                true,
                "geo_lf_bwd_gen_f32",
                "geodesic_leapfrog_bwd_generic_f32",
                250,
                256,
                0,
            ),
            (
                Kind::LeapfrogBackward,
                geo(1000, 512, 64, 2, 0),
                false,
                false,
                "geo_lf_bwd_gen_f32",
                "geodesic_leapfrog_bwd_generic_f32",
                250,
                256,
                0,
            ),
            // forced generic: no route; B = 0: the kernels (zero parameter gradients)
            (
                Kind::ChristoffelBackward,
                geo(1000, 64, 8, 1, GEO_FORCE_GENERIC),
                true,
                false,
                "geo_chr_bwd_gen_f32",
                "geodesic_christoffel_bwd_generic_f32",
                250,
                256,
                0,
            ),
            (
                Kind::ChristoffelBackward,
                geo(0, 2000, 8, 1, 0),
                true,
                false,
                "geo_chr_bwd_gen_f32",
                "geodesic_christoffel_bwd_generic_f32",
                1,
                256,
                0,
            ),
        ];
        for (i, (kind, j, cublas, route, kernel_name, module, grid, threads, smem)) in
            table.into_iter().enumerate()
        {
            let p = plan(kind, &j, &lim(cublas)).unwrap();
            let k = match p {
                Plan::Kernel(k) => {
                    assert!(!route, "row {i}: {p:?}");
                    k
                }
                Plan::Route { route: r, fallback } => {
                    assert!(route, "row {i}: {p:?}");
                    assert_eq!(r.module, module, "row {i}");
                    assert_eq!(r.layout, Layout::new(kind, &j, r.sw_smem > 0).unwrap());
                    assert_eq!(fallback.variant, Variant::Generic, "row {i}");
                    fallback
                }
            };
            assert_eq!(
                (k.kernel, k.module, k.grid, k.threads, k.smem),
                (kernel_name, module, grid, threads, smem),
                "row {i}: {kind:?}"
            );
            assert_eq!(k.reduce_module, names::module(kind, j.dtype, None).unwrap());
            assert_eq!(k.want, 2 | 4, "row {i}");
        }
    }

    /// The kernel's workspace: slabs, then the dU and dW partials; the budget shrinks
    /// the grid.
    #[test]
    fn kernel_workspace() {
        // the fast leapfrog backward without a trajectory keeps T - 1 states per block
        let mut j = job(DType::F32, 65536, 512, 32, 8, 0);
        (j.du, j.dw, j.dx) = (some(0x100), some(0x200), some(0x300));
        let f = fast(Kind::LeapfrogBackward, &j, H100).unwrap();
        let k = kernel(Kind::LeapfrogBackward, &j, Some(f), 132).unwrap();
        let per_cta = 7 * 8 * 512;
        let part = 512 * 32;
        assert_eq!((k.grid, k.per_cta, k.parts.n), (132, per_cta, part));
        assert_eq!(k.du_part, Some(132 * per_cta * 4));
        assert_eq!(k.dw_part, Some(132 * (per_cta + part) * 4));
        assert_eq!(k.ws_bytes, 132 * (per_cta + 2 * part) * 4);
        assert_eq!(k.want, 2 | 4 | 16);
        assert_eq!((k.parts.kw, k.parts.pv, k.parts.rq), (64, 4, 8));
        // the generic kernel: [D][R] partials; no dU: dW right after the slabs
        j.du = None;
        j.traj = some(0x400);
        let k = kernel(Kind::LeapfrogBackward, &j, None, 132).unwrap();
        assert_eq!(
            (k.per_cta, k.parts.n, k.parts.kw),
            (5 * 4 * 32 + 4 * 4 * 512, 512 * 32, 0)
        );
        assert_eq!((k.du_part, k.dw_part), (None, Some(k.grid * k.per_cta * 4)));
        assert_eq!(k.grid, 132 * 4);
        // 512 MB of workspace at most: T = 4096 leaves a few blocks
        j.traj = None;
        j.steps = 4096;
        let k = kernel(Kind::LeapfrogBackward, &j, None, 132).unwrap();
        let per_block = (k.per_cta + k.parts.n) * 4;
        assert_eq!(k.grid, (512 << 20) / per_block);
        assert!(k.ws_bytes <= 512 << 20);
    }

    /// A dtype without kernels is an error, not another dtype's module.
    #[test]
    fn unsupported_dtype() {
        let j = job(DType::F16, 10, 8, 8, 1, 0);
        let lim = Limits {
            max_smem: H100,
            sms: 1,
            cublas: false,
        };
        let e = plan(Kind::ChristoffelForward, &j, &lim).unwrap_err();
        assert_eq!(e.status, crate::error::FK_ERROR_UNSUPPORTED_DTYPE);
        assert!(e.message.contains("f16"), "{}", e.message);
    }

    /// The route's workspace: pieces in order without overlap; sizes that overflow
    /// leave the op to the generic kernels.
    #[test]
    fn route_layout() {
        let mut job = Job::absent(DType::F32, 65536, 512, 64);
        job.steps = 8;
        job.dx = some(0x100);
        assert_eq!(
            Layout::new(Kind::LeapfrogBackward, &job, false)
                .unwrap()
                .bytes,
            0
        );
        job.du = some(0x200);
        let (br, bd) = (65536 * 64 * 4, 65536 * 512 * 4);
        let l = Layout::new(Kind::LeapfrogBackward, &job, false).unwrap();
        assert_eq!(
            [l.s, l.p0, l.s1, l.raw, l.raw1, l.vh, l.lv, l.slab, l.bytes],
            [
                0,
                br,
                2 * br,
                3 * br,
                3 * br + bd,
                3 * br + 2 * bd,
                3 * br + 3 * bd,
                3 * br + 4 * bd,
                3 * br + 11 * bd
            ]
        );
        job.dv = some(0x300);
        job.traj = some(0x400);
        assert_eq!(
            Layout::new(Kind::LeapfrogBackward, &job, false)
                .unwrap()
                .bytes,
            3 * br + 3 * bd
        );
        let l = Layout::new(
            Kind::ChristoffelBackward,
            &Job::absent(DType::F64, 3, 5, 7),
            false,
        )
        .unwrap();
        assert_eq!((l.s, l.raw, l.bytes), (0, 256, 512));
        job.traj = None;
        job.steps = usize::MAX / 4;
        assert!(Layout::new(Kind::LeapfrogBackward, &job, false).is_none());
    }
}
