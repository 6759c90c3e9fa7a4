//! The kernels' argument structs, passed by value, declared once (`kernel_args!`):
//! every module's source defines them ahead of the kernel text (`names::source`).

use crate::gpu::kargs::kernel_args;

kernel_args! {
    /// `struct GeoArgs`: the fast and generic kernels.
    #[derive(Default)]
    pub(super) struct GeoArgs {
        B: i64,
        D: i64,
        R: i64,
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
        /// workspace: per-block slabs of `ws_per_cta` elements
        ws: u64,
        ws_per_cta: i64,
        /// `GEO_WANT_*` (backwards)
        want: i32,
        /// rows of v start 16-byte aligned (cp.async path)
        vec_ok: i32,
        smem_bytes: u32,
        pad_: i32,
    }
}

kernel_args! {
    /// `struct ReduceArgs`: `geo_reduce`.
    pub(super) struct ReduceArgs {
        /// `[nparts][n]`
        parts: u64,
        /// `[D][R]`
        out: u64,
        nparts: i64,
        /// elements per partial: D R, or DP RP in the coalesced parameter layout
        n: i64,
        D: i64,
        R: i64,
        /// the fast kernels' coalesced layout's `Cfg::KW`, `PV`, `RQ` (`param_store`);
        /// kw = 0: `[D][R]`
        kw: i32,
        pv: i32,
        rq: i32,
        pad: i32,
    }
}

kernel_args! {
    /// `struct EwArgs`: the `GEO_EW` kernels (`y[i]` from `y[i]`, `x[i]`, `c`).
    pub(super) struct EwArgs {
        y: u64,
        x: u64,
        n: i64,
        c: f64,
        vec: i32,
        pad_: i32,
    }
}

kernel_args! {
    /// `struct KickArgs`: `geo_kick`.
    #[derive(Clone, Copy)]
    pub(super) struct KickArgs {
        n: i64,
        d: i64,
        vin: u64,
        /// 0 for no drift
        x: u64,
        v: u64,
        raw: u64,
        /// `f`, `mu`, `tx`, `tv` optional
        f: u64,
        mu: u64,
        tx: u64,
        tv: u64,
        h: f64,
        dt: f64,
        c: f64,
        vec: i32,
        pad_: i32,
    }
}

kernel_args! {
    /// `struct SwArgs`: `geo_sw`.
    pub(super) struct SwArgs {
        /// `k.n` = B*D, `k.d` = D
        k: KickArgs,
        /// P `[B, R]`
        p: u64,
        /// W `[D, R]`
        w: u64,
        r: i64,
        mode: i32,
        pad_: i32,
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
    pub(super) struct AdjArgs {
        n: i64,
        d: i64,
        /// 0: zeros (no gv)
        lv_in: u64,
        lv: u64,
        g: u64,
        /// `df`, `gx`, `mu` optional
        df: u64,
        gx: u64,
        mu: u64,
        h: f64,
        dt: f64,
        c: f64,
        /// the sweep's first update: df = h l instead of df += h l
        df_init: i32,
        vec: i32,
    }
}
