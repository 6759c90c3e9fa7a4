//! The chunked GEMM's pipeline: host-resident operands staged through rings of
//! device buffers on the slot's copy streams, products on the caller's stream,
//! events ordering every buffer reuse.

use std::ffi::c_void;

use cudarc::driver::sys as ds;

use super::tiles::{ChunkProblem, Tiles, choose_tiles};
use super::{gemm, slot_of};
use crate::addr::Addr;
use crate::addr::{ptr, raw};
use crate::error::{CudaContext as _, Result, lock};
use crate::gpu::CudaDevice;
use crate::gpu::cublas::{self, Slot};
use crate::plan::elementwise::Scalar;
use crate::plan::linalg::{GemmPlan, Mat, dense};
use crate::stream::Stream;

/// Whether `addr` is host memory (pinned or registered) rather than device memory.
fn is_host(dev: &CudaDevice, addr: Option<Addr>) -> Result<bool> {
    dev.bind()?;
    let mut mem_type: u32 = 0;
    let mut attrs = [ds::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE];
    let mut data = [&mut mem_type as *mut u32 as *mut c_void];
    // SAFETY: data[0] points to storage for the attribute's type (unsigned int).
    unsafe { ds::cuPointerGetAttributes(1, attrs.as_mut_ptr(), data.as_mut_ptr(), raw(addr)) }
        .result()
        .cuda("cuPointerGetAttributes")?;
    Ok(mem_type == ds::CUmemorytype::CU_MEMORYTYPE_HOST as u32)
}

struct Events(Vec<ds::CUevent>);

impl Events {
    fn new(n: usize) -> Result<Events> {
        let mut ev = Events(Vec::with_capacity(n));
        for _ in 0..n {
            let mut e: ds::CUevent = std::ptr::null_mut();
            // SAFETY: writes a new event of the current context.
            unsafe { ds::cuEventCreate(&mut e, ds::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
                .result()
                .cuda("cuEventCreate")?;
            ev.0.push(e);
        }
        Ok(ev)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        for e in &self.0 {
            // SAFETY: created in new(); released once their work completes.
            unsafe { ds::cuEventDestroy_v2(*e) };
        }
    }
}

pub(super) fn record(e: ds::CUevent, stream: usize) -> Result<()> {
    // SAFETY: event and stream of the current context.
    unsafe { ds::cuEventRecord(e, stream as ds::CUstream) }
        .result()
        .cuda("cuEventRecord")
}

pub(super) fn wait(stream: usize, e: ds::CUevent) -> Result<()> {
    // SAFETY: as above.
    unsafe { ds::cuStreamWaitEvent(stream as ds::CUstream, e, 0) }
        .result()
        .cuda("cuStreamWaitEvent")
}

/// A `rows x width`-byte block between host and device (row pitches in bytes):
/// host to device when `to_device`, else device to host.
#[derive(Debug, Clone, Copy)]
struct Block {
    to_device: bool,
    host: Option<Addr>,
    host_pitch: usize,
    dev: Option<Addr>,
    dev_pitch: usize,
    width: usize,
    rows: usize,
}

/// Queues the copy of block `b` on `stream`.
fn copy2d(b: &Block, stream: usize) -> Result<()> {
    let Block {
        to_device,
        host,
        host_pitch,
        dev: dev_ptr,
        dev_pitch,
        width,
        rows,
    } = *b;
    if width == 0 || rows == 0 {
        return Ok(());
    }
    // Every field written out: CUmemorytype has no zero value, so a zeroed struct
    // would be invalid (Rust aborts on it).
    let mut c = ds::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: ds::CUmemorytype::CU_MEMORYTYPE_HOST,
        srcHost: std::ptr::null(),
        srcDevice: 0,
        srcArray: std::ptr::null_mut(),
        srcPitch: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: ds::CUmemorytype::CU_MEMORYTYPE_HOST,
        dstHost: std::ptr::null_mut(),
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: 0,
        WidthInBytes: 0,
        Height: 0,
    };
    if to_device {
        c.srcMemoryType = ds::CUmemorytype::CU_MEMORYTYPE_HOST;
        c.srcHost = ptr::<c_void>(host).cast_const();
        c.srcPitch = host_pitch;
        c.dstMemoryType = ds::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        c.dstDevice = raw(dev_ptr);
        c.dstPitch = dev_pitch;
    } else {
        c.srcMemoryType = ds::CUmemorytype::CU_MEMORYTYPE_DEVICE;
        c.srcDevice = raw(dev_ptr);
        c.srcPitch = dev_pitch;
        c.dstMemoryType = ds::CUmemorytype::CU_MEMORYTYPE_HOST;
        c.dstHost = ptr::<c_void>(host);
        c.dstPitch = host_pitch;
    }
    c.WidthInBytes = width;
    c.Height = rows;
    // SAFETY: the regions lie inside the validated operands and the staging buffers.
    unsafe { ds::cuMemcpy2DAsync_v2(&c, stream as ds::CUstream) }
        .result()
        .cuda("cuMemcpy2DAsync")
}

/// A region `(row0, col0, rows, cols)` of a stored matrix.
type Region = (i64, i64, i64, i64);

/// The three streams of the chunked GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// host-to-device copies (the slot's copy stream)
    Up,
    /// device-to-host copies (the slot's download stream)
    Down,
    /// the products (the caller's stream)
    Compute,
}

