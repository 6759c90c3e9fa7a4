use std::process::Command;

use half::{bf16, f16};

use super::*;
use crate::cuda::emu_build::Build;
use crate::plan::linalg::Activation;
use crate::plan::mlp::{SavedLayout, layer_acts};
use crate::testing::Lcg;

const H100: (i32, i32) = (9, 0);
const SMEM: usize = 227 << 10;

#[test]
fn the_fused_path_is_a_pure_function_of_widths_dtype_and_device() {
    let narrow = [32, 64, 64, 64, 64, 16];
    let f = fused_shape(&narrow, DType::BF16, H100, SMEM).unwrap();
    assert_eq!(INSTANCES[f.instance], 64);
    assert_eq!(fused_shape(&narrow, DType::BF16, H100, SMEM), Some(f));
    assert_eq!(
        fused_shape(&narrow, DType::F16, H100, SMEM).map(|f| f.instance),
        Some(2)
    );
    // f32 (and TF32), pre-Ampere devices, too wide, too many layers: the general path
    assert_eq!(fused_shape(&narrow, DType::F32, H100, SMEM), None);
    assert_eq!(fused_shape(&narrow, DType::BF16, (7, 5), SMEM), None);
    assert_eq!(fused_shape(&[32, 129, 16], DType::BF16, H100, SMEM), None);
    assert_eq!(fused_shape(&[32, 256, 16], DType::F16, H100, SMEM), None);
    assert_eq!(fused_shape(&[0, 16], DType::F16, H100, SMEM), None);
    assert_eq!(
        fused_shape(&[16; MAX_LAYERS + 2], DType::F16, H100, SMEM),
        None
    );
    assert!(fused_shape(&[16; MAX_LAYERS + 1], DType::F16, H100, SMEM).is_some());
    // the widest padded layer picks the instance
    assert_eq!(
        fused_shape(&[3, 16, 1], DType::F16, H100, SMEM).map(|f| f.instance),
        Some(0)
    );
    assert_eq!(
        fused_shape(&[3, 17, 1], DType::F16, H100, SMEM).map(|f| f.instance),
        Some(1)
    );
    assert_eq!(
        fused_shape(&[20, 65, 7], DType::F16, H100, SMEM).map(|f| f.instance),
        Some(3)
    );
    // shared memory: the staged weights must fit the device's opt-in limit
    // 5 layers of 128 x 128 fit an H100's 227 KB, 6 do not (the backward: the
    // transposed weights and each of the 16 warps' bias-gradient accumulators)
    assert!(fused_shape(&[128; 6], DType::BF16, H100, SMEM).is_some());
    assert_eq!(fused_shape(&[128; 7], DType::BF16, H100, SMEM), None);
    let deep = [128; 7];
    let need = fused_shape(&deep, DType::BF16, H100, usize::MAX).unwrap();
    assert!(need.fwd_smem > 96 << 10 && need.fwd_smem <= SMEM);
    assert_eq!(fused_shape(&deep, DType::BF16, H100, 96 << 10), None);
    assert_eq!(
        fused_shape(&deep, DType::BF16, H100, need.fwd_smem.max(need.bwd_smem)),
        Some(need)
    );
    // [W, W + 8] per layer in the dtype (W the instance's width), then W f32
    // biases per layer
    let two = fused_shape(&[3, 16, 1], DType::F16, H100, SMEM).unwrap();
    assert_eq!(two.fwd_smem, (16 * 24 + 16 * 24) * 2 + (16 + 16) * 4);
    let five = fused_shape(&narrow, DType::BF16, H100, SMEM).unwrap();
    assert_eq!(five.fwd_smem, 5 * 64 * 72 * 2 + 5 * 64 * 4);
}

/// One network for the emulator: shapes, activations, which biases and gradients,
/// the grid.
struct Case {
    dtype: DType,
    widths: Vec<i64>,
    rows: i64,
    hidden: Activation,
    out: Activation,
    bias: Vec<bool>,
    dx: bool,
    dw: Vec<bool>,
    db: Vec<bool>,
    grid: u32,
}

/// Byte regions of a case's operands in one arena (offsets, 256-aligned).
struct Regions {
    x: usize,
    w: Vec<usize>,
    b: Vec<Option<usize>>,
    y: usize,
    saved: usize,
    dy: usize,
    dx: usize,
    dw: Vec<usize>,
    db: Vec<usize>,
    scratch: usize,
    bytes: usize,
    layout: SavedLayout,
}

