use super::*;
use crate::addr::{ptr, raw};
use crate::cuda::linalg::tiles::MAX_DEPTH;
use crate::dtype::DType;
use crate::plan::elementwise::Scalar;
use crate::plan::linalg::Trans;
use crate::testing::Lcg;

#[derive(Debug, Clone)]
struct Access {
    key: u64,
    write: bool,
    lane: usize,
    stamp: [u64; 3],
    what: String,
}

struct SimQueue {
    vc: [[u64; 3]; 3],
    events: Vec<Option<[u64; 3]>>,
    accesses: Vec<Access>,
    downloads: Vec<u64>,
    copies: [usize; 2],
    products: usize,
}

fn li(l: Lane) -> usize {
    l as usize
}

impl SimQueue {
    fn new(events: usize) -> SimQueue {
        SimQueue {
            vc: [[0; 3]; 3],
            events: vec![None; events],
            accesses: Vec::new(),
            downloads: Vec::new(),
            copies: [0; 2],
            products: 0,
        }
    }
    fn step(&mut self, lane: Lane) -> [u64; 3] {
        let l = li(lane);
        self.vc[l][l] += 1;
        self.vc[l]
    }
    fn access(&mut self, key: u64, write: bool, lane: Lane, stamp: [u64; 3], what: String) {
        let l = li(lane);
        for a in &self.accesses {
            if a.key == key && (a.write || write) {
                assert!(
                    a.stamp[a.lane] <= stamp[a.lane],
                    "unordered accesses to {key:#x}: {} (lane {}, {:?}) and {what} (lane {l}, {stamp:?})",
                    a.what,
                    a.lane,
                    a.stamp
                );
            }
        }
        self.accesses.push(Access {
            key,
            write,
            lane: l,
            stamp,
            what,
        });
    }
}

impl Queue for SimQueue {
    fn copy(&mut self, b: &Block) -> Result<()> {
        let Block {
            to_device,
            host,
            host_pitch,
            dev,
            dev_pitch,
            width,
            rows,
        } = *b;
        let lane = if to_device { Lane::Up } else { Lane::Down };
        let t = self.step(lane);
        self.copies[!to_device as usize] += 1;
        let (host_at, dev_at) = (raw(host), raw(dev));
        if to_device {
            self.access(host_at, false, lane, t, format!("upload from {host_at:#x}"));
            self.access(dev_at, true, lane, t, format!("upload to {dev_at:#x}"));
        } else {
            self.access(dev_at, false, lane, t, format!("download from {dev_at:#x}"));
            self.access(host_at, true, lane, t, format!("download to {host_at:#x}"));
            self.downloads.push(host_at);
        }
        for r in 0..rows {
            // SAFETY: both rows lie in the test's allocations.
            let (h, d) = unsafe {
                (
                    ptr::<u8>(host).add(r * host_pitch),
                    ptr::<u8>(dev).add(r * dev_pitch),
                )
            };
            let (src, dst) = if to_device { (h, d) } else { (d, h) };
            // SAFETY: as above; a block's two ends never overlap.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, width) };
        }
        Ok(())
    }
    fn gemm(&mut self, p: &GemmPlan) -> Result<()> {
        let t = self.step(Lane::Compute);
        self.products += 1;
        let n = self.products;
        self.access(
            raw(p.a.addr),
            false,
            Lane::Compute,
            t,
            format!("product {n} reads A"),
        );
        self.access(
            raw(p.b.addr),
            false,
            Lane::Compute,
            t,
            format!("product {n} reads B"),
        );
        self.access(
            raw(p.c.addr),
            true,
            Lane::Compute,
            t,
            format!("product {n} writes C"),
        );
        if p.m > 0 && p.n > 0 {
            crate::cpu::linalg::gemm(p)?;
        }
        Ok(())
    }
    fn record(&mut self, ev: usize, lane: Lane) -> Result<()> {
        self.events[ev] = Some(self.vc[li(lane)]);
        Ok(())
    }
    fn wait(&mut self, lane: Lane, ev: usize) -> Result<()> {
        if let Some(e) = self.events[ev] {
            let v = &mut self.vc[li(lane)];
            for i in 0..3 {
                v[i] = v[i].max(e[i]);
            }
        }
        Ok(())
    }
}

/// A row-major f64 operand `[batch, rows, cols]` with row stride `cols + pad`
/// (batch 0: one matrix broadcast, batch stride 0).
fn operand(rng: &mut Lcg, batch: i64, rows: i64, cols: i64, pad: i64) -> (Vec<f64>, Mat) {
    let ld = cols + pad;
    let count = batch.max(1);
    let v: Vec<f64> = (0..count * rows * ld)
        .map(|_| rng.unit_f64() * 2.0 - 1.0)
        .collect();
    let mat = Mat {
        // SAFETY: v goes back with the matrix; the test keeps it alive and unmoved.
        addr: unsafe { Addr::from_ptr(v.as_ptr()) },
        rows,
        cols,
        ld,
        batch_stride: if batch == 0 { 0 } else { rows * ld },
    };
    (v, mat)
}

