//! The family's modules and kernels, named as every family's (`launch.rs`): `{base}_{dtype}`,
//! the element type's suffix last:
//!
//! - module `geodesic_<op>_<cfg>_<dtype>`: `<op>` `christoffel_fwd`, `christoffel_bwd`,
//!   `leapfrog_fwd`, `leapfrog_bwd`; `<cfg>` the fast tile `r<RP>_d<DJ>` (one fast
//!   kernel per module, a program compiles only those it uses) or `generic` (the
//!   generic kernel, the route's elementwise kernels and, for the backwards,
//!   `geo_reduce`); `<dtype>` `f32` or `f64`;
//! - kernel `geo_<k><variant>_r<RP>_d<DJ>_<dtype>` (fast) or `geo_<k>_gen_<dtype>`
//!   (generic): `<k>` `chr_fwd`, `chr_bwd`, `lf_fwd`, `lf_bwd`; `<variant>` empty
//!   (strict), `_tc` (TF32, the f32 forwards' modules) or `_tc3` (3xTF32, the f32
//!   leapfrog forward's); the generic modules' other kernels `<base>_<dtype>`
//!   (`geo_reduce`, `geo_square`, `geo_sw`, ...: `generic_kernel`). The kernel source
//!   spells the suffix with `GEO_NAME(base)` (`GEO_DT`, defined by `source`).
//!
//! `concat!` and `per_dtype!` build the tables at compile time (the launcher takes
//! `&'static str`); a unit test checks every entry against the scheme written out with
//! `format!`. Only f32 and f64 have kernels: any other dtype is an error, never another
//! dtype's module or kernel.

use crate::cuda::launch::{Names, kernel_suffix, per_dtype};
use crate::dtype::DType;
use crate::error::{FK_ERROR_INTERNAL, Result};
use crate::gpu::kargs::{KernelArgs as _, c_structs};
use crate::plan::geodesic::Kind;

use super::args::{AdjArgs, EwArgs, GeoArgs, KickArgs, ReduceArgs, SwArgs};
use super::config::{self, Tile, Variant};

/// `[$m!(args.., RP, DJ)]` over the 12 fast tiles in `Tile::index` order.
macro_rules! per_tile {
    ($m:ident, $($a:tt),*) => {
        [
            $m!($($a),*, 8, 2), $m!($($a),*, 8, 4), $m!($($a),*, 8, 8), $m!($($a),*, 8, 16),
            $m!($($a),*, 16, 2), $m!($($a),*, 16, 4), $m!($($a),*, 16, 8), $m!($($a),*, 16, 16),
            $m!($($a),*, 32, 2), $m!($($a),*, 32, 4), $m!($($a),*, 32, 8), $m!($($a),*, 32, 16),
        ]
    };
}

