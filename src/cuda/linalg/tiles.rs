//! The chunked GEMM's tile choice: a cost estimate of every tiling whose staging
//! fits the budget, and the pick among the near-fastest.

use crate::dtype::DType;
use crate::error::{FK_ERROR_OUT_OF_MEMORY, Result};
use crate::plan::linalg::GemmPlan;

/// Smallest tile edge the chunked GEMM shrinks to (unless the matrix is smaller).
const MIN_TILE: i64 = 128;

/// Most staging buffers per host operand (2: double buffering, the least).
pub(super) const MAX_DEPTH: usize = 3;

/// Host<->device copy rate per direction that the tile choice assumes (PCIe 5 x16;
/// only its ratio to the product's rate matters).
const LINK_BYTES_PER_S: f64 = 50e9;

/// Host time to queue one step (copy, events, cuBLAS call) that the tile choice
/// assumes.
const STEP_OVERHEAD_S: f64 = 10e-6;

/// GPU time lost per tile product (launch, ramp-up and tail of the kernel) that the
/// tile choice assumes.
const STEP_GPU_S: f64 = 5e-6;

/// The chunked GEMM's tiling: `C` in `tm x tn` tiles, `k` in panels of `tk`, and
/// `depth` staging buffers per host operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tiles {
    pub(super) tm: i64,
    pub(super) tn: i64,
    pub(super) tk: i64,
    pub(super) depth: usize,
}

/// What the tile choice weighs.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkProblem {
    m: i64,
    n: i64,
    k: i64,
    batch: i64,
    es: u64,
    /// a, b, c in host memory
    host: [bool; 3],
    /// beta != 0: host C tiles are uploaded before the product too
    pub(super) load_c: bool,
    /// a, b broadcast over the batch (batch stride 0)
    broadcast: [bool; 2],
    complex: bool,
    /// the product's rate (FLOP/s) assumed for the dtype
    flops_per_s: f64,
    sm_count: i64,
}

impl ChunkProblem {
    pub(super) fn new(p: &GemmPlan, host: [bool; 3], sm_count: i32) -> ChunkProblem {
        let flops_per_s = match p.dtype {
            DType::F16 | DType::BF16 => 600e12,
            DType::F32 | DType::C64 if p.allow_tf32 => 300e12,
            _ => 50e12,
        };
        ChunkProblem {
            m: p.m,
            n: p.n,
            k: p.k,
            batch: p.batch,
            es: p.dtype.size() as u64,
            host,
            load_c: !(p.beta.re == 0.0 && p.beta.im == 0.0),
            broadcast: [p.a.batch_stride == 0, p.b.batch_stride == 0],
            complex: p.dtype.is_complex(),
            flops_per_s,
            sm_count: sm_count.max(1) as i64,
        }
    }

    /// Device bytes of the staging buffers (each rounded up to 256 bytes).
    pub(super) fn staging_bytes(&self, t: &Tiles) -> u64 {
        let sz = |r: i64, c: i64| (r as u64 * c as u64 * self.es).next_multiple_of(256);
        let [a, b, c] = self.host.map(|h| h as u64);
        t.depth as u64 * (a * sz(t.tm, t.tk) + b * sz(t.tk, t.tn) + c * sz(t.tm, t.tn))
    }

