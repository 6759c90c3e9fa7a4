//! GPU benchmark of the elementwise family through the C ABI: kernel time (median
//! of CUDA-event timings), achieved bandwidth against the measured device copy
//! bandwidth, and the host overhead of one small op call.
//!
//! `cargo bench --bench elementwise` (prints a table; `--json PATH` also writes the
//! rows). Skips with a message when no CUDA device is present. PyTorch's rows are
//! measured by `benches/bench_torch.py` in the same GPU run (scripts/gpu_suite.sh).

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::Instant;

use cudarc::driver::{result, sys};
use fusekit::abi::core::*;
use fusekit::abi::elementwise::*;
use fusekit::abi::{fk_buffer, fk_context, fk_scalar, fk_stream};
use fusekit::context::FK_DEVICE_CUDA;
use fusekit::dtype::*;
use fusekit::error::FK_OK;

fn check(s: i32, what: &str) {
    if s != FK_OK {
        let msg = unsafe { std::ffi::CStr::from_ptr(fk_last_error_message()) };
        panic!("{what}: status {s}: {}", msg.to_string_lossy());
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

unsafe fn buffer(
    ctx: *mut fk_context,
    dtype: i32,
    shape: &[i64],
    s: *mut fk_stream,
    rng: &mut Rng,
) -> *mut fk_buffer {
    let mut b = null_mut();
    check(
        unsafe { fk_buffer_create(ctx, dtype, shape.len() as i32, shape.as_ptr(), s, &mut b) },
        "create",
    );
    let mut bytes = 0usize;
    unsafe { fk_buffer_nbytes(b, &mut bytes) };
    // random values (never zeros): fill as f32/f64 words
    let host: Vec<u8> = match dtype {
        FK_DTYPE_F64 | FK_DTYPE_C128 => (0..bytes / 8)
            .flat_map(|_| (rng.next() + 2.0).to_ne_bytes())
            .collect(),
        _ => (0..bytes / 4)
            .flat_map(|_| ((rng.next() + 2.0) as f32).to_ne_bytes())
            .collect(),
    };
    check(
        unsafe { fk_buffer_copy_from_host(b, host.as_ptr() as *const c_void, bytes, s) },
        "h2d",
    );
    b
}

fn arch_of(ctx: *mut fk_context) -> String {
    let (mut a, mut b) = (0, 0);
    unsafe { fk_context_compute_capability(ctx, &mut a, &mut b) };
    format!("{a}{b}")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median milliseconds of `f` over `reps` runs, timed with CUDA events on `raw`.
fn time_events(raw: sys::CUstream, reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
    let (e0, e1) = (
        result::event::create(flags).unwrap(),
        result::event::create(flags).unwrap(),
    );
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        unsafe { result::event::record(e0, raw).unwrap() };
        f();
        unsafe { result::event::record(e1, raw).unwrap() };
        unsafe { result::event::synchronize(e1).unwrap() };
        ts.push(unsafe { result::event::elapsed(e0, e1).unwrap() } as f64);
    }
    median(ts)
}

fn main() {
    let json_path = std::env::args().skip_while(|a| a != "--json").nth(1);
    let mut n = 0i32;
    unsafe { fk_device_count(&mut n) };
    if n == 0 {
        println!("SKIPPED: no CUDA device");
        return;
    }
    let mut ctx = null_mut();
    check(
        unsafe { fk_context_create(FK_ABI_VERSION, FK_DEVICE_CUDA, 0, &mut ctx) },
        "context",
    );
    let mut name = [0i8; 256];
    unsafe { fk_context_name(ctx, name.as_mut_ptr(), 256, null_mut()) };
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let t = Instant::now();
    check(unsafe { fk_context_warmup(ctx) }, "warmup");
    println!(
        "device: {name}; warmup (compile or cache load of every module): {:.2}s",
        t.elapsed().as_secs_f64()
    );
    let mut stream = null_mut();
    check(unsafe { fk_stream_create(ctx, &mut stream) }, "stream");
    let mut raw: *mut c_void = null_mut();
    unsafe { fk_stream_handle(stream, &mut raw) };
    let raw = raw as sys::CUstream;
    let mut rng = Rng(0x9e3779b97f4a7c15);

    // measured copy bandwidth (bytes read + written)
    let n_copy: i64 = 1 << 28;
    let src = unsafe { buffer(ctx, FK_DTYPE_F32, &[n_copy], stream, &mut rng) };
    let dst = unsafe { buffer(ctx, FK_DTYPE_F32, &[n_copy], stream, &mut rng) };
    let (mut ps, mut pd): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
    unsafe { fk_buffer_data(src, &mut ps) };
    unsafe { fk_buffer_data(dst, &mut pd) };
    let copy_bytes = (n_copy * 4) as usize;
    let ms = time_events(raw, 20, || unsafe {
        sys::cuMemcpyDtoDAsync_v2(pd as u64, ps as u64, copy_bytes, raw)
            .result()
            .unwrap();
    });
    let copy_bw = 2.0 * copy_bytes as f64 / (ms * 1e-3);
    println!(
        "device-to-device copy: {:.3} ms for {} MiB -> {:.0} GB/s (read+write)",
        ms,
        copy_bytes >> 20,
        copy_bw / 1e9
    );
    unsafe { fk_buffer_destroy(src) };
    unsafe { fk_buffer_destroy(dst) };

    let one = fk_scalar { re: 1.0, im: 0.0 };
    let nel: i64 = 1 << 26;
    let rows: i64 = 1 << 13;
    // (label, dtype, a shape, b shape, out shape, op)
    type Op = unsafe extern "C" fn(
        *const fk_buffer,
        *const fk_buffer,
        *mut fk_buffer,
        *const fk_stream,
    ) -> i32;
    unsafe extern "C" fn axpby_op(
        a: *const fk_buffer,
        b: *const fk_buffer,
        o: *mut fk_buffer,
        s: *const fk_stream,
    ) -> i32 {
        unsafe {
            fk_axpby(
                fk_scalar { re: 0.5, im: 0.0 },
                a,
                fk_scalar { re: -1.5, im: 0.0 },
                b,
                o,
                s,
            )
        }
    }
    let _ = one;
    let cases: Vec<(&str, i32, Vec<i64>, Vec<i64>, Vec<i64>, Op)> = vec![
        (
            "add f32",
            FK_DTYPE_F32,
            vec![nel],
            vec![nel],
            vec![nel],
            fk_add,
        ),
        (
            "add f64",
            FK_DTYPE_F64,
            vec![nel],
            vec![nel],
            vec![nel],
            fk_add,
        ),
        (
            "mul c128",
            FK_DTYPE_C128,
            vec![nel],
            vec![nel],
            vec![nel],
            fk_mul,
        ),
        (
            "axpby f32",
            FK_DTYPE_F32,
            vec![nel],
            vec![nel],
            vec![nel],
            axpby_op,
        ),
        (
            "add f32 broadcast [8192,8192]+[8192]",
            FK_DTYPE_F32,
            vec![rows, nel / rows],
            vec![nel / rows],
            vec![rows, nel / rows],
            fk_add,
        ),
        (
            "add bf16",
            FK_DTYPE_BF16,
            vec![nel],
            vec![nel],
            vec![nel],
            fk_add,
        ),
    ];
    let mut out_rows = Vec::new();
    println!(
        "\n{:<40} {:>10} {:>12} {:>10}",
        "case", "ms", "GB/s", "% of copy"
    );
    for (label, dtype, sa, sb, so, op) in cases {
        let a = unsafe { buffer(ctx, dtype, &sa, stream, &mut rng) };
        let b = unsafe { buffer(ctx, dtype, &sb, stream, &mut rng) };
        let o = unsafe { buffer(ctx, dtype, &so, stream, &mut rng) };
        let (mut ba, mut bb, mut bo) = (0usize, 0usize, 0usize);
        unsafe {
            fk_buffer_nbytes(a, &mut ba);
            fk_buffer_nbytes(b, &mut bb);
            fk_buffer_nbytes(o, &mut bo);
        }
        let bytes = (ba + bb + bo) as f64;
        let ms = time_events(raw, 50, || check(unsafe { op(a, b, o, stream) }, label));
        let bw = bytes / (ms * 1e-3);
        let floor_ms = bytes / copy_bw * 1e3;
        println!(
            "{label:<40} {ms:>10.4} {:>12.0} {:>9.1}%",
            bw / 1e9,
            100.0 * bw / copy_bw
        );
        out_rows.push(format!(
            "{{\"case\":\"{label}\",\"ms\":{ms:.5},\"bytes\":{bytes},\"gbps\":{:.1},\"floor_ms\":{floor_ms:.5},\"copy_gbps\":{:.1}}}",
            bw / 1e9,
            copy_bw / 1e9
        ));
        unsafe {
            fk_buffer_destroy(a);
            fk_buffer_destroy(b);
            fk_buffer_destroy(o);
        }
    }

    // host overhead of one small op through the C ABI (submission only; the GPU
    // drains between batches so the launch queue never fills)
    let a = unsafe { buffer(ctx, FK_DTYPE_F32, &[256], stream, &mut rng) };
    let b = unsafe { buffer(ctx, FK_DTYPE_F32, &[256], stream, &mut rng) };
    let o = unsafe { buffer(ctx, FK_DTYPE_F32, &[256], stream, &mut rng) };
    let mut per_call = Vec::new();
    for _ in 0..50 {
        check(unsafe { fk_stream_synchronize(stream) }, "sync");
        let t = Instant::now();
        for _ in 0..200 {
            check(unsafe { fk_add(a, b, o, stream) }, "small add");
        }
        per_call.push(t.elapsed().as_secs_f64() * 1e6 / 200.0);
    }
    let us = median(per_call);
    // the driver's own floor: cuLaunchKernel of an empty kernel with a parameter
    // struct of the same size as the elementwise kernels' (416 bytes)
    let src = "struct P { long long w[52]; }; extern \"C\" __global__ void noop(const P p) { if (p.w[0] == 1234567) asm volatile(\"trap;\"); }";
    let image = fusekit::testing::compile("noop", src, &format!("sm_{}", arch_of(ctx))).unwrap();
    let module = unsafe { result::module::load_data(image.as_ptr() as *const _) }.unwrap();
    let f =
        unsafe { result::module::get_function(module, std::ffi::CString::new("noop").unwrap()) }
            .unwrap();
    let mut param = [0i64; 52];
    let mut per_launch = Vec::new();
    for _ in 0..50 {
        check(unsafe { fk_stream_synchronize(stream) }, "sync");
        let t = Instant::now();
        for _ in 0..200 {
            let mut args = [param.as_mut_ptr() as *mut c_void];
            unsafe { result::launch_kernel(f, (1, 1, 1), (256, 1, 1), 0, raw, &mut args) }.unwrap();
        }
        per_launch.push(t.elapsed().as_secs_f64() * 1e6 / 200.0);
    }
    let floor_us = median(per_launch);
    println!(
        "\nhost overhead of one small fk_add call (256 f32, median of 50 batches of 200): {us:.2} us"
    );
    println!(
        "driver floor: cuLaunchKernel of an empty kernel with a 416-byte parameter: {floor_us:.2} us (fusekit adds {:.2} us)",
        us - floor_us
    );
    out_rows.push(format!(
        "{{\"case\":\"host overhead small fk_add\",\"us\":{us:.3},\"driver_floor_us\":{floor_us:.3}}}"
    ));
    unsafe {
        fk_buffer_destroy(a);
        fk_buffer_destroy(b);
        fk_buffer_destroy(o);
        fk_stream_destroy(stream);
        fk_context_destroy(ctx);
    }
    if let Some(p) = json_path {
        std::fs::write(&p, out_rows.join("\n") + "\n").unwrap();
    }
}