/// What the chunked GEMM queues: CUDA (`CudaQueue`), or in the unit tests a
/// recorder that executes on host memory and checks the ordering.
trait Queue {
    /// Block `b`: host to device on `Lane::Up`, device to host on `Lane::Down`.
    fn copy(&mut self, b: &Block) -> Result<()>;
    /// One product on `Lane::Compute`.
    fn gemm(&mut self, p: &GemmPlan) -> Result<()>;
    /// Records event `ev` on `lane`.
    fn record(&mut self, ev: usize, lane: Lane) -> Result<()>;
    /// `lane` waits for event `ev`'s last recording.
    fn wait(&mut self, lane: Lane, ev: usize) -> Result<()>;
}

struct CudaQueue<'a> {
    slot: &'a Slot,
    up: usize,
    down: usize,
    compute: usize,
    ev: &'a [ds::CUevent],
}

impl CudaQueue<'_> {
    fn stream(&self, lane: Lane) -> usize {
        match lane {
            Lane::Up => self.up,
            Lane::Down => self.down,
            Lane::Compute => self.compute,
        }
    }
}

impl Queue for CudaQueue<'_> {
    fn copy(&mut self, b: &Block) -> Result<()> {
        copy2d(b, if b.to_device { self.up } else { self.down })
    }
    fn gemm(&mut self, p: &GemmPlan) -> Result<()> {
        cublas::gemm_ex(self.slot, p)
    }
    fn record(&mut self, ev: usize, lane: Lane) -> Result<()> {
        record(self.ev[ev], self.stream(lane))
    }
    fn wait(&mut self, lane: Lane, ev: usize) -> Result<()> {
        wait(self.stream(lane), self.ev[ev])
    }
}

/// A ring of staging buffers for one host-resident input operand. A region already
/// staged is used again; a new one goes to the oldest buffer (round robin) once
/// the products that read it are done (`released`, recorded on the compute lane)
/// and is uploaded on the upload lane (`filled`, which the compute lane waits for).
struct Ring {
    src: Mat,
    bufs: Vec<Option<Addr>>,
    tag: Vec<Option<Region>>,
    used: Vec<bool>,
    /// event indices
    filled: Vec<usize>,
    released: Vec<usize>,
    next: usize,
    cur: usize,
}

impl Ring {
    fn new(src: Mat, bufs: Vec<Option<Addr>>, ev0: usize) -> Ring {
        let d = bufs.len();
        Ring {
            src,
            tag: vec![None; d],
            used: vec![false; d],
            filled: (ev0..ev0 + d).collect(),
            released: (ev0 + d..ev0 + 2 * d).collect(),
            bufs,
            next: 0,
            cur: 0,
        }
    }

