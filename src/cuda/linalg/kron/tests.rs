use super::*;
use crate::addr::Addr;
use crate::cuda::emu_build::Build;
use crate::cuda::launch::kernel_suffix;
use crate::cuda::linalg::source;
use crate::dtype::ALL_DTYPES;

/// A stand-in address: these plans only choose launches (their alignment is read,
/// never their memory; the emulation gets the residues mod 64).
fn stand_in(a: usize) -> Option<Addr> {
    // SAFETY: never dereferenced.
    unsafe { Addr::from_raw(a as u64) }
}

/// A plan with fake pointers at `*_mod` modulo 64 (only their alignment matters
/// to the launcher) and strides from the named layouts.
#[allow(clippy::too_many_arguments)]
fn plan(
    dtype: DType,
    batch: i64,
    (a_batched, m, n): (bool, i64, i64),
    (b_batched, p, q): (bool, i64, i64),
    (la, lb): (&str, &str),
    (a_mod, b_mod, out_mod): (usize, usize, usize),
) -> KronPlan {
    let strides = |batched: bool, r: i64, c: i64, l: &str| -> [i64; 3] {
        let s = match l {
            "contiguous" => [r * c, c, 1],
            "transposed" => [r * c, 1, r],
            "reversed" => [-(r * c), -c, -1],
            "every-other" => [2 * r * c, 2 * c, 2],
            _ => unreachable!(),
        };
        [if batched { s[0] } else { 0 }, s[1], s[2]]
    };
    KronPlan {
        dtype,
        batch,
        m,
        n,
        p,
        q,
        a: stand_in(0x10000 + a_mod),
        sa: strides(a_batched, m, n, la),
        b: stand_in(0x20000 + b_mod),
        sb: strides(b_batched, p, q, lb),
        out: stand_in(0x40000 + out_mod),
    }
}

fn check_invariants(p: &KronPlan, l: &KronLaunch, what: &str) {
    let a = &l.args;
    let es = p.dtype.size() as i64;
    // kron_<store>_<dtype>, the store w<W> or split
    let store = l.name.split('_').nth(1).unwrap_or_default();
    let w = store.strip_prefix('w').and_then(|x| x.parse::<i64>().ok());
    let (w, split) = match w {
        Some(w) => (w, false),
        None => (1, true),
    };
    assert!((store == "split") == split, "{what}: {}", l.name);
    assert!(w * es <= 16, "{what}");
    assert_eq!(a.cols % w, 0, "{what}");
    assert_eq!(a.units, a.cols / w, "{what}");
    if split {
        assert!(
            p.dtype.is_complex() && raw(p.out) as i64 % es != 0,
            "{what}"
        );
    } else {
        assert_eq!(raw(p.out) as i64 % (w * es), 0, "{what}: {}", l.name);
    }
    let (bx, by) = (l.block.0 as i64, l.block.1 as i64);
    assert!(
        bx * by <= KRON_THREADS && bx >= 1 && by >= 1,
        "{what}: {:?}",
        l.block
    );
    assert_eq!(by, a.bs as i64 * a.il as i64, "{what}");
    assert!(
        l.grid.0 as i64 * bx >= a.units,
        "{what}: every unit has a thread"
    );
    assert!(a.bs as i64 * a.s_blocks >= p.p, "{what}: every row of b");
    assert!(
        a.rows * a.il as i64 * a.i_chunks >= p.m,
        "{what}: every row of a"
    );
    assert_eq!(a.tasks, p.batch * a.i_chunks * a.s_blocks, "{what}");
    assert!(l.grid.1 >= 1 && l.grid.1 <= 65535, "{what}");
    assert_eq!(a.uniform != 0, p.q % w == 0, "{what}");
}

#[test]
fn kron_launch_shapes() {
    /// (batched, rows, cols) of an operand
    type Side = (bool, i64, i64);
    // (dtype, batch, a, b, (a, b, out) modulo 64, the kernel chosen), contiguous operands
    let cases: [(DType, i64, Side, Side, (usize, usize, usize), &str); 4] = [
        // the benchmark rows: 16-byte stores
        (
            DType::F32,
            1,
            (false, 64, 64),
            (false, 64, 64),
            (0, 0, 0),
            "kron_w4_f32",
        ),
        (
            DType::F32,
            32,
            (true, 16, 16),
            (true, 16, 16),
            (0, 0, 0),
            "kron_w4_f32",
        ),
        // misaligned output rows: narrower stores; complex aligned to components: split
        (
            DType::F16,
            1,
            (false, 3, 5),
            (false, 2, 4),
            (0, 0, 4),
            "kron_w2_f16",
        ),
        (
            DType::C128,
            1,
            (false, 3, 5),
            (false, 2, 4),
            (0, 0, 8),
            "kron_split_c128",
        ),
    ];
    let contiguous = ("contiguous", "contiguous");
    let launches: Vec<KronLaunch> = cases
        .iter()
        .map(|&(dtype, batch, a, b, mods, name)| {
            let p = plan(dtype, batch, a, b, contiguous, mods);
            let l = kron_config(&p, 132).unwrap();
            check_invariants(&p, &l, &format!("{p:?}"));
            assert_eq!(l.name, name, "{p:?}");
            l
        })
        .collect();
    // enough blocks for an H100 (132 SMs)
    let l = &launches[0];
    assert!(l.grid.0 as u64 * l.grid.1 as u64 >= 132 * 8, "{l:?}");
    assert_eq!(launches[1].block, (64, 4, 1));
    // a pointer not aligned to its components is refused, not faulted on
    let p = plan(
        DType::F32,
        1,
        (false, 3, 5),
        (false, 2, 4),
        contiguous,
        (2, 0, 0),
    );
    let e = kron_config(&p, 132).unwrap_err();
    assert!(e.message.contains("a's data pointer"), "{}", e.message);
}