fn regions(c: &Case, scratch_bytes: usize) -> Regions {
    let es = c.dtype.size();
    let mut at = 0usize;
    let mut take = |bytes: usize| {
        let o = at;
        at = (at + bytes.max(1)).next_multiple_of(256);
        o
    };
    let l = c.widths.len() - 1;
    let (k0, nl) = (c.widths[0] as usize, c.widths[l] as usize);
    let rows = c.rows as usize;
    let layout =
        SavedLayout::new(&c.widths, c.rows, c.dtype, &layer_acts(l, c.hidden, c.out)).unwrap();
    let x = take(rows * k0 * es);
    let w: Vec<usize> = (0..l)
        .map(|i| take((c.widths[i] * c.widths[i + 1]) as usize * es))
        .collect();
    let b = (0..l)
        .map(|i| c.bias[i].then(|| take(c.widths[i + 1] as usize * es)))
        .collect();
    let y = take(rows * nl * es);
    let saved = take(layout.bytes);
    let dy = take(rows * nl * es);
    let dx = take(rows * k0 * es);
    let dw = (0..l)
        .map(|i| take((c.widths[i] * c.widths[i + 1]) as usize * es))
        .collect();
    let db = (0..l)
        .map(|i| take(c.widths[i + 1] as usize * es))
        .collect();
    let scratch = take(scratch_bytes);
    Regions {
        x,
        w,
        b,
        y,
        saved,
        dy,
        dx,
        dw,
        db,
        scratch,
        bytes: at,
        layout,
    }
}

/// 256-aligned host memory.
struct Arena {
    mem: Vec<u8>,
    start: usize,
}

impl Arena {
    fn new(bytes: usize) -> Arena {
        let mem = vec![0xFFu8; bytes + 256];
        let start = (256 - mem.as_ptr() as usize % 256) % 256;
        Arena { mem, start }
    }
    fn bytes(&mut self) -> &mut [u8] {
        let s = self.start;
        let n = self.mem.len() - 256;
        &mut self.mem[s..s + n]
    }
    fn base(&self) -> usize {
        self.mem.as_ptr() as usize + self.start
    }
    fn at(&self, off: usize) -> Option<Addr> {
        // SAFETY: inside this arena, which outlives every plan made of it.
        unsafe { Addr::from_raw((self.base() + off) as u64) }
    }
    fn put(&mut self, off: usize, dtype: DType, v: &[f32]) {
        let b = self.bytes();
        for (i, &x) in v.iter().enumerate() {
            let bits = match dtype {
                DType::F16 => f16::from_f32(x).to_bits(),
                _ => bf16::from_f32(x).to_bits(),
            };
            b[off + 2 * i..off + 2 * i + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }
    fn get(&mut self, off: usize, dtype: DType, n: usize) -> Vec<f64> {
        let b = self.bytes();
        (0..n)
            .map(|i| {
                let bits = u16::from_le_bytes([b[off + 2 * i], b[off + 2 * i + 1]]);
                match dtype {
                    DType::F16 => f16::from_bits(bits).to_f64(),
                    _ => bf16::from_bits(bits).to_f64(),
                }
            })
            .collect()
    }
}

/// The forward and backward plans of a case over `a`'s memory.
fn plans(c: &Case, r: &Regions, a: &Arena) -> (MlpPlan, MlpPlan) {
    let l = c.widths.len() - 1;
    let acts = layer_acts(l, c.hidden, c.out);
    let layers: Vec<Layer> = (0..l)
        .map(|i| {
            let s = r.layout.layers[i];
            Layer {
                k: c.widths[i],
                n: c.widths[i + 1],
                act: acts[i],
                w: a.at(r.w[i]),
                bias: r.b[i].and_then(|o| a.at(o)),
                aux: s.aux.and_then(|o| a.at(r.saved + o as usize)),
                aux_ld: s.aux_ld,
                hidden: s.hidden.and_then(|o| a.at(r.saved + o as usize)),
                dw: None,
                db: None,
            }
        })
        .collect();
    let fwd = MlpPlan {
        dtype: c.dtype,
        rows: c.rows,
        allow_tf32: false,
        layers: layers.clone(),
        x: a.at(r.x),
        y: a.at(r.y),
        dy: None,
        dx: None,
        workspace: None,
    };
    let mut bwd = MlpPlan {
        y: None,
        dy: a.at(r.dy),
        dx: if c.dx { a.at(r.dx) } else { None },
        ..fwd.clone()
    };
    for (i, layer) in bwd.layers.iter_mut().enumerate() {
        layer.bias = None;
        layer.dw = if c.dw[i] { a.at(r.dw[i]) } else { None };
        layer.db = if c.db[i] { a.at(r.db[i]) } else { None };
    }
    (fwd, bwd)
}

/// ‖got − want‖ / ‖want‖ (NaN anywhere: infinite).
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().chain(want).any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den.max(1e-300)).sqrt()
}