    /// A new matrix of the batch: the same regions hold new data.
    fn reset(&mut self, src: Mat) {
        self.src = src;
        self.tag.fill(None);
    }

    /// The device matrix holding region `r`, uploading it when not staged already.
    fn get(&mut self, q: &mut impl Queue, r: Region, es: usize) -> Result<Mat> {
        if let Some(s) = self.tag.iter().position(|t| *t == Some(r)) {
            // staged earlier; the compute lane already waits for that upload
            self.cur = s;
        } else {
            let s = self.next;
            self.next = (s + 1) % self.bufs.len();
            if self.used[s] {
                q.wait(Lane::Up, self.released[s])?;
            }
            // SAFETY: the region lies inside the source matrix (the tiling covers it).
            let host = unsafe { self.src.elem(r.0, r.1, es) };
            let w = r.3 as usize * es;
            q.copy(&Block {
                to_device: true,
                host,
                host_pitch: self.src.ld as usize * es,
                dev: self.bufs[s],
                dev_pitch: w,
                width: w,
                rows: r.2 as usize,
            })?;
            q.record(self.filled[s], Lane::Up)?;
            q.wait(Lane::Compute, self.filled[s])?;
            self.tag[s] = Some(r);
            self.cur = s;
        }
        Ok(dense(self.bufs[self.cur], r.2, r.3, 0))
    }

    /// The product that read the current region is queued on the compute lane.
    fn release(&mut self, q: &mut impl Queue) -> Result<()> {
        q.record(self.released[self.cur], Lane::Compute)?;
        self.used[self.cur] = true;
        Ok(())
    }
}

fn sub(m: &Mat, r: Region, es: usize) -> Mat {
    Mat {
        // SAFETY: the tiling's regions lie inside the matrix.
        addr: unsafe { m.elem(r.0, r.1, es) },
        rows: r.2,
        cols: r.3,
        ld: m.ld,
        batch_stride: 0,
    }
}

/// Where the staging buffers lie: `depth` buffers each of A `[tm x tk]`,
/// B `[tk x tn]`, C `[tm x tn]` for the operands in host memory, from `base` (an
/// allocation of `total` bytes).
struct Staging {
    base: Option<Addr>,
    offs: [usize; 3],
    sizes: [usize; 3],
    total: usize,
}

impl Staging {
    fn new(t: &Tiles, es: usize, host: [bool; 3]) -> Staging {
        let sizes = [
            ((t.tm * t.tk) as usize * es).next_multiple_of(256),
            ((t.tk * t.tn) as usize * es).next_multiple_of(256),
            ((t.tm * t.tn) as usize * es).next_multiple_of(256),
        ];
        let mut offs = [0usize; 3];
        let mut total = 0usize;
        for i in 0..3 {
            offs[i] = total;
            if host[i] {
                total += t.depth * sizes[i];
            }
        }
        Staging {
            base: None,
            offs,
            sizes,
            total,
        }
    }
    fn bufs(&self, i: usize, depth: usize) -> Vec<Option<Addr>> {
        // SAFETY: buffer d < depth of operand i lies inside the `total` bytes at
        // `base` (operand i's buffers are counted in `total` when it is staged).
        let at = |d: usize| {
            self.base
                .map(|b| unsafe { b.byte_add((self.offs[i] + d * self.sizes[i]) as u64) })
        };
        (0..depth).map(at).collect()
    }
}

/// Events the pipeline uses: fork, join of the upload lane, join of the download
/// lane, then per ring slot A and B filled / released, C filled / computed / free.
fn pipeline_events(depth: usize) -> usize {
    3 + 7 * depth
}