    /// Estimated seconds: the busiest of the upload stream, the download stream,
    /// the products and the host's queuing, plus filling and draining the pipeline
    /// (the first step's uploads, the last tile's download, one tile's product).
    /// Operands are re-uploaded where the ring cannot keep them staged: `A`'s panels
    /// of a row of tiles stay when there are at most `depth` of them, `B`'s when all
    /// its regions of a row of tiles fit. A tile product's efficiency counts the
    /// wave quantisation of 128 x 256 output blocks over the multiprocessors and the
    /// k loop's ramp, and each product loses `STEP_GPU_S`.
    pub(super) fn estimate(&self, t: &Tiles) -> f64 {
        let ceil = |x: i64, d: i64| if x == 0 { 1 } else { (x + d - 1) / d.max(1) };
        let (it, jt, pt) = (ceil(self.m, t.tm), ceil(self.n, t.tn), ceil(self.k, t.tk));
        let d = t.depth as i64;
        let es = self.es as f64;
        let nb = self.batch as f64;
        let mat = |r: i64, c: i64| r as f64 * c as f64 * es;
        let [ha, hb, hc] = self.host;
        // An operand's uploads: none in device memory; `once` per batch entry, or
        // once in all when it is broadcast and its panels of the whole batch stay.
        let upload = |host: bool, broadcast: bool, stays: bool, once: f64| {
            if !host {
                0.0
            } else if broadcast && stays {
                once
            } else {
                once * nb
            }
        };
        let a_once = mat(self.m, self.k) * if pt <= d { 1.0 } else { jt as f64 };
        let a_up = upload(ha, self.broadcast[0], it * pt <= d, a_once);
        let b_once = mat(self.k, self.n) * if jt * pt <= d { 1.0 } else { it as f64 };
        let b_up = upload(hb, self.broadcast[1], jt * pt <= d, b_once);
        let c_bytes = if hc { mat(self.m, self.n) * nb } else { 0.0 };
        let up = (a_up + b_up + if self.load_c { c_bytes } else { 0.0 }) / LINK_BYTES_PER_S;
        let down = c_bytes / LINK_BYTES_PER_S;
        let flops =
            if self.complex { 8.0 } else { 2.0 } * mat(self.m, self.n) / es * self.k as f64 * nb;
        let ctas = (ceil(t.tm, 128) * ceil(t.tn, 256)) as f64;
        let waves = ctas / self.sm_count as f64;
        let tk = t.tk.max(1) as f64;
        let eff = waves / waves.ceil() * tk / (tk + 256.0);
        let steps = (it * jt * pt) as f64 * nb;
        let comp = flops / (self.flops_per_s * eff) + steps * STEP_GPU_S;
        let queue = steps * STEP_OVERHEAD_S;
        let first_up = (ha as u8 as f64 * mat(t.tm, t.tk)
            + hb as u8 as f64 * mat(t.tk, t.tn)
            + (hc && self.load_c) as u8 as f64 * mat(t.tm, t.tn))
            / LINK_BYTES_PER_S;
        let last_down = hc as u8 as f64 * mat(t.tm, t.tn) / LINK_BYTES_PER_S;
        up.max(down).max(comp).max(queue) + first_up + last_down + comp / steps
    }
}

/// Tile edges tried for a dimension: `x`, then halved (rounded up to a multiple of
/// `MIN_TILE`) while that makes it smaller.
fn edges(x: i64) -> Vec<i64> {
    let mut v = vec![x];
    loop {
        let t = *v.last().unwrap();
        let h = ((t + 1) / 2 + MIN_TILE - 1) / MIN_TILE * MIN_TILE;
        if h >= t {
            return v;
        }
        v.push(h);
    }
}

/// Estimates within this factor of the best count as equally good.
const NEAR_BEST: f64 = 1.05;