/// The shapes, layouts and alignments the emulator runs (and whose launch
/// invariants are checked here).
fn emu_cases() -> Vec<(KronPlan, KronLaunch)> {
    /// (batched, rows, cols) of an operand
    type Side = (bool, i64, i64);
    let shapes: &[(i64, Side, Side)] = &[
        (1, (false, 2, 3), (false, 4, 5)),
        (3, (true, 7, 5), (true, 4, 8)),
        (2, (false, 5, 3), (true, 6, 16)),
        (3, (true, 1, 2), (false, 3, 9)),
        (1, (false, 33, 1), (false, 17, 1)),
        (1, (false, 3, 3), (false, 5, 7)),
        (2, (true, 4, 6), (true, 3, 5)),
        (1, (false, 5, 9), (false, 4, 1)),
        (1, (false, 3, 8), (false, 2, 3)),
        (1, (false, 2, 3), (false, 300, 2)),
        (1, (false, 2, 40), (false, 3, 50)),
        (2, (true, 9, 4), (true, 11, 4)),
        (4, (true, 16, 16), (true, 16, 16)),
        // many rows of a per lane with several lanes (il > 1, rows > 1)
        (1, (false, 600, 1), (false, 3, 2)),
        (2, (true, 200, 2), (false, 2, 3)),
    ];
    let mut v = Vec::new();
    for dtype in ALL_DTYPES {
        let es = dtype.size();
        let mut out_mods = vec![0, es, 8];
        if dtype.is_complex() {
            out_mods.push(es / 2);
        }
        out_mods.sort();
        out_mods.dedup();
        for &(batch, a, b) in shapes {
            for layouts in [
                ("contiguous", "contiguous"),
                ("transposed", "reversed"),
                ("every-other", "transposed"),
            ] {
                for &om in &out_mods {
                    for sm in [1, 132] {
                        let p = plan(dtype, batch, a, b, layouts, (es, 0, om));
                        let l = kron_config(&p, sm).unwrap();
                        check_invariants(&p, &l, &format!("{p:?}"));
                        v.push((p, l));
                    }
                }
            }
        }
    }
    // the benchmark's shape, and more tasks than one grid holds (grid-stride in y)
    for (batch, a, b) in [
        (1, (false, 64, 64), (false, 64, 64)),
        (70000, (true, 1, 1), (true, 1, 1)),
    ] {
        let p = plan(
            DType::F32,
            batch,
            a,
            b,
            ("contiguous", "contiguous"),
            (0, 0, 0),
        );
        let l = kron_config(&p, 132).unwrap();
        check_invariants(&p, &l, &format!("{p:?}"));
        v.push((p, l));
    }
    assert!(v.last().unwrap().1.args.tasks > 65535);
    v
}

#[test]
fn kron_launch_invariants() {
    assert!(emu_cases().len() > 500);
}

/// kernels/linalg.cu's Kronecker kernels, compiled by the host C++ compiler
/// against tests/cuda_emu (emulated threads), run with the launch this module
/// chooses for every dtype, odd widths, batches, broadcasts, strided inputs and
/// outputs aligned to 16 bytes, to the element, or (complex) to a component;
/// compared bit for bit with the direct product. Skipped without g++
/// (`CXX` overrides; `FK_KRON_EMU_DIR` keeps the build and the cases).
#[test]
fn kron_kernel_in_the_cpu_emulator() {
    use std::process::Command;
    let Some(emu) = (Build {
        name: "kron_emu",
        keep_env: "FK_KRON_EMU_DIR",
        file: "linalg.cu",
        source: source(),
        emu_dir: "tests/cuda_emu",
        common: "tests/cuda_emu/linalg_common.cuh",
        std: "c++20",
        sources: &["tests/cuda_emu/kron_emu.cpp"],
    })
    .run() else {
        return;
    };
    let mut lines = String::new();
    for (p, l) in emu_cases() {
        let a = &l.args;
        lines.push_str(&format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}\n",
            l.name,
            kernel_suffix(p.dtype),
            p.batch,
            p.m,
            p.n,
            p.p,
            p.q,
            p.sa[0],
            p.sa[1],
            p.sa[2],
            p.sb[0],
            p.sb[1],
            p.sb[2],
            raw(p.a) % 64,
            raw(p.b) % 64,
            raw(p.out) % 64,
            a.cols,
            a.units,
            a.rows,
            a.s_blocks,
            a.i_chunks,
            a.tasks,
            a.bs,
            a.il,
            a.uniform,
            a.small,
            l.grid.0,
            l.grid.1,
            l.block.0,
            l.block.1
        ));
    }
    let cases = emu.dir.join("cases.txt");
    std::fs::write(&cases, lines).unwrap();
    let run = Command::new(&emu.exe).arg(&cases).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "emulated Kronecker kernels:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    println!("{}", stdout.lines().last().unwrap_or(""));
}
