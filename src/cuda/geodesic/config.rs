//! The fast geodesic kernels' configurations, stated once: threads and groups, the
//! tiles (`Tile`: R padded to `RPS`, D to `64 DJS`) and variants, each module's
//! shared-memory sizes (`smem`) and the `#define`s its source gets (`defines`), which
//! the kernels use and check their launch against. Below both the module table
//! (`names`) and the choice of kernel (`plan`).

use crate::dtype::DType;
use crate::plan::geodesic::Kind;

/// Threads per group (`GEO_NT`) and warps per group (`GEO_NW`).
pub(super) const NT: u32 = 256;

pub(super) const NW: usize = 8;

/// Thread groups of `NT` per block of the Christoffel forward's TF32 kernel
/// (`GEO_GROUPS`): each group runs its own tiles with its own buffers. The FFMA
/// kernel runs one group with tiles of twice the rows (`mb`).
pub(super) const CHR_FWD_GROUPS: usize = 2;

/// Rows per block iteration of the generic kernels (`GEN_RG`).
pub(super) const GEN_RG: usize = 4;

/// Padded ranks and feature groups of the fast kernels (index order of the name tables).
pub(super) const RPS: [usize; 3] = [8, 16, 32];

pub(super) const DJS: [usize; 4] = [2, 4, 8, 16];

/// The largest opt-in shared memory per block of the supported GPUs (227 KB on sm_90),
/// `GEO_SMEM_MAX` of the kernel source: configurations above it are compiled as stubs
/// and never chosen.
pub(super) const SMEM_MAX: usize = 232_448;

/// Rows per tile of the TF32 kernels (`GEO_TC_MB` = `TC_M / 4` rows per thread).
pub(super) const TC_M: usize = 16;

/// `GeoArgs::want` bits (`GEO_WANT_*`): the backwards' outputs.
pub(super) const WANT_DV: i32 = 1;

pub(super) const WANT_DU: i32 = 2;

pub(super) const WANT_DW: i32 = 4;

pub(super) const WANT_DF: i32 = 8;

pub(super) const WANT_DX: i32 = 16;

/// A fast kernel's tile: R padded to `rp` (`RPS`), D to `64 dj` (`DJS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tile {
    pub rp: usize,
    pub dj: usize,
}

impl Tile {
    /// The smallest tile that holds `r` and `d`, if any.
    pub(super) fn fitting(r: usize, d: usize) -> Option<Tile> {
        Some(Tile {
            rp: *RPS.iter().find(|&&rp| rp >= r)?,
            dj: *DJS.iter().find(|&&dj| 64 * dj >= d)?,
        })
    }

    /// Position in the name tables (RP-major, DJ-minor).
    pub(super) fn index(self) -> usize {
        let ri = RPS.iter().position(|&x| x == self.rp).unwrap_or(0);
        let di = DJS.iter().position(|&x| x == self.dj).unwrap_or(0);
        ri * DJS.len() + di
    }

    /// Every tile, in `index` order.
    #[cfg(test)]
    pub(super) fn all() -> impl Iterator<Item = Tile> {
        RPS.into_iter()
            .flat_map(|rp| DJS.into_iter().map(move |dj| Tile { rp, dj }))
    }

    /// Padded D.
    pub(super) fn dp(self) -> usize {
        64 * self.dj
    }
}

/// Which kernel of an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    /// The generic kernel (any D, R; per-block workspace in global memory).
    Generic,
    /// The fast FFMA kernel (strict arithmetic).
    Strict,
    /// The strict f32 leapfrog forward given `GEO_SMEM_RS` bytes: U and W in
    /// registers (`lf_fwd_rs`; the kernel falls back to `Strict`'s code where the rows
    /// are not 16-byte aligned).
    StrictRegisters,
    /// TF32 tensor cores (`FK_GEO_ALLOW_TF32`, f32 forwards with D <= 512).
    Tf32,
    /// `Tf32` of the leapfrog forward with room for its v stage (`GEO_SMEM_STAGE`).
    Tf32Staged,
    /// 3xTF32 (`FK_GEO_ALLOW_TF32X3`, the f32 leapfrog forward, T >= 2).
    Tf32x3,
}

/// Shared memory in bytes of one fast module's kernels (the module's `GEO_SMEM*`), and
/// the variants the module holds (`None`: not in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Smem {
    /// rows per tile of the FFMA kernel (`Cfg::M`)
    pub m: usize,
    /// the FFMA kernel's vector row layout (`Cfg::VL`)
    pub vl: bool,
    /// the FFMA kernel (`GEO_SMEM`)
    pub strict: usize,
    /// the TF32 kernel (`GEO_SMEM_TC`; f32 forwards, DJ <= 8),
    /// tiles of `TC_M` rows
    pub tc: Option<usize>,
    /// the TF32 leapfrog forward's optional v stage (`GEO_SMEM_STAGE`)
    pub stage: Option<usize>,
    /// 3xTF32 (`GEO_SMEM_TC3`, the f32 leapfrog forward, DJ <= 8)
    pub tc3: Option<usize>,
    /// U and W in registers (`GEO_SMEM_RS`, `Cfg::RS`: the f32 leapfrog forward,
    /// RP = 32, DJ = 8)
    pub rs: Option<usize>,
}

/// Rows per thread of a fast module's FFMA kernel (`GEO_MB`): forwards and the
/// Christoffel backward use tiles of 16 rows (8 for DJ = 16), the FFMA Christoffel
/// forward (one group) twice that, the leapfrog backward, which also keeps its adjoints
/// and the dU, dW accumulators in registers, half of that.
pub(super) fn mb(kind: Kind, dj: usize) -> usize {
    let wide = dj <= 8;
    match kind {
        Kind::ChristoffelForward => {
            if wide {
                8
            } else {
                4
            }
        }
        Kind::LeapfrogBackward => {
            if wide {
                2
            } else {
                1
            }
        }
        _ => {
            if wide {
                4
            } else {
                2
            }
        }
    }
}

