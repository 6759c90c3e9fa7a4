//! Communicators and collectives: NCCL on CUDA contexts, a single-rank
//! communicator on the CPU.
//!
//! A communicator is one rank of a clique; it belongs to one context (one device).
//! Cliques are made either all at once in one process (`init_all`, one context per
//! device) or rank by rank from a unique id shared by any means (`init_rank`, one
//! call per rank from different threads or processes; one thread driving several
//! ranks wraps the calls in `group_start`/`group_end`).
//!
//! The CPU backend implements a single-rank communicator (`nranks == 1`): every
//! collective becomes a copy of `send` into `recv`, so the API is usable and
//! testable without GPUs. NCCL is loaded only for CUDA communicators and
//! `unique_id` (see `gpu::nccl`).
//!
//! Element types: f16, bf16, f32, f64 for every collective and reduction.
//! Complex buffers (complex64, complex128) are reduced as pairs of reals: that is
//! exact for `FK_REDUCE_SUM`, and the other reductions are refused
//! (`FK_ERROR_UNSUPPORTED_DTYPE`); broadcast and all-gather move them unchanged.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use crate::addr::{ptr, raw};
use crate::buffer::{Buffer, check_same_device};
use crate::context::{Context, Device};
use crate::dtype::DType;
use crate::error::{
    FK_ERROR_ALIASING, FK_ERROR_DEVICE_MISMATCH, FK_ERROR_DTYPE_MISMATCH,
    FK_ERROR_INVALID_ARGUMENT, FK_ERROR_SHAPE_MISMATCH, FK_ERROR_UNSUPPORTED,
    FK_ERROR_UNSUPPORTED_DTYPE, Result,
};
use crate::gpu::nccl::{self, ncclComm_t, ncclUniqueId};
use crate::stream::Stream;

/// Size of an exported unique id (NCCL's `NCCL_UNIQUE_ID_BYTES`).
pub(crate) const ID_BYTES: usize = 128;

/// A reduction (values are the ABI's `FK_REDUCE_*`, equal to NCCL's `ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
}

impl ReduceOp {
    pub fn from_abi(v: i32, what: &str) -> Result<ReduceOp> {
        Ok(match v {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            _ => crate::bail!(
                FK_ERROR_INVALID_ARGUMENT,
                "{what} = {v} is not a valid fk_reduce_op (FK_REDUCE_SUM=0, FK_REDUCE_PROD=1, FK_REDUCE_MAX=2, FK_REDUCE_MIN=3)"
            ),
        })
    }
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "FK_REDUCE_SUM",
            ReduceOp::Prod => "FK_REDUCE_PROD",
            ReduceOp::Max => "FK_REDUCE_MAX",
            ReduceOp::Min => "FK_REDUCE_MIN",
        }
    }
}

pub struct Comm {
    pub ctx: Arc<Context>,
    pub rank: i32,
    pub nranks: i32,
    /// The `ncclComm_t` (0 for a CPU communicator).
    raw: usize,
}