/// A module entry: `(name, source)`.
type Module = (&'static str, fn() -> String);

macro_rules! fast_module {
    ($kind:ident, $op:literal, $dt:ident, $t:literal, $rp:literal, $dj:literal) => {
        (
            concat!("geodesic_", $op, "_r", $rp, "_d", $dj, "_", $t),
            (|| source(Kind::$kind, DType::$dt, Some(Tile { rp: $rp, dj: $dj }))) as fn() -> String,
        )
    };
}

/// One op's modules for one dtype: the 12 fast tiles, then the generic module.
macro_rules! op_modules {
    ($kind:ident, $op:literal, $dt:ident, $t:literal) => {
        with_generic(
            per_tile!(fast_module, $kind, $op, $dt, $t),
            (concat!("geodesic_", $op, "_generic_", $t), || {
                source(Kind::$kind, DType::$dt, None)
            }),
        )
    };
}

/// Modules per op and dtype (12 fast + 1 generic).
const PER: usize = 13;

const fn with_generic(fast: [Module; PER - 1], generic: Module) -> [Module; PER] {
    let mut all = [generic; PER];
    let mut i = 0;
    while i < PER - 1 {
        all[i] = fast[i];
        i += 1;
    }
    all
}

/// By `kind_index`, then dtype (f32, f64).
const OPS: [[[Module; PER]; 2]; 4] = [
    [
        op_modules!(ChristoffelForward, "christoffel_fwd", F32, "f32"),
        op_modules!(ChristoffelForward, "christoffel_fwd", F64, "f64"),
    ],
    [
        op_modules!(ChristoffelBackward, "christoffel_bwd", F32, "f32"),
        op_modules!(ChristoffelBackward, "christoffel_bwd", F64, "f64"),
    ],
    [
        op_modules!(LeapfrogForward, "leapfrog_fwd", F32, "f32"),
        op_modules!(LeapfrogForward, "leapfrog_fwd", F64, "f64"),
    ],
    [
        op_modules!(LeapfrogBackward, "leapfrog_bwd", F32, "f32"),
        op_modules!(LeapfrogBackward, "leapfrog_bwd", F64, "f64"),
    ],
];

/// `(name, source)` of the family's kernel modules, by op, dtype and configuration.
pub const MODULES: [Module; 4 * 2 * PER] = {
    let mut all = [OPS[0][0][0]; 4 * 2 * PER];
    let mut i = 0;
    while i < 4 * 2 * PER {
        all[i] = OPS[i / (2 * PER)][(i / PER) % 2][i % PER];
        i += 1;
    }
    all
};

macro_rules! fast_kernel {
    ($k:literal, $v:literal, [$($dt:ident),+], $rp:literal, $dj:literal) => {
        per_dtype!([concat!("geo_", $k, $v, "_r", $rp, "_d", $dj)]: $($dt),+)
    };
}

/// The fast kernels by `kind_index` and `Tile::index`.
const FAST: [[Names; PER - 1]; 4] = [
    per_tile!(fast_kernel, "chr_fwd", "", [f32, f64]),
    per_tile!(fast_kernel, "chr_bwd", "", [f32, f64]),
    per_tile!(fast_kernel, "lf_fwd", "", [f32, f64]),
    per_tile!(fast_kernel, "lf_bwd", "", [f32, f64]),
];
/// The TF32 variants of the f32 forwards (Christoffel, leapfrog).
const FAST_TC: [[Names; PER - 1]; 2] = [
    per_tile!(fast_kernel, "chr_fwd", "_tc", [f32]),
    per_tile!(fast_kernel, "lf_fwd", "_tc", [f32]),
];
/// The 3xTF32 variants of the f32 leapfrog forward (in its TF32 module).
const FAST_TC3: [Names; PER - 1] = per_tile!(fast_kernel, "lf_fwd", "_tc3", [f32]);
const GENERIC: [Names; 4] = [
    per_dtype!("geo_chr_fwd_gen": f32, f64),
    per_dtype!("geo_chr_bwd_gen": f32, f64),
    per_dtype!("geo_lf_fwd_gen": f32, f64),
    per_dtype!("geo_lf_bwd_gen": f32, f64),
];
/// The generic modules' other kernels: `geo_reduce` (the backwards) and the GEMM
/// route's (`generic_kernel`).
const GENERIC_OTHERS: [Names; 9] = [
    per_dtype!("geo_reduce": f32, f64),
    per_dtype!("geo_square": f32, f64),
    per_dtype!("geo_dp": f32, f64),
    per_dtype!("geo_mask": f32, f64),
    per_dtype!("geo_clamp": f32, f64),
    per_dtype!("geo_sw": f32, f64),
    per_dtype!("geo_kick": f32, f64),
    per_dtype!("geo_copy": f32, f64),
    per_dtype!("geo_adj": f32, f64),
];

/// `GEO_MODULE_<define>` of an op's sources.
fn define(kind: Kind) -> &'static str {
    match kind {
        Kind::ChristoffelForward => "CHR_FWD",
        Kind::ChristoffelBackward => "CHR_BWD",
        Kind::LeapfrogForward => "LF_FWD",
        Kind::LeapfrogBackward => "LF_BWD",
    }
}

fn kind_index(k: Kind) -> usize {
    match k {
        Kind::ChristoffelForward => 0,
        Kind::ChristoffelBackward => 1,
        Kind::LeapfrogForward => 2,
        Kind::LeapfrogBackward => 3,
    }
}

/// The f32 forwards, whose modules also hold the TF32 variants (`GEO_TF32`).
fn tf32_module(kind: Kind, dtype: DType) -> bool {
    dtype == DType::F32 && matches!(kind, Kind::ChristoffelForward | Kind::LeapfrogForward)
}

/// The dtypes with kernels, in `OPS` order (`Names::get`: any other dtype is an
/// `FK_ERROR_UNSUPPORTED_DTYPE` error).
const DTYPES: Names = per_dtype!("geodesic": f32, f64);

fn dtype_index(dtype: DType) -> Result<usize> {
    DTYPES.get(dtype)?;
    Ok(usize::from(dtype == DType::F64))
}

/// The module of `kind` for `dtype`: fast tile `tile`, or the generic module (`None`).
pub(super) fn module(kind: Kind, dtype: DType, tile: Option<Tile>) -> Result<&'static str> {
    let j = tile.map_or(PER - 1, Tile::index);
    Ok(OPS[kind_index(kind)][dtype_index(dtype)?][j].0)
}