/// `n` values uniform in `[-scale, scale)`.
fn random_vec(rng: &mut Lcg, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.unit_f32() * 2.0 - 1.0) * scale)
        .collect()
}

fn cases() -> Vec<Case> {
    use Activation::*;
    let all = |l: usize| vec![true; l];
    vec![
        // the neural-field network of the benchmarks, at a few rows
        Case {
            dtype: DType::BF16,
            widths: vec![32, 64, 64, 64, 64, 16],
            rows: 77,
            hidden: Relu,
            out: None,
            bias: all(5),
            dx: true,
            dw: all(5),
            db: all(5),
            grid: 2,
        },
        // widths not multiples of 16 (padded), the tanh GELU, a ReLU output, a
        // missing bias, no dx
        Case {
            dtype: DType::F16,
            widths: vec![3, 16, 16, 1],
            rows: 45,
            hidden: GeluTanh,
            out: Relu,
            bias: vec![true, false, true],
            dx: false,
            dw: all(3),
            db: vec![true, false, true],
            grid: 1,
        },
        // the widest instance (one row tile per warp), exact GELU, more blocks than
        // tiles (blocks without rows give zero partials)
        Case {
            dtype: DType::BF16,
            widths: vec![128, 128, 100],
            rows: 17,
            hidden: GeluErf,
            out: GeluTanh,
            bias: all(2),
            dx: true,
            dw: all(2),
            db: all(2),
            grid: 3,
        },
        // dx alone from a single row, no activation, no bias
        Case {
            dtype: DType::F16,
            widths: vec![20, 48, 32],
            rows: 1,
            hidden: None,
            out: None,
            bias: vec![false, false],
            dx: true,
            dw: vec![false, false],
            db: vec![false, false],
            grid: 1,
        },
        // only the top layer's weight gradient: the chain stops there
        Case {
            dtype: DType::BF16,
            widths: vec![64, 64, 64],
            rows: 300,
            hidden: Relu,
            out: None,
            bias: all(2),
            dx: false,
            dw: vec![false, true],
            db: vec![false, false],
            grid: 2,
        },
        // odd widths, the widest instance, the exact GELU on the output
        Case {
            dtype: DType::F16,
            widths: vec![17, 33, 65],
            rows: 70,
            hidden: Relu,
            out: GeluErf,
            bias: all(2),
            dx: true,
            dw: all(2),
            db: all(2),
            grid: 2,
        },
    ]
}

/// Writes the case file the emulator reads: the arena, then the launches.
fn case_file(a: &mut Arena, launches: &[(&str, u32, usize, u32, &MfArgs)]) -> Vec<u8> {
    let mut f = Vec::new();
    let base = a.base() as u64;
    let bytes = a.bytes().to_vec();
    f.extend(base.to_le_bytes());
    f.extend((bytes.len() as u64).to_le_bytes());
    f.extend(bytes);
    f.extend((launches.len() as u32).to_le_bytes());
    for &(name, grid, smem, seed, args) in launches {
        f.extend((name.len() as u32).to_le_bytes());
        f.extend(name.as_bytes());
        f.extend(grid.to_le_bytes());
        f.extend((smem as u32).to_le_bytes());
        f.extend(seed.to_le_bytes());
        // SAFETY: MfArgs is repr(C) plain data; its bytes are what the kernel reads.
        f.extend(unsafe {
            std::slice::from_raw_parts(
                args as *const MfArgs as *const u8,
                std::mem::size_of::<MfArgs>(),
            )
        });
    }
    f
}

