//! The kernels' argument structs, passed by value: each mirrors the `struct` of the same
//! name in `kernels/geodesic.cu`. Their sizes and field offsets are asserted here at
//! compile time (`kernel_args!`, through `assert_layout!`) and by `FK_ARGS_LAYOUT`
//! beside the C structs with the same numbers, so a field added or moved on one side
//! only fails to build.

use crate::cuda::launch::assert_layout;

/// `kernel_args! { struct Name(size) { field: type = offset, .. } }`: a `#[repr(C)]`
/// argument struct, each field stated once with its byte offset, and its layout check
/// (`assert_layout!`: the size and every offset).
macro_rules! kernel_args {
    ($(#[$m:meta])* struct $name:ident($size:literal) {
        $($f:ident: $t:ty = $o:literal),+ $(,)?
    }) => {
        $(#[$m])*
        #[repr(C)]
        pub(super) struct $name {
            $(pub $f: $t),+
        }
        assert_layout!($name, $size, $($f = $o),+);
    };
}

kernel_args! {
    /// `struct GeoArgs`: the fast and generic kernels.
    #[derive(Default)]
    struct GeoArgs(224) {
        b: i64 = 0,
        d: i64 = 8,
        r: i64 = 16,
        steps: i64 = 24,
        dt: f64 = 32,
        c: f64 = 40,
        x0: u64 = 48,
        v0: u64 = 56,
        f: u64 = 64,
        u: u64 = 72,
        w: u64 = 80,
        mu: u64 = 88,
        g: u64 = 96,
        gx: u64 = 104,
        gv: u64 = 112,
        x_out: u64 = 120,
        v_out: u64 = 128,
        traj: u64 = 136,
        gamma: u64 = 144,
        dx: u64 = 152,
        dv: u64 = 160,
        df: u64 = 168,
        du_part: u64 = 176,
        dw_part: u64 = 184,
        ws: u64 = 192,
        ws_per_cta: i64 = 200,
        want: i32 = 208,
        vec_ok: i32 = 212,
        smem_bytes: u32 = 216,
        pad: i32 = 220,
    }
}

kernel_args! {
    /// `struct ReduceArgs`: `geo_reduce`.
    struct ReduceArgs(64) {
        parts: u64 = 0,
        out: u64 = 8,
        nparts: i64 = 16,
        n: i64 = 24,
        d: i64 = 32,
        r: i64 = 40,
        kw: i32 = 48,
        pv: i32 = 52,
        rq: i32 = 56,
        pad: i32 = 60,
    }
}

kernel_args! {
    /// `struct EwArgs`: the `GEO_EW` kernels (`y[i]` from `y[i]`, `x[i]`, `c`).
    struct EwArgs(40) {
        y: u64 = 0,
        x: u64 = 8,
        n: i64 = 16,
        c: f64 = 24,
        vec: i32 = 32,
        pad: i32 = 36,
    }
}

kernel_args! {
    /// `struct KickArgs`: `geo_kick`.
    #[derive(Clone, Copy)]
    struct KickArgs(112) {
        n: i64 = 0,
        d: i64 = 8,
        vin: u64 = 16,
        x: u64 = 24,
        v: u64 = 32,
        raw: u64 = 40,
        f: u64 = 48,
        mu: u64 = 56,
        tx: u64 = 64,
        tv: u64 = 72,
        h: f64 = 80,
        dt: f64 = 88,
        c: f64 = 96,
        vec: i32 = 104,
        pad: i32 = 108,
    }
}

kernel_args! {
    /// `struct SwArgs`: `geo_sw`.
    struct SwArgs(144) {
        k: KickArgs = 0,
        p: u64 = 112,
        w: u64 = 120,
        r: i64 = 128,
        mode: i32 = 136,
        pad: i32 = 140,
    }
}

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

kernel_args! {
    /// `struct AdjArgs`: `geo_adj`.
    struct AdjArgs(96) {
        n: i64 = 0,
        d: i64 = 8,
        lv_in: u64 = 16,
        lv: u64 = 24,
        g: u64 = 32,
        df: u64 = 40,
        gx: u64 = 48,
        mu: u64 = 56,
        h: f64 = 64,
        dt: f64 = 72,
        c: f64 = 80,
        df_init: i32 = 88,
        vec: i32 = 92,
    }
}