/// The kernel of `kind`'s `variant` at `tile` (`None` for the generic kernel) for
/// `dtype`.
pub(super) fn kernel(
    kind: Kind,
    dtype: DType,
    variant: Variant,
    tile: Option<Tile>,
) -> Result<&'static str> {
    let k = kind_index(kind);
    let names = match (variant, tile) {
        (Variant::Generic, None) => Some(GENERIC[k]),
        (Variant::Strict | Variant::StrictRegisters, Some(t)) => Some(FAST[k][t.index()]),
        (Variant::Tf32 | Variant::Tf32Staged, Some(t)) => match kind {
            Kind::ChristoffelForward => Some(FAST_TC[0][t.index()]),
            Kind::LeapfrogForward => Some(FAST_TC[1][t.index()]),
            _ => None,
        },
        (Variant::Tf32x3, Some(t)) if kind == Kind::LeapfrogForward => Some(FAST_TC3[t.index()]),
        _ => None,
    };
    match names {
        Some(n) => n.get(dtype),
        None => crate::bail!(
            FK_ERROR_INTERNAL,
            "no geodesic kernel {variant:?} for {kind:?} at {tile:?}"
        ),
    }
}

/// The generic module's kernel `base` (`geo_reduce` or one of the GEMM route's:
/// `geo_square`, `geo_dp`, `geo_mask`, `geo_clamp`, `geo_sw`, `geo_kick`, `geo_copy`,
/// `geo_adj`) for `dtype`.
pub(super) fn generic_kernel(base: &str, dtype: DType) -> Result<&'static str> {
    match GENERIC_OTHERS.iter().find(|n| n.base == base) {
        Some(n) => n.get(dtype),
        None => crate::bail!(FK_ERROR_INTERNAL, "no geodesic kernel {base}"),
    }
}

/// The pieces of `kernels/geodesic/` a module's source is made of (kernels/geodesic/
/// common.cu says what each holds).
mod piece {
    pub const COMMON: &str = include_str!("../../../kernels/geodesic/common.cu");
    pub const FAST: &str = include_str!("../../../kernels/geodesic/fast.cu");
    pub const CHRISTOFFEL: &str = include_str!("../../../kernels/geodesic/christoffel.cu");
    pub const LEAPFROG: &str = include_str!("../../../kernels/geodesic/leapfrog.cu");
    pub const FAST_ENTRY: &str = include_str!("../../../kernels/geodesic/fast_entry.cu");
    pub const GENERIC: &str = include_str!("../../../kernels/geodesic/generic.cu");
    pub const GENERIC_ENTRY: &str = include_str!("../../../kernels/geodesic/generic_entry.cu");
}

/// The pieces of the module of `kind` at `tile` (`None`: generic), in order: a fast
/// module's tile kernel with the fast machinery and its op's fast kernels, or the
/// generic kernels with the route's and `geo_reduce`.
fn pieces(kind: Kind, tile: Option<Tile>) -> [&'static str; 4] {
    let fast_op = match kind {
        Kind::ChristoffelForward | Kind::ChristoffelBackward => piece::CHRISTOFFEL,
        Kind::LeapfrogForward | Kind::LeapfrogBackward => piece::LEAPFROG,
    };
    match tile {
        Some(_) => [piece::COMMON, piece::FAST, fast_op, piece::FAST_ENTRY],
        None => [piece::COMMON, piece::GENERIC, piece::GENERIC_ENTRY, ""],
    }
}