/// The fused kernels on the CPU emulator (tests/emu: every CUDA thread a coroutine,
/// barriers in a seeded random order, mma.sync and the shuffles as warp
/// collectives), with the arguments `forward_args` / `backward_args` build, against
/// the CPU backend: y, the saved buffer (hidden outputs, ReLU mask bits, GELU
/// pre-activations), dx, the bias gradients from the per-block partials and the
/// weight gradients from the emulated dz; outputs poisoned (NaN) before, and two
/// scheduling seeds bit-identical. Skipped without g++ (`CXX` overrides;
/// `FK_MLP_EMU_DIR` keeps the build).
#[test]
fn mlp_fused_kernels_in_the_cpu_emulator() {
    let Some(emu_build) = (Build {
        name: "mlp_emu",
        keep_env: "FK_MLP_EMU_DIR",
        file: "mlp_fused.cu",
        source: source(),
        emu_dir: "tests/emu",
        common: "tests/emu/mlp_common.cuh",
        std: "c++17",
        sources: &["tests/emu/mlp_emu.cpp", "tests/emu/emu.cpp"],
    })
    .run() else {
        return;
    };
    let (dir, exe) = (&emu_build.dir, &emu_build.exe);
    let mut rng = Lcg(0x5eed);
    for (ci, c) in cases().iter().enumerate() {
        let what = format!(
            "case {ci} ({:?}, widths {:?}, rows {})",
            c.dtype, c.widths, c.rows
        );
        let f = fused_shape(&c.widths, c.dtype, H100, SMEM).unwrap();
        // the scratch's size from a plan over stand-in memory (sizes only)
        let probe = regions(c, 0);
        let probe_arena = Arena::new(probe.bytes);
        let s_bytes = bwd_scratch(&plans(c, &probe, &probe_arena).1, c.grid).bytes;
        let r = regions(c, s_bytes);
        let l = c.widths.len() - 1;
        let (m, k0, nl) = (c.rows as usize, c.widths[0] as usize, c.widths[l] as usize);
        let mut emu = Arena::new(r.bytes);
        emu.put(r.x, c.dtype, &random_vec(&mut rng, m * k0, 1.0));
        for i in 0..l {
            let (k, n) = (c.widths[i] as usize, c.widths[i + 1] as usize);
            emu.put(
                r.w[i],
                c.dtype,
                &random_vec(&mut rng, n * k, 1.5 / (k as f32).sqrt()),
            );
            if let Some(o) = r.b[i] {
                emu.put(o, c.dtype, &random_vec(&mut rng, n, 0.3));
            }
        }
        emu.put(r.dy, c.dtype, &random_vec(&mut rng, m * nl, 1.0));
        let mut cpu = Arena::new(r.bytes);
        let init = emu.bytes().to_vec();
        cpu.bytes().copy_from_slice(&init);
        // the CPU backend, the oracle
        let (cf, cb) = plans(c, &r, &cpu);
        crate::cpu::mlp::forward(&cf).unwrap();
        crate::cpu::mlp::backward(&cb).unwrap();
        // the emulated kernels, twice
        let (ef, eb) = plans(c, &r, &emu);
        let (fname, fsmem, fargs) = forward_args(f, &ef).unwrap();
        let (bname, sm) = backward_kernel(f, &eb).unwrap();
        let s = bwd_scratch(&eb, c.grid);
        let bargs = backward_args(f, &eb, &sm, &s, emu.at(r.scratch));
        let mut results = Vec::new();
        for seed in [1u32, 2] {
            let file = case_file(
                &mut emu,
                &[
                    (fname, c.grid, fsmem, seed, &fargs),
                    (bname, c.grid, sm.bytes, seed, &bargs),
                ],
            );
            let (cases_path, out_path) = (
                dir.join(format!("case{ci}.bin")),
                dir.join(format!("out{ci}_{seed}.bin")),
            );
            std::fs::write(&cases_path, file).unwrap();
            let run = Command::new(&exe)
                .arg(&cases_path)
                .arg(&out_path)
                .output()
                .unwrap();
            assert!(
                run.status.success(),
                "{what}: the emulator failed:\n{}{}",
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            );
            results.push(std::fs::read(&out_path).unwrap());
        }
        assert!(
            results[0] == results[1],
            "{what}: two scheduling seeds gave different results (a race)"
        );
        emu.bytes().copy_from_slice(&results[0]);
        let tol = if c.dtype == DType::F16 { 4e-3 } else { 2e-2 };
        let check = |name: &str, got: &[f64], want: &[f64]| {
            let e = rel_err(got, want);
            assert!(
                e <= tol,
                "{what}: {name} is {e:.2e} from the CPU backend's (tolerance {tol:.0e})"
            );
        };
        check(
            "y",
            &emu.get(r.y, c.dtype, m * nl),
            &cpu.get(r.y, c.dtype, m * nl),
        );
        for (i, sl) in r.layout.layers.iter().enumerate() {
            let n = c.widths[i + 1] as usize;
            if let Some(h) = sl.hidden {
                let o = r.saved + h as usize;
                check(
                    &format!("saved h_{}", i + 1),
                    &emu.get(o, c.dtype, m * n),
                    &cpu.get(o, c.dtype, m * n),
                );
            }
            let Some(aux) = sl.aux else { continue };
            let o = r.saved + aux as usize;
            let ld = sl.aux_ld as usize;
            if layer_acts(l, c.hidden, c.out)[i] == Activation::Relu {
                let pitch = ld / 8;
                let (e, w) = (
                    emu.bytes()[o..o + m * pitch].to_vec(),
                    cpu.bytes()[o..o + m * pitch].to_vec(),
                );
                let mut flips = 0;
                for row in 0..m {
                    for j in 0..ld {
                        let (eb, wb) = (
                            e[row * pitch + j / 8] >> (j % 8) & 1,
                            w[row * pitch + j / 8] >> (j % 8) & 1,
                        );
                        if j >= n {
                            assert_eq!(
                                eb, 0,
                                "{what}: layer {i}'s mask has padding bit {j} of row {row} set"
                            );
                        }
                        flips += (eb != wb) as usize;
                    }
                }
                assert!(
                    flips * 200 <= m * n,
                    "{what}: layer {i}'s ReLU mask differs in {flips} of {} bits",
                    m * n
                );
            } else {
                let z = |a: &mut Arena| -> Vec<f64> {
                    let all = a.get(o, c.dtype, m * ld);
                    (0..m)
                        .flat_map(|row| all[row * ld..row * ld + n].to_vec())
                        .collect()
                };
                check(
                    &format!("layer {i}'s saved pre-activation"),
                    &z(&mut emu),
                    &z(&mut cpu),
                );
            }
        }
        if c.dx {
            check(
                "dx",
                &emu.get(r.dx, c.dtype, m * k0),
                &cpu.get(r.dx, c.dtype, m * k0),
            );
        }
        for i in 0..l {
            let (k, n) = (c.widths[i] as usize, c.widths[i + 1] as usize);
            if c.db[i] {
                let base = r.scratch + s.partial as usize + s.partials[i] as usize * 4;
                let b = emu.bytes();
                let part = |j: usize| {
                    f32::from_le_bytes(b[base + 4 * j..base + 4 * j + 4].try_into().unwrap()) as f64
                };
                let got: Vec<f64> = (0..n)
                    .map(|col| (0..c.grid as usize).map(|blk| part(blk * n + col)).sum())
                    .collect();
                check(
                    &format!("db_{i} (from the partials)"),
                    &got,
                    &cpu.get(r.db[i], c.dtype, n),
                );
            }
            if c.dw[i] {
                let dz = emu.get(r.scratch + s.dz[i].unwrap() as usize, c.dtype, m * n);
                let h = if i == 0 {
                    emu.get(r.x, c.dtype, m * k)
                } else {
                    emu.get(
                        r.saved + r.layout.layers[i - 1].hidden.unwrap() as usize,
                        c.dtype,
                        m * k,
                    )
                };
                let got: Vec<f64> = (0..n * k)
                    .map(|e| {
                        (0..m)
                            .map(|row| dz[row * n + e / k] * h[row * k + e % k])
                            .sum()
                    })
                    .collect();
                check(
                    &format!("dW_{i} (from the emulated dz)"),
                    &got,
                    &cpu.get(r.dw[i], c.dtype, n * k),
                );
            }
        }
        println!("{what}: passed");
    }
}
