//! The kernels' argument structs, passed by value: each mirrors the `struct` of the same
//! name in `kernels/geodesic.cu`. Their sizes and field offsets are asserted here at
//! compile time (`assert_layout!`) and by `FK_ARGS_LAYOUT` beside the C structs with
//! the same numbers, so a field added or moved on one side only fails to build.

use crate::cuda::launch::assert_layout;

/// `struct GeoArgs`: the fast and generic kernels.
#[repr(C)]
#[derive(Default)]
pub(super) struct GeoArgs {
    pub b: i64,
    pub d: i64,
    pub r: i64,
    pub steps: i64,
    pub dt: f64,
    pub c: f64,
    pub x0: u64,
    pub v0: u64,
    pub f: u64,
    pub u: u64,
    pub w: u64,
    pub mu: u64,
    pub g: u64,
    pub gx: u64,
    pub gv: u64,
    pub x_out: u64,
    pub v_out: u64,
    pub traj: u64,
    pub gamma: u64,
    pub dx: u64,
    pub dv: u64,
    pub df: u64,
    pub du_part: u64,
    pub dw_part: u64,
    pub ws: u64,
    pub ws_per_cta: i64,
    pub want: i32,
    pub vec_ok: i32,
    pub smem_bytes: u32,
    pub pad: i32,
}
assert_layout!(
    GeoArgs,
    224,
    b = 0,
    d = 8,
    r = 16,
    steps = 24,
    dt = 32,
    c = 40,
    x0 = 48,
    v0 = 56,
    f = 64,
    u = 72,
    w = 80,
    mu = 88,
    g = 96,
    gx = 104,
    gv = 112,
    x_out = 120,
    v_out = 128,
    traj = 136,
    gamma = 144,
    dx = 152,
    dv = 160,
    df = 168,
    du_part = 176,
    dw_part = 184,
    ws = 192,
    ws_per_cta = 200,
    want = 208,
    vec_ok = 212,
    smem_bytes = 216,
    pad = 220
);

/// `struct ReduceArgs`: `geo_reduce`.
#[repr(C)]
pub(super) struct ReduceArgs {
    pub parts: u64,
    pub out: u64,
    pub nparts: i64,
    pub n: i64,
    pub d: i64,
    pub r: i64,
    pub kw: i32,
    pub pv: i32,
    pub rq: i32,
    pub pad: i32,
}
assert_layout!(
    ReduceArgs,
    64,
    parts = 0,
    out = 8,
    nparts = 16,
    n = 24,
    d = 32,
    r = 40,
    kw = 48,
    pv = 52,
    rq = 56,
    pad = 60
);

/// `struct EwArgs`: the `GEO_EW` kernels (`y[i]` from `y[i]`, `x[i]`, `c`).
#[repr(C)]
pub(super) struct EwArgs {
    pub y: u64,
    pub x: u64,
    pub n: i64,
    pub c: f64,
    pub vec: i32,
    pub pad: i32,
}
assert_layout!(EwArgs, 40, y = 0, x = 8, n = 16, c = 24, vec = 32, pad = 36);

/// `struct KickArgs`: `geo_kick`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct KickArgs {
    pub n: i64,
    pub d: i64,
    pub vin: u64,
    pub x: u64,
    pub v: u64,
    pub raw: u64,
    pub f: u64,
    pub mu: u64,
    pub tx: u64,
    pub tv: u64,
    pub h: f64,
    pub dt: f64,
    pub c: f64,
    pub vec: i32,
    pub pad: i32,
}
assert_layout!(
    KickArgs,
    112,
    n = 0,
    d = 8,
    vin = 16,
    x = 24,
    v = 32,
    raw = 40,
    f = 48,
    mu = 56,
    tx = 64,
    tv = 72,
    h = 80,
    dt = 88,
    c = 96,
    vec = 104,
    pad = 108
);

/// `struct SwArgs`: `geo_sw`.
#[repr(C)]
pub(super) struct SwArgs {
    pub k: KickArgs,
    pub p: u64,
    pub w: u64,
    pub r: i64,
    pub mode: i32,
    pub pad: i32,
}
assert_layout!(
    SwArgs,
    144,
    k = 0,
    p = 112,
    w = 120,
    r = 128,
    mode = 136,
    pad = 140
);

/// `SwArgs::mode` (`GEO_SW_*`): what `geo_sw` does with raw.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Sw {
    /// gamma = clamp(raw) into `k.v`
    Clamp = 0,
    /// `geo_kick`'s element
    Kick = 1,
    /// g' = g 1[|raw| <= c] into `k.v`, g at `k.vin`
    Mask = 2,
}

/// `struct AdjArgs`: `geo_adj`.
#[repr(C)]
pub(super) struct AdjArgs {
    pub n: i64,
    pub d: i64,
    pub lv_in: u64,
    pub lv: u64,
    pub g: u64,
    pub df: u64,
    pub gx: u64,
    pub mu: u64,
    pub h: f64,
    pub dt: f64,
    pub c: f64,
    pub df_init: i32,
    pub vec: i32,
}
assert_layout!(
    AdjArgs,
    96,
    n = 0,
    d = 8,
    lv_in = 16,
    lv = 24,
    g = 32,
    df = 40,
    gx = 48,
    mu = 56,
    h = 64,
    dt = 72,
    c = 80,
    df_init = 88,
    vec = 92
);