/// The shared memory of `kind`'s fast kernels at tile `t` for `dtype` (f32 or f64).
pub(super) fn smem(kind: Kind, t: Tile, dtype: DType) -> Smem {
    let e = dtype.size();
    let (rp, dj, dp) = (t.rp, t.dj, t.dp());
    let m = 4 * mb(kind, dj);
    let kw = 8 * dj;
    let su = rp + 4;
    let slice = |m: usize| m * (kw + 4).max(su);
    // `Cfg::VL` (the FFMA kernels' vector row layout): W as [DP][RP] (swizzled) instead
    // of [DP][RP + 4], in the backwards U too
    let vl = dtype == DType::F32 && rp == 32 && (dj == 4 || dj == 8);
    let sw = if vl { rp } else { su };
    let strict = match kind {
        Kind::ChristoffelForward | Kind::LeapfrogForward => {
            dp * su + dp * sw + NW * slice(m) + m * su
        }
        Kind::ChristoffelBackward => 2 * dp * sw + 2 * NW * slice(m) + 3 * m * su,
        Kind::LeapfrogBackward => 2 * dp * sw + 2 * NW * slice(m) + 5 * m * su + 2 * m * dp,
    };
    let f32_fwd = dtype == DType::F32 && dj <= 8;
    let lf_fwd = f32_fwd && kind == Kind::LeapfrogForward;
    let tm = TC_M;
    let tc = match kind {
        // U and W in fragment order, per group the warps' partials and S (no tile
        // buffer: v goes straight to registers)
        Kind::ChristoffelForward if f32_fwd => {
            Some(2 * dp * rp + CHR_FWD_GROUPS * (NW + 1) * tm * su)
        }
        // U and W in registers (`RegFrags`); the warps' partials, S, the thread-private
        // stash of x and h f, and 1 - h mu
        Kind::LeapfrogForward if lf_fwd => Some(NW * slice(tm) + tm * su + 2 * tm * dp + dp),
        _ => None,
    };
    Smem {
        m,
        vl,
        strict: strict * e,
        tc: tc.map(|n| n * e),
        // the next tile's v, a warp slice each
        stage: lf_fwd.then(|| NW * slice(tm) * e),
        // the partials, S and its low parts, the stash, U's and W's low parts in
        // fragment order
        tc3: lf_fwd.then(|| (NW * tm * su + 2 * tm * su + 2 * tm * dp + dp + 2 * dp * rp) * e),
        // two buffers of the tile's v, x, f, the warps' partials and S
        rs: (lf_fwd && rp == 32 && dj == 8).then(|| (6 * m * dp + NW * m * rp + m * rp) * e),
    }
}

/// Rows per tile of `geo_sw` (`GEO_SW_M`): 32 in f32, 16 in f64.
pub(super) fn sw_m(dtype: DType) -> usize {
    if dtype == DType::F32 { 32 } else { 16 }
}

/// The definitions a module's source gets from the plan (before the kernel text), which
/// the kernels use as they are: the constants they share with the host (`GEO_NT`,
/// `GEO_NW`, `GEO_GROUPS`, `GEN_RG`, `GEO_SMEM_MAX`, `GEO_SW_M`, `GEO_WANT_*`), and for a
/// fast module its tile's values: the FFMA kernel's rows per thread (`GEO_MB`; the TF32
/// kernels' `GEO_TC_MB`), vector row layout (`GEO_VL`), whether it has the register
/// leapfrog forward (`GEO_RS`), and each variant's shared memory in bytes (`smem`:
/// `GEO_SMEM`, `GEO_SMEM_TC`, `GEO_SMEM_STAGE`, `GEO_SMEM_TC3`, `GEO_SMEM_RS`; 0 for a
/// variant the module lacks).
pub(super) fn defines(kind: Kind, dtype: DType, tile: Option<Tile>) -> String {
    let n = |v: usize| v as i64;
    let mut defs = vec![
        ("GEO_NT", i64::from(NT)),
        ("GEO_NW", n(NW)),
        ("GEO_GROUPS", n(CHR_FWD_GROUPS)),
        ("GEN_RG", n(GEN_RG)),
        ("GEO_SMEM_MAX", n(SMEM_MAX)),
        ("GEO_SW_M", n(sw_m(dtype))),
        ("GEO_WANT_DV", i64::from(WANT_DV)),
        ("GEO_WANT_DU", i64::from(WANT_DU)),
        ("GEO_WANT_DW", i64::from(WANT_DW)),
        ("GEO_WANT_DF", i64::from(WANT_DF)),
        ("GEO_WANT_DX", i64::from(WANT_DX)),
    ];
    if let Some(t) = tile {
        let z = smem(kind, t, dtype);
        defs.extend([
            ("GEO_MB", n(mb(kind, t.dj))),
            ("GEO_TC_MB", n(TC_M / 4)),
            ("GEO_VL", i64::from(z.vl)),
            ("GEO_RS", i64::from(z.rs.is_some())),
            ("GEO_SMEM", n(z.strict)),
            ("GEO_SMEM_TC", n(z.tc.unwrap_or(0))),
            ("GEO_SMEM_STAGE", n(z.stage.unwrap_or(0))),
            ("GEO_SMEM_TC3", n(z.tc3.unwrap_or(0))),
            ("GEO_SMEM_RS", n(z.rs.unwrap_or(0))),
        ]);
    }
    crate::cuda::launch::defines(&defs)
}