/// The tiling whose staging fits `budget`, among those estimated within `NEAR_BEST`
/// of the fastest: the fewest panels of k (each further panel accumulates the C
/// tile again, rounding it to the storage type in between), then the fewest steps
/// (larger products run closer to the GPU's rate than the estimate can tell), then
/// the widest tiles (whole rows: contiguous copies), then the deeper ring. Deterministic: it depends on the shapes, dtype, placement,
/// budget and multiprocessor count only.
pub(super) fn choose_tiles(pr: &ChunkProblem, budget: u64) -> Result<Tiles> {
    let mut fits: Vec<(f64, Tiles)> = Vec::new();
    for tm in edges(pr.m) {
        for tn in edges(pr.n) {
            for tk in edges(pr.k) {
                for depth in 2..=MAX_DEPTH {
                    let t = Tiles { tm, tn, tk, depth };
                    if pr.staging_bytes(&t) <= budget {
                        fits.push((pr.estimate(&t), t));
                    }
                }
            }
        }
    }
    let fastest = fits.iter().map(|f| f.0).fold(f64::INFINITY, f64::min);
    let ceil = |x: i64, d: i64| if x == 0 { 1 } else { (x + d - 1) / d.max(1) };
    let best = fits
        .into_iter()
        .filter(|(c, _)| *c <= fastest * NEAR_BEST)
        .min_by_key(|(_, t)| {
            let panels = ceil(pr.k, t.tk);
            let steps = ceil(pr.m, t.tm) * ceil(pr.n, t.tn) * panels;
            (
                panels,
                steps,
                std::cmp::Reverse(t.tn),
                std::cmp::Reverse(t.depth),
            )
        });
    match best {
        Some((_, t)) => Ok(t),
        None => {
            let need = pr.staging_bytes(&Tiles {
                tm: pr.m.min(MIN_TILE),
                tn: pr.n.min(MIN_TILE),
                tk: pr.k.min(MIN_TILE),
                depth: 2,
            });
            crate::bail!(
                FK_ERROR_OUT_OF_MEMORY,
                "device_budget_bytes = {budget} cannot hold the staging tiles: at least {need} bytes are needed ({MIN_TILE}-element tiles, double-buffered, of the operands in host memory)"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(m: i64, n: i64, k: i64, es: u64, host: [bool; 3]) -> ChunkProblem {
        ChunkProblem {
            m,
            n,
            k,
            batch: 1,
            es,
            host,
            load_c: false,
            broadcast: [false; 2],
            complex: false,
            flops_per_s: if es == 2 { 600e12 } else { 50e12 },
            sm_count: 132,
        }
    }

    #[test]
    fn tiles_fit_the_budget() {
        // A host 4096 x 8192 f32, B device, C host
        let pr = problem(4096, 4096, 8192, 4, [true, false, true]);
        let t = choose_tiles(&pr, 64 << 20).unwrap();
        assert!(pr.staging_bytes(&t) <= 64 << 20, "{t:?}");
        assert!(t.tm >= MIN_TILE && t.tn >= MIN_TILE && t.tk >= MIN_TILE);
        assert!(t.depth >= 2);
        // small enough to stage whole: one tile is the cheapest
        let pr = problem(100, 50, 30, 8, [true, true, true]);
        let t = choose_tiles(&pr, 1 << 30).unwrap();
        assert_eq!((t.tm, t.tn, t.tk), (100, 50, 30));
        // too small a budget
        let pr = problem(4096, 4096, 4096, 4, [true, true, true]);
        let e = choose_tiles(&pr, 1000).unwrap_err();
        assert_eq!(e.status, FK_ERROR_OUT_OF_MEMORY);
        assert!(e.message.contains("at least"));
        // every budget from the smallest up fits what it picks
        for budget in [200 << 10, 1 << 20, 5 << 20, 77 << 20] {
            for host in [
                [true, false, false],
                [false, true, true],
                [true, true, true],
            ] {
                let mut pr = problem(600, 520, 700, 4, host);
                pr.load_c = true;
                let t = choose_tiles(&pr, budget * 4).unwrap();
                assert!(pr.staging_bytes(&t) <= budget * 4, "{t:?} {host:?}");
            }
        }
    }

    /// The benchmark row (bf16, M = 65536, K = N = 8192, A and C in host memory,
    /// 2 GiB): enough tiles along M for the copies to overlap (the pipeline's fill
    /// and drain a small part of the total), whole rows of B per tile (A uploaded
    /// once), and tiles large enough to keep the GPU busy.
    #[test]
    fn tiles_pipeline_the_benchmark_row() {
        let pr = problem(65536, 8192, 8192, 2, [true, false, true]);
        let t = choose_tiles(&pr, 2 << 30).unwrap();
        assert_eq!((t.tn, t.tk), (8192, 8192), "{t:?}");
        assert!(t.tm <= 2048 && t.tm >= 512, "{t:?}");
        let floor = 65536.0 * 8192.0 * 2.0 / LINK_BYTES_PER_S; // one direction
        assert!(pr.estimate(&t) < 1.1 * floor, "{t:?}: {}", pr.estimate(&t));
        println!("{t:?}: estimate {:.2} ms", pr.estimate(&t) * 1e3);
    }
}
