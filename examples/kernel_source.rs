//! Prints the source NVRTC compiles for one kernel module, as
//! `fusekit::testing::modules()` gives it (the launcher's #defines, then the kernel
//! file): `cargo run --release --example kernel_source -- gaussian_f32`.
//! tests/cuda_emu/run.sh compiles that source on the host.

fn main() {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: kernel_source MODULE (one of fusekit::testing::modules())");
        std::process::exit(2);
    };
    match fusekit::testing::modules().find(|(n, _)| *n == name) {
        Some((_, source)) => print!("{}", source()),
        None => {
            eprintln!("no kernel module named {name}");
            std::process::exit(1);
        }
    }
}