/// The chunked GEMM's schedule (see `gemm_chunked`), queued on `q`: the fork, the
/// tiles (`tiles`, given the queue), and the join (queued also after a failure, so
/// that the staging memory, freed on the compute lane afterwards, outlives every
/// queued copy).
fn pipeline<Q: Queue>(q: &mut Q, tiles: impl FnOnce(&mut Q) -> Result<()>) -> Result<()> {
    const FORK: usize = 0;
    const JOIN_UP: usize = 1;
    const JOIN_DOWN: usize = 2;
    // fork: both copy lanes start after the work already queued on the compute lane
    // (which includes the staging allocation)
    let forked = q
        .record(FORK, Lane::Compute)
        .and_then(|_| q.wait(Lane::Up, FORK))
        .and_then(|_| q.wait(Lane::Down, FORK));
    let run = forked.and_then(|_| tiles(q));
    // join: the compute lane continues after every upload and download (C complete
    // in host memory)
    let joined = q
        .record(JOIN_UP, Lane::Up)
        .and_then(|_| q.wait(Lane::Compute, JOIN_UP))
        .and_then(|_| q.record(JOIN_DOWN, Lane::Down))
        .and_then(|_| q.wait(Lane::Compute, JOIN_DOWN));
    run.and(joined)
}

fn tiles(
    q: &mut impl Queue,
    p: &GemmPlan,
    host: [bool; 3],
    t: Tiles,
    load_c: bool,
    st: &Staging,
) -> Result<()> {
    let Tiles { tm, tn, tk, depth } = t;
    let es = p.dtype.size();
    let (m, n, k) = (p.m, p.n, p.k);
    let mut sa = Ring::new(p.a, st.bufs(0, depth), 3);
    let mut sb = Ring::new(p.b, st.bufs(1, depth), 3 + 2 * depth);
    let c_bufs = st.bufs(2, depth);
    let c_ev = 3 + 4 * depth;
    let (c_filled, c_computed, c_free) = (c_ev, c_ev + depth, c_ev + 2 * depth);
    let mut c_used = vec![false; depth];
    let panels = if k == 0 { 1 } else { (k + tk - 1) / tk };
    let mut tile = 0usize;
    for bi in 0..p.batch {
        let at = |x: &Mat| Mat {
            // SAFETY: bi < batch.
            addr: unsafe { x.at(bi, es) },
            batch_stride: 0,
            ..*x
        };
        let (a, b, c) = (at(&p.a), at(&p.b), at(&p.c));
        // the same regions of another matrix of the batch are new data
        if p.a.batch_stride != 0 || bi == 0 {
            sa.reset(a);
        }
        if p.b.batch_stride != 0 || bi == 0 {
            sb.reset(b);
        }
        for i0 in (0..m).step_by(tm.max(1) as usize) {
            let mi = tm.min(m - i0);
            for j0 in (0..n).step_by(tn.max(1) as usize) {
                let nj = tn.min(n - j0);
                let cs = tile % depth;
                let w = nj as usize * es;
                // C's tile: uploaded when C is loaded, downloaded once computed
                let c_block = |to_device| Block {
                    to_device,
                    // SAFETY: (i0, j0) < (m, n), an element of C.
                    host: unsafe { c.elem(i0, j0, es) },
                    host_pitch: c.ld as usize * es,
                    dev: c_bufs[cs],
                    dev_pitch: w,
                    width: w,
                    rows: mi as usize,
                };
                let cmat = if host[2] {
                    if load_c {
                        // the buffer's previous download must be done first
                        if c_used[cs] {
                            q.wait(Lane::Up, c_free + cs)?;
                        }
                        q.copy(&c_block(true))?;
                        q.record(c_filled + cs, Lane::Up)?;
                        q.wait(Lane::Compute, c_filled + cs)?;
                    } else if c_used[cs] {
                        q.wait(Lane::Compute, c_free + cs)?;
                    }
                    dense(c_bufs[cs], mi, nj, 0)
                } else {
                    sub(&c, (i0, j0, mi, nj), es)
                };
                for pi in 0..panels {
                    let p0 = pi * tk;
                    let kp = if k == 0 { 0 } else { tk.min(k - p0) };
                    let ra = if p.op_a.transposed() {
                        (p0, i0, kp, mi)
                    } else {
                        (i0, p0, mi, kp)
                    };
                    let rb = if p.op_b.transposed() {
                        (j0, p0, nj, kp)
                    } else {
                        (p0, j0, kp, nj)
                    };
                    let amat = if host[0] {
                        sa.get(q, ra, es)?
                    } else {
                        sub(&a, ra, es)
                    };
                    let bmat = if host[1] {
                        sb.get(q, rb, es)?
                    } else {
                        sub(&b, rb, es)
                    };
                    q.gemm(&GemmPlan {
                        m: mi,
                        n: nj,
                        k: kp,
                        batch: 1,
                        a: amat,
                        b: bmat,
                        c: cmat,
                        beta: if pi == 0 {
                            p.beta
                        } else {
                            Scalar { re: 1.0, im: 0.0 }
                        },
                        ..*p
                    })?;
                    if host[0] {
                        sa.release(q)?;
                    }
                    if host[1] {
                        sb.release(q)?;
                    }
                }
                if host[2] {
                    q.record(c_computed + cs, Lane::Compute)?;
                    q.wait(Lane::Down, c_computed + cs)?;
                    q.copy(&c_block(false))?;
                    q.record(c_free + cs, Lane::Down)?;
                    c_used[cs] = true;
                }
                tile += 1;
            }
        }
    }
    Ok(())
}

