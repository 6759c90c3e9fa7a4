//! Launcher for the geodesic kernels, `kernels/geodesic/` (docs/geodesic.md has the design).
//!
//! - `names`: the modules (`geodesic_<op>_<dtype>_r<RP>_d<DJ>`, one fast kernel each,
//!   and `geodesic_<op>_<dtype>_generic`) and kernel names, and each module's source.
//! - `plan`: which kernel runs an op, a pure function of the op, the job and the
//!   device's limits: the fast kernel (and its variant: strict, U and W in registers,
//!   TF32, 3xTF32) where its shared memory fits the device's opt-in limit; otherwise
//!   the cuBLAS route (`route`), or the generic kernel when cuBLAS cannot be loaded, the
//!   route's memory cannot be had, or with `FK_GEO_FORCE_GENERIC`. Also the workspace
//!   layouts and the shared-memory sizes the kernel source checks.
//! - `args`: the kernels' argument structs (declared once, `kernel_args!`).
//! - `route`: the cuBLAS route's op sequences.
//!
//! `run` asks the plan, then packs the arguments, allocates the workspace and launches
//! (for the backwards' fast and generic kernels, `geo_reduce` sums the dU, dW partials).

mod args;
mod config;
mod names;
mod plan;
mod route;
#[cfg(test)]
mod route_tests;

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use self::args::{GeoArgs, ReduceArgs};
use self::config::NT;
use self::plan::{KernelPlan, Limits, PartLayout, Plan};
use self::route::GemmRoute;
use super::launch::{grid_for, launch};
use crate::addr::{Addr, raw};
use crate::dtype::DType;
use crate::error::{CudaContext as _, FK_ERROR_OUT_OF_MEMORY, Result};
use crate::gpu::{CudaDevice, Workspace};
use crate::plan::geodesic::{Job, Kind};
use crate::stream::Stream;

pub use self::names::MODULES;

/// The device's opt-in shared memory per block, cached per ordinal.
pub(crate) fn max_smem(dev: &CudaDevice) -> Result<usize> {
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

/// Runs one geodesic op on `stream` (validated by `ops::geodesic`).
pub fn run(dev: &CudaDevice, kind: Kind, job: &Job, stream: &Stream) -> Result<()> {
    let max_smem = max_smem(dev)?;
    let lim = Limits {
        max_smem,
        sms: dev.sm_count.max(1) as usize,
        // cuBLAS is loaded only for an op that may take the route
        cublas: plan::route_possible(kind, job, max_smem) && crate::gpu::cublas::load().is_ok(),
    };
    match plan::plan(kind, job, &lim)? {
        Plan::Kernel(k) => run_kernel(dev, job, &k, stream),
        Plan::Route { route, fallback } => match GemmRoute::new(dev, job, stream, route) {
            Ok(r) => r.run(kind),
            // nothing queued yet: the generic kernels, which need less memory
            Err(e) if e.status == FK_ERROR_OUT_OF_MEMORY => run_kernel(dev, job, &fallback, stream),
            Err(e) => Err(e),
        },
    }
}

/// Launches the kernel of plan `k`, then for the backwards `geo_reduce` of the dU and
/// dW partials.
fn run_kernel(dev: &CudaDevice, job: &Job, k: &KernelPlan, stream: &Stream) -> Result<()> {
    let ws = if k.ws_bytes > 0 {
        Some(Workspace::new(dev, k.ws_bytes, stream.raw)?)
    } else {
        None
    };
    let ws_addr = ws.as_ref().and_then(Workspace::addr);
    // SAFETY: the plan's partial offsets lie inside its ws_bytes workspace.
    let at = |off: Option<usize>| {
        raw(off
            .zip(ws_addr)
            .map(|(o, w)| unsafe { w.byte_add(o as u64) }))
    };
    let (du_part, dw_part) = (at(k.du_part), at(k.dw_part));
    let mut args = GeoArgs {
        B: job.b as i64,
        D: job.d as i64,
        R: job.r as i64,
        steps: job.steps as i64,
        dt: job.dt,
        c: job.c,
        x0: raw(job.x0),
        v0: raw(job.v0),
        f: raw(job.f),
        u: raw(job.u),
        w: raw(job.w),
        mu: raw(job.mu),
        g: raw(job.g),
        gx: raw(job.gx),
        gv: raw(job.gv),
        x_out: raw(job.x_out),
        v_out: raw(job.v_out),
        traj: raw(job.traj),
        gamma: raw(job.gamma),
        dx: raw(job.dx),
        dv: raw(job.dv),
        df: raw(job.df),
        du_part,
        dw_part,
        ws: raw(ws_addr),
        ws_per_cta: k.per_cta as i64,
        want: k.want,
        vec_ok: i32::from(raw(job.v0) % 16 == 0 && (job.d * job.dtype.size()) % 16 == 0),
        smem_bytes: k.smem as u32,
        pad_: 0,
    };
    let grid = k.grid as u32;
    launch_one(
        dev, k.module, k.kernel, grid, k.threads, k.smem, stream, &mut args,
    )?;
    if let Some(du) = job.du {
        reduce(dev, k, job.dtype, du_part, du, stream)?;
    }
    if let Some(dw) = job.dw {
        reduce(dev, k, job.dtype, dw_part, dw, stream)?;
    }
    drop(ws);
    Ok(())
}

/// `geo_reduce`: `out` (`[D][R]`) = the sum of plan `k`'s `grid` partials at `parts`.
fn reduce(
    dev: &CudaDevice,
    k: &KernelPlan,
    dtype: DType,
    parts: u64,
    out: Addr,
    stream: &Stream,
) -> Result<()> {
    let l: PartLayout = k.parts;
    let mut a = ReduceArgs {
        parts,
        out: out.get(),
        nparts: k.grid as i64,
        n: l.n as i64,
        D: l.d as i64,
        R: l.r as i64,
        kw: l.kw,
        pv: l.pv,
        rq: l.rq,
        pad: 0,
    };
    let grid = grid_for(dev, l.n as i64);
    launch_one(
        dev,
        k.reduce_module,
        names::generic_kernel("geo_reduce", dtype)?,
        grid,
        NT,
        0,
        stream,
        &mut a,
    )
}

/// Launches `module::name` with `threads` threads per block and `smem` bytes of
/// dynamic shared memory on `stream`, its one argument the struct `args`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch_one<A>(
    dev: &CudaDevice,
    module: &'static str,
    name: &'static str,
    grid: u32,
    threads: u32,
    smem: usize,
    stream: &Stream,
    args: &mut A,
) -> Result<()> {
    let mut params = [args as *mut A as *mut c_void];
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
