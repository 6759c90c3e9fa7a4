//! Prints the source NVRTC compiles for one kernel module, as
//! `fusekit::testing::modules()` gives it (the launcher's #defines, then the kernel
//! file): `cargo run --release --example kernel_source -- gaussian_f32`.
//! tests/cuda_emu/run.sh compiles that source on the host.
//!
//! `--expanded MODULE`: the same with the library's own headers inlined, as
//! `fusekit::testing::compile` hands it to NVRTC. `--list`: the name of every
//! module, one a line (scripts/ptxas_report.py uses both).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!(
            "usage: kernel_source [--expanded] MODULE (one of fusekit::testing::modules()) | kernel_source --list"
        );
        std::process::exit(2);
    };
    let (expanded, name) = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--list"] => {
            for (name, _) in fusekit::testing::modules() {
                println!("{name}");
            }
            return;
        }
        ["--expanded", name] => (true, name),
        [name] if !name.starts_with("--") => (false, name),
        _ => usage(),
    };
    match fusekit::testing::modules().find(|(n, _)| *n == name) {
        Some((_, source)) if expanded => {
            print!("{}", fusekit::testing::expand_source(&source()))
        }
        Some((_, source)) => print!("{}", source()),
        None => {
            eprintln!("no kernel module named {name}");
            std::process::exit(1);
        }
    }
}