/// The chunked GEMM: each matrix of the batch in tiles of C (`tm x tn`) and panels
/// of k (`tk`), chosen by `choose_tiles`. Host-resident operands are staged through
/// rings of device buffers: uploads (A, B, and C when beta != 0) on the slot's
/// upload stream, downloads of C tiles on its download stream (the two directions
/// run on the GPU's two copy engines at once), the products on `stream`; events
/// order every reuse of a staging buffer, and `stream` waits for both copy streams
/// at the end (C complete in host memory for work queued after the call). The
/// result does not depend on timing: the tiling is fixed by the problem and the
/// panels of k are accumulated in order.
pub fn gemm_chunked(dev: &CudaDevice, p: &GemmPlan, budget: u64, stream: &Stream) -> Result<()> {
    let host = [
        is_host(dev, p.a.addr)?,
        is_host(dev, p.b.addr)?,
        is_host(dev, p.c.addr)?,
    ];
    if !host.iter().any(|&h| h) {
        return gemm(dev, p, stream);
    }
    dev.refuse_capture(
        stream.raw,
        "fk_gemm_chunked",
        "with operands in host memory it pipelines copies through staging buffers on copy streams of its own, ordered by events (with every operand in device memory it is fk_gemm and capturable)",
    )?;
    let pr = ChunkProblem::new(p, host, dev.sm_count);
    let t = choose_tiles(&pr, budget)?;
    let mut st = Staging::new(&t, p.dtype.size(), host);
    debug_assert_eq!(st.total as u64, pr.staging_bytes(&t));
    let slot = slot_of(dev, stream)?;
    let mut g = lock(&slot);
    let up = g.copy_stream(dev)?;
    let down = g.download_stream(dev)?;
    let ev = Events::new(pipeline_events(t.depth))?;
    // SAFETY: a fresh allocation of `total` bytes of this device, freed below on
    // the compute stream after the join, behind every queued use.
    st.base = unsafe { Addr::from_raw(dev.alloc_async(st.total, stream.raw)?) };
    let mut q = CudaQueue {
        slot: &g,
        up,
        down,
        compute: stream.raw,
        ev: &ev.0,
    };
    let r = pipeline(&mut q, |q| tiles(q, p, host, t, pr.load_c, &st));
    dev.free_async(raw(st.base), stream.raw);
    r
}

/// The chunked GEMM's schedule executed on host memory (staging buffers in a host
/// allocation, products by the CPU backend) in program order, for the result, while
/// a happens-before analysis over the three lanes (vector clocks through the
/// events) checks that every two accesses to a staging buffer or a host tile, one
/// of them a write, are ordered: no upload overwrites a buffer a queued product
/// still reads, no product reads a buffer before its upload, no download reads a
/// tile before its product, no product or upload overwrites a C buffer before its
/// download; the allocation before the fork and the free and the caller's reads
/// after the join come after everything.
#[cfg(test)]
mod tests;