#[allow(clippy::too_many_arguments)]
fn check(
    op_a: Trans,
    op_b: Trans,
    (m, n, k): (i64, i64, i64),
    batch: [i64; 3],
    host: [bool; 3],
    beta: f64,
    budget: u64,
    rng: &mut Lcg,
) -> Tiles {
    let (ar, ac) = if op_a.transposed() { (k, m) } else { (m, k) };
    let (br, bc) = if op_b.transposed() { (n, k) } else { (k, n) };
    let (va, ma) = operand(rng, batch[0], ar, ac, 3);
    let (vb, mb) = operand(rng, batch[1], br, bc, 1);
    let (mut vc, mc) = operand(rng, batch[2], m, n, 2);
    let mut want = vc.clone();
    let p = GemmPlan {
        dtype: DType::F64,
        op_a,
        op_b,
        m,
        n,
        k,
        batch: batch[2].max(1),
        a: ma,
        b: mb,
        c: mc,
        alpha: Scalar { re: 0.75, im: 0.0 },
        beta: Scalar { re: beta, im: 0.0 },
        allow_tf32: false,
    };
    let pr = ChunkProblem::new(&p, host, 132);
    let t = choose_tiles(&pr, budget).unwrap();
    let mut st = Staging::new(&t, 8, host);
    assert!(st.total as u64 <= budget);
    let staging = vec![f64::NAN; st.total / 8 + 1];
    // SAFETY: the test's staging memory, alive until the pipeline has run.
    st.base = unsafe { Addr::from_ptr(staging.as_ptr()) };
    let mut q = SimQueue::new(pipeline_events(t.depth));
    let bufs: Vec<u64> = (0..3)
        .filter(|&i| host[i])
        .flat_map(|i| st.bufs(i, t.depth))
        .map(raw)
        .collect();
    let t0 = q.step(Lane::Compute);
    for &b in &bufs {
        q.access(b, true, Lane::Compute, t0, "the allocation".into());
    }
    pipeline(&mut q, |q| tiles(q, &p, host, t, pr.load_c, &st)).unwrap();
    let t1 = q.step(Lane::Compute);
    for &b in &bufs {
        q.access(b, true, Lane::Compute, t1, "the free".into());
    }
    for h in q.downloads.clone() {
        q.access(h, false, Lane::Compute, t1, "the caller's read of C".into());
    }
    let what = format!(
        "{op_a:?}{op_b:?} m={m} n={n} k={k} batch {batch:?} host {host:?} beta {beta} budget {budget}: {t:?}"
    );
    if host[2] {
        assert!(q.copies[1] > 0, "{what}: no download");
    }
    assert_eq!(
        q.copies[0] > 0,
        host[0] || host[1] || (host[2] && beta != 0.0),
        "{what}"
    );
    // the whole product at once on the CPU
    let full = GemmPlan {
        c: Mat {
            // SAFETY: `want` outlives the CPU product that writes it.
            addr: unsafe { Addr::from_ptr(want.as_mut_ptr()) },
            ..p.c
        },
        ..p
    };
    crate::cpu::linalg::gemm(&full).unwrap();
    // `vc` holds the pipeline's result (written through the raw pointers)
    let got = std::hint::black_box(&mut vc);
    let (num, den) = got.iter().zip(&want).fold((0.0, 0.0), |(n, d), (g, w)| {
        (n + (g - w) * (g - w), d + w * w)
    });
    let err = (num / den.max(1e-300)).sqrt();
    assert!(err <= 1e-12, "{what}: relative error {err:e}");
    drop((va, vb, staging));
    t
}

#[test]
fn pipeline_orders_every_buffer_reuse_and_computes_the_product() {
    let mut rng = Lcg(7);
    let hosts = [
        [true, false, false],
        [false, true, false],
        [false, false, true],
        [true, false, true],
        [false, true, true],
        [true, true, false],
        [true, true, true],
    ];
    let mut depths = [0usize; MAX_DEPTH + 1];
    let mut multi = 0;
    for (op_a, op_b) in [
        (Trans::N, Trans::N),
        (Trans::T, Trans::N),
        (Trans::N, Trans::C),
        (Trans::T, Trans::T),
    ] {
        for host in hosts {
            for beta in [0.0, 0.5] {
                for budget in [8 * (100 << 10), 8 * (200 << 10), 8 * (700 << 10), 1 << 40] {
                    let t = check(
                        op_a,
                        op_b,
                        (300, 260, 280),
                        [1, 1, 1],
                        host,
                        beta,
                        budget,
                        &mut rng,
                    );
                    depths[t.depth] += 1;
                    multi += ((300 + t.tm - 1) / t.tm
                        * ((260 + t.tn - 1) / t.tn)
                        * ((280 + t.tk - 1) / t.tk)
                        > 4) as usize;
                }
            }
        }
    }
    assert!(
        multi > 20 && depths[2] > 0 && depths[3] > 0,
        "{multi} {depths:?}"
    );
    // odd shapes, k = 0, batches with a broadcast operand
    for host in hosts {
        for (mnk, batch) in [
            ((129, 1, 257), [1, 1, 1]),
            ((1, 130, 5), [1, 1, 1]),
            ((6, 7, 0), [1, 1, 1]),
            ((200, 150, 170), [2, 0, 2]),
            ((200, 150, 170), [0, 3, 3]),
        ] {
            for beta in [0.0, 1.0] {
                check(
                    Trans::N,
                    Trans::T,
                    mnk,
                    batch,
                    host,
                    beta,
                    8 * (150 << 10),
                    &mut rng,
                );
            }
        }
    }
}