thread_local! {
    /// Open `group_start` calls on this thread.
    static GROUP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Calls NCCL's `ncclGroupStart` or `ncclGroupEnd` (`what`, picked from the table by
/// `call`) when NCCL can be loaded.
fn nccl_group(call: fn(&nccl::Nccl) -> unsafe extern "C" fn() -> c_int, what: &str) -> Result<()> {
    if let Ok(n) = nccl::nccl() {
        // SAFETY: both take no arguments.
        n.check(unsafe { call(n)() }, what, std::ptr::null_mut())?;
    }
    Ok(())
}

/// Opens a group (NCCL's `ncclGroupStart` when NCCL can be loaded; on a machine
/// without NCCL only the CPU's single-rank communicators exist, which need none).
pub fn group_start() -> Result<()> {
    nccl_group(|n| n.group_start, "ncclGroupStart")?;
    GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    Ok(())
}

/// Closes the innermost group opened on this thread; the grouped operations are
/// queued (or, for initialisations, completed) when the outermost group closes.
pub fn group_end() -> Result<()> {
    let depth = GROUP_DEPTH.with(|d| d.get());
    crate::ensure!(
        depth > 0,
        FK_ERROR_INVALID_ARGUMENT,
        "no group is open on this thread (call fk_comm_group_start first)"
    );
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    nccl_group(|n| n.group_end, "ncclGroupEnd")
}

fn in_group() -> bool {
    GROUP_DEPTH.with(|d| d.get()) > 0
}

/// NCCL's element type and count for `n` elements of `d` (complex as 2 reals).
fn nccl_type(d: DType, n: usize) -> (c_int, usize) {
    match d {
        DType::F16 => (nccl::NCCL_FLOAT16, n),
        DType::BF16 => (nccl::NCCL_BFLOAT16, n),
        DType::F32 => (nccl::NCCL_FLOAT32, n),
        DType::F64 => (nccl::NCCL_FLOAT64, n),
        DType::C64 => (nccl::NCCL_FLOAT32, 2 * n),
        DType::C128 => (nccl::NCCL_FLOAT64, 2 * n),
    }
}

impl Comm {
    /// A new unique id for `init_rank` (needs NCCL).
    pub fn unique_id() -> Result<[u8; ID_BYTES]> {
        let n = nccl::nccl()?;
        let mut id = ncclUniqueId {
            internal: [0; ID_BYTES],
        };
        // SAFETY: id is a valid out-parameter.
        n.check(
            unsafe { (n.get_unique_id)(&mut id) },
            "ncclGetUniqueId",
            std::ptr::null_mut(),
        )?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Rank `rank` of a clique of `nranks`, on `ctx`'s device. On CUDA this blocks
    /// until every rank has joined (unless called inside a group).
    pub fn init_rank(
        ctx: &Arc<Context>,
        nranks: i32,
        id: &[u8; ID_BYTES],
        rank: i32,
    ) -> Result<Comm> {
        crate::ensure!(
            nranks >= 1,
            FK_ERROR_INVALID_ARGUMENT,
            "nranks = {nranks} must be >= 1"
        );
        crate::ensure!(
            (0..nranks).contains(&rank),
            FK_ERROR_INVALID_ARGUMENT,
            "rank = {rank} is outside 0..{nranks}"
        );
        let Some(d) = &ctx.cuda else {
            crate::ensure!(
                nranks == 1,
                FK_ERROR_UNSUPPORTED,
                "nranks = {nranks} on a CPU context: the CPU backend implements single-rank communicators only (nranks = 1)"
            );
            return Ok(Comm {
                ctx: ctx.clone(),
                rank: 0,
                nranks: 1,
                raw: 0,
            });
        };
        let n = nccl::nccl()?;
        d.bind()?;
        let uid = ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: comm is a valid out-parameter; the device's context is current.
        let r = unsafe { (n.comm_init_rank)(&mut comm, nranks, uid, rank) };
        n.check(r, "ncclCommInitRank", std::ptr::null_mut())?;
        d.bind()?;
        Ok(Comm {
            ctx: ctx.clone(),
            rank,
            nranks,
            raw: comm as usize,
        })
    }

    /// One communicator per context (rank i on `ctxs[i]`): CUDA contexts on distinct
    /// devices (`ncclCommInitAll`), or a single CPU context.
    pub fn init_all(ctxs: &[Arc<Context>]) -> Result<Vec<Comm>> {
        crate::ensure!(
            !ctxs.is_empty(),
            FK_ERROR_INVALID_ARGUMENT,
            "n = 0: at least one context is needed"
        );
        let ncpu = ctxs.iter().filter(|c| c.cuda.is_none()).count();
        if ncpu > 0 {
            crate::ensure!(
                ncpu == ctxs.len(),
                FK_ERROR_DEVICE_MISMATCH,
                "ctxs mixes CPU and CUDA contexts ({ncpu} of {} are CPU contexts)",
                ctxs.len()
            );
            crate::ensure!(
                ctxs.len() == 1,
                FK_ERROR_UNSUPPORTED,
                "n = {} CPU contexts: the CPU backend implements single-rank communicators only (n = 1)",
                ctxs.len()
            );
            return Ok(vec![Comm {
                ctx: ctxs[0].clone(),
                rank: 0,
                nranks: 1,
                raw: 0,
            }]);
        }
        let ords: Vec<c_int> = ctxs.iter().map(|c| c.device.ordinal() as c_int).collect();
        for (i, o) in ords.iter().enumerate() {
            if let Some(j) = ords[..i].iter().position(|p| p == o) {
                crate::bail!(
                    FK_ERROR_INVALID_ARGUMENT,
                    "ctxs[{j}] and ctxs[{i}] are both on cuda:{o}; each rank needs its own device"
                );
            }
        }
        let n = nccl::nccl()?;
        let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); ctxs.len()];
        // SAFETY: comms holds n slots; ords holds n device ordinals.
        let r =
            unsafe { (n.comm_init_all)(comms.as_mut_ptr(), ctxs.len() as c_int, ords.as_ptr()) };
        n.check(r, "ncclCommInitAll", std::ptr::null_mut())?;
        ctxs[0].cuda_dev().bind()?;
        let nranks = ctxs.len() as i32;
        Ok(ctxs
            .iter()
            .zip(comms)
            .enumerate()
            .map(|(i, (c, raw))| Comm {
                ctx: c.clone(),
                rank: i as i32,
                nranks,
                raw: raw as usize,
            })
            .collect())
    }

    pub fn device(&self) -> Device {
        self.ctx.device
    }

    /// Common checks of a collective's buffers and stream.
    fn check_args(&self, bufs: &[(&Buffer, &str)], out: &Buffer, stream: &Stream) -> Result<()> {
        let device = self.device();
        check_same_device(device, bufs).map_err(|mut e| {
            if e.status == FK_ERROR_DEVICE_MISMATCH && !e.message.contains("pinned") {
                e.message = e
                    .message
                    .replace("the operation runs on", "the communicator is on");
            }
            e
        })?;
        crate::ensure!(
            stream.ctx.device == device,
            FK_ERROR_DEVICE_MISMATCH,
            "stream is on {} but the communicator is on {device}",
            stream.ctx.device
        );
        let dtype = bufs[0].0.dtype;
        for (b, name) in bufs {
            crate::ensure!(
                b.dtype == dtype,
                FK_ERROR_DTYPE_MISMATCH,
                "{name} has dtype {} but {} has dtype {dtype}",
                b.dtype,
                bufs[0].1
            );
            crate::ensure!(
                b.is_contiguous(),
                FK_ERROR_UNSUPPORTED,
                "{name} with shape {:?} and strides {:?} is not contiguous; collectives take contiguous buffers",
                b.shape,
                b.strides
            );
        }
        out.check_writable("recv")
    }

    fn check_reduce_dtype(dtype: DType, op: ReduceOp) -> Result<()> {
        crate::ensure!(
            !dtype.is_complex() || op == ReduceOp::Sum,
            FK_ERROR_UNSUPPORTED_DTYPE,
            "{} of {dtype} buffers: complex values are reduced as pairs of reals, which is only right for FK_REDUCE_SUM",
            op.name()
        );
        Ok(())
    }

    /// Refuses partial overlaps; `in_place` is the one overlap the collective allows
    /// (send at this byte offset inside recv, or the reverse).
    fn check_overlap(send: &Buffer, recv: &Buffer, in_place: (u64, u64)) -> Result<()> {
        if !send.overlaps(recv) || in_place == (raw(send.data), raw(recv.data)) {
            return Ok(());
        }
        crate::bail!(
            FK_ERROR_ALIASING,
            "send and recv overlap ({:#x}, {} bytes and {:#x}, {} bytes) other than in the in-place layout this collective allows",
            raw(send.data),
            send.nbytes(),
            raw(recv.data),
            recv.nbytes()
        )
    }

    fn cpu_copy(send: &Buffer, recv: &Buffer) {
        if send.data != recv.data && recv.nbytes() > 0 {
            // SAFETY: sizes checked; overlaps other than identity were refused.
            unsafe { std::ptr::copy(ptr::<u8>(send.data), ptr(recv.data), recv.nbytes()) };
        }
    }

    /// The tail every collective shares: refuses overlaps of send and recv other
    /// than `in_place`; on a CPU communicator (one rank) copies send to recv; else
    /// queues NCCL's `what` over `counted`'s elements, `call` given the arguments
    /// in NCCL's order but the op or root: send, recv, count, datatype, comm, stream.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        what: &str,
        send: &Buffer,
        recv: &Buffer,
        in_place: (u64, u64),
        counted: &Buffer,
        stream: &Stream,
        call: impl FnOnce(
            &nccl::Nccl,
            *const c_void,
            *mut c_void,
            usize,
            c_int,
            ncclComm_t,
            *mut c_void,
        ) -> c_int,
    ) -> Result<()> {
        Self::check_overlap(send, recv, in_place)?;
        if self.raw == 0 {
            Self::cpu_copy(send, recv);
            return Ok(());
        }
        let (ty, count) = nccl_type(counted.dtype, counted.numel() as usize);
        let n = nccl::nccl()?;
        let dev = self.ctx.cuda_dev();
        dev.bind()?;
        let comm = self.raw as ncclComm_t;
        let (s, r) = (
            ptr::<c_void>(send.data).cast_const(),
            ptr::<c_void>(recv.data),
        );
        n.check(call(n, s, r, count, ty, comm, stream.raw as _), what, comm)?;
        if dev.debug_sync && !in_group() {
            stream.synchronize()?;
        }
        Ok(())
    }

    /// `recv = op over ranks of send` (element-wise); `send` and `recv` have the same
    /// number of elements; in place when they are the same buffer.
    pub fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.check_args(&[(send, "send"), (recv, "recv")], recv, stream)?;
        Self::check_reduce_dtype(send.dtype, op)?;
        crate::ensure!(
            recv.numel() == send.numel(),
            FK_ERROR_SHAPE_MISMATCH,
            "recv has {} elements but send has {}; all-reduce needs the same number",
            recv.numel(),
            send.numel()
        );
        let in_place = (raw(recv.data), raw(recv.data));
        self.launch(
            "ncclAllReduce",
            send,
            recv,
            in_place,
            send,
            stream,
            |n, s, r, count, ty, c, st| unsafe {
                (n.all_reduce)(s, r, count, ty, op as c_int, c, st)
            },
        )
    }

    /// `recv = send of rank root` on every rank; `send` is read on the root only and
    /// may be `None` elsewhere; in place when they are the same buffer.
    pub fn broadcast(
        &self,
        send: Option<&Buffer>,
        recv: &Buffer,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        crate::ensure!(
            (0..self.nranks).contains(&root),
            FK_ERROR_INVALID_ARGUMENT,
            "root = {root} is outside 0..{}",
            self.nranks
        );
        let send = match send {
            Some(s) => s,
            None => {
                crate::ensure!(
                    root != self.rank,
                    crate::error::FK_ERROR_NULL_POINTER,
                    "send is NULL on the root rank {root}"
                );
                recv
            }
        };
        self.check_args(&[(recv, "recv"), (send, "send")], recv, stream)?;
        crate::ensure!(
            recv.numel() == send.numel(),
            FK_ERROR_SHAPE_MISMATCH,
            "recv has {} elements but send has {}; broadcast needs the same number",
            recv.numel(),
            send.numel()
        );
        let in_place = (raw(recv.data), raw(recv.data));
        self.launch(
            "ncclBroadcast",
            send,
            recv,
            in_place,
            recv,
            stream,
            |n, s, r, count, ty, c, st| unsafe { (n.broadcast)(s, r, count, ty, root, c, st) },
        )
    }

    /// `recv = concat over ranks of send` (rank order); recv has nranks times send's
    /// elements; in place when send is rank's slice of recv.
    pub fn all_gather(&self, send: &Buffer, recv: &Buffer, stream: &Stream) -> Result<()> {
        self.check_args(&[(send, "send"), (recv, "recv")], recv, stream)?;
        let n = self.nranks as i64;
        crate::ensure!(
            recv.numel() == n * send.numel(),
            FK_ERROR_SHAPE_MISMATCH,
            "recv has {} elements but all-gather over {n} ranks of send with {} elements needs {}",
            recv.numel(),
            send.numel(),
            n * send.numel()
        );
        let slice = raw(recv.data) + (self.rank as usize * send.nbytes()) as u64;
        let in_place = (slice, raw(recv.data));
        self.launch(
            "ncclAllGather",
            send,
            recv,
            in_place,
            send,
            stream,
            |n, s, r, count, ty, c, st| unsafe { (n.all_gather)(s, r, count, ty, c, st) },
        )
    }

    /// `recv = slice rank of (op over ranks of send)`: send has nranks times recv's
    /// elements; in place when recv is rank's slice of send.
    pub fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.check_args(&[(send, "send"), (recv, "recv")], recv, stream)?;
        Self::check_reduce_dtype(send.dtype, op)?;
        let n = self.nranks as i64;
        crate::ensure!(
            send.numel() == n * recv.numel(),
            FK_ERROR_SHAPE_MISMATCH,
            "send has {} elements but reduce-scatter over {n} ranks into recv with {} elements needs {}",
            send.numel(),
            recv.numel(),
            n * recv.numel()
        );
        let slice = raw(send.data) + (self.rank as usize * recv.nbytes()) as u64;
        let in_place = (raw(send.data), slice);
        self.launch(
            "ncclReduceScatter",
            send,
            recv,
            in_place,
            recv,
            stream,
            |n, s, r, count, ty, c, st| unsafe {
                (n.reduce_scatter)(s, r, count, ty, op as c_int, c, st)
            },
        )
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.raw == 0 {
            return;
        }
        if let (Ok(n), Some(d)) = (nccl::nccl(), &self.ctx.cuda) {
            if d.bind().is_ok() {
                // SAFETY: a communicator made by init_rank/init_all, destroyed once.
                let _ = unsafe { (n.comm_destroy)(self.raw as ncclComm_t) };
            }
        }
    }
}