/// A module's source: the op, the element type (`GEO_T`, and `GEO_DT` its suffix in
/// kernel names), the tile (`None`: generic), `GEO_TF32`
/// for the f32 forwards, the plan's definitions (`config::defines`), the argument
/// structs, then the module's pieces of `kernels/geodesic/` (`pieces`).
fn source(kind: Kind, dtype: DType, tile: Option<Tile>) -> String {
    let t = if dtype == DType::F32 {
        "float"
    } else {
        "double"
    };
    let cfg = match tile {
        Some(c) => format!("#define GEO_CFG_RP {}\n#define GEO_CFG_DJ {}\n", c.rp, c.dj),
        None => "#define GEO_GENERIC 1\n".to_string(),
    };
    let tf32 = if tf32_module(kind, dtype) {
        "#define GEO_TF32 1\n"
    } else {
        ""
    };
    let mut s = format!(
        "// generated by src/cuda/geodesic/names.rs\n#define GEO_MODULE_{} 1\n#define GEO_T {t}\n#define GEO_DT {}\n{cfg}{tf32}{}{}",
        define(kind),
        kernel_suffix(dtype),
        config::defines(kind, dtype, tile),
        c_structs(&[
            GeoArgs::c_struct,
            ReduceArgs::c_struct,
            EwArgs::c_struct,
            KickArgs::c_struct,
            SwArgs::c_struct,
            AdjArgs::c_struct,
        ]),
    );
    for p in pieces(kind, tile) {
        s.push_str(p);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FK_ERROR_UNSUPPORTED_DTYPE;

    const KINDS: [Kind; 4] = [
        Kind::ChristoffelForward,
        Kind::ChristoffelBackward,
        Kind::LeapfrogForward,
        Kind::LeapfrogBackward,
    ];

    fn cfg_name(tile: Option<Tile>) -> String {
        tile.map_or("generic".into(), |t| format!("r{}_d{}", t.rp, t.dj))
    }

    /// Every table entry follows the scheme; names are unique; sources define what
    /// their names say.
    #[test]
    fn names_follow_the_scheme() {
        let mut seen = std::collections::HashSet::new();
        let tiles: Vec<Option<Tile>> = Tile::all().map(Some).chain([None]).collect();
        for kind in KINDS {
            // the op in module names and in kernel names
            let (op, k) = match kind {
                Kind::ChristoffelForward => ("christoffel_fwd", "chr_fwd"),
                Kind::ChristoffelBackward => ("christoffel_bwd", "chr_bwd"),
                Kind::LeapfrogForward => ("leapfrog_fwd", "lf_fwd"),
                Kind::LeapfrogBackward => ("leapfrog_bwd", "lf_bwd"),
            };
            for dtype in [DType::F32, DType::F64] {
                for &tile in &tiles {
                    let name = module(kind, dtype, tile).unwrap();
                    let dt = kernel_suffix(dtype);
                    assert_eq!(name, format!("geodesic_{op}_{}_{dt}", cfg_name(tile)));
                    assert!(seen.insert(name), "{name} twice");
                    let src = MODULES.iter().find(|m| m.0 == name).unwrap().1();
                    let t = if dtype == DType::F32 {
                        "float"
                    } else {
                        "double"
                    };
                    let head = format!(
                        "#define GEO_MODULE_{} 1\n#define GEO_T {t}\n#define GEO_DT {dt}\n",
                        define(kind)
                    );
                    assert!(src.contains(&head), "{name}");
                    let cfg = tile.map_or("#define GEO_GENERIC 1\n".into(), |t| {
                        format!("#define GEO_CFG_RP {}\n#define GEO_CFG_DJ {}\n", t.rp, t.dj)
                    });
                    assert!(src.contains(&format!("{head}{cfg}")), "{name}");
                    assert_eq!(
                        src.contains("#define GEO_TF32 1\n"),
                        tf32_module(kind, dtype)
                    );
                }
            }
            for dtype in [DType::F32, DType::F64] {
                let dt = kernel_suffix(dtype);
                let f32 = dtype == DType::F32;
                assert_eq!(
                    kernel(kind, dtype, Variant::Generic, None).unwrap(),
                    format!("geo_{k}_gen_{dt}")
                );
                for t in Tile::all() {
                    let fast = |v: &str| format!("geo_{k}{v}_r{}_d{}_{dt}", t.rp, t.dj);
                    for v in [Variant::Strict, Variant::StrictRegisters] {
                        assert_eq!(kernel(kind, dtype, v, Some(t)).unwrap(), fast(""));
                    }
                    let fwd = matches!(kind, Kind::ChristoffelForward | Kind::LeapfrogForward);
                    for v in [Variant::Tf32, Variant::Tf32Staged] {
                        assert_eq!(
                            kernel(kind, dtype, v, Some(t)).ok(),
                            (fwd && f32).then(|| fast("_tc")).as_deref()
                        );
                    }
                    assert_eq!(
                        kernel(kind, dtype, Variant::Tf32x3, Some(t)).ok(),
                        (kind == Kind::LeapfrogForward && f32)
                            .then(|| fast("_tc3"))
                            .as_deref()
                    );
                    assert!(kernel(kind, dtype, Variant::Generic, Some(t)).is_err());
                }
                assert!(kernel(kind, dtype, Variant::Strict, None).is_err());
                for base in ["geo_reduce", "geo_square", "geo_sw", "geo_adj"] {
                    assert_eq!(generic_kernel(base, dtype).unwrap(), format!("{base}_{dt}"));
                }
            }
        }
        assert_eq!(seen.len(), MODULES.len());
        assert_eq!(
            module(
                Kind::LeapfrogBackward,
                DType::F64,
                Some(Tile { rp: 32, dj: 16 })
            )
            .unwrap(),
            "geodesic_leapfrog_bwd_r32_d16_f64"
        );
        assert!(
            MODULES[0].1()
                .contains("#define GEO_CFG_RP 8\n#define GEO_CFG_DJ 2\n#define GEO_TF32 1")
        );
    }

    /// No module or kernel of another dtype for a dtype without kernels.
    #[test]
    fn no_dtype_fallback() {
        for dtype in [DType::F16, DType::BF16, DType::C64, DType::C128] {
            let e = module(Kind::ChristoffelForward, dtype, None).unwrap_err();
            assert_eq!(e.status, FK_ERROR_UNSUPPORTED_DTYPE);
            assert!(e.message.contains(&dtype.to_string()), "{}", e.message);
        }
    }
}
