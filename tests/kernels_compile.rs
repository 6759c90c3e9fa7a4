//! Compiles every kernel module with NVRTC for sm_80 and sm_90, no GPU needed.
//!
//! Needs libnvrtc.so.13 and the CUDA headers (the `nvidia-cuda-nvrtc==13.0.88` and
//! `nvidia-cuda-runtime==13.0.96` wheels suffice; see scripts/test.sh). Without
//! them the test reports the skip, and fails if `FK_REQUIRE_NVRTC=1` (as in CI).
//!
//! `FK_PREBUILT_OUT=DIR` also writes every image into DIR, keyed as the kernel cache
//! keys them (`fusekit::testing::store_prebuilt`): the prebuilt kernels that
//! scripts/build_wheel.sh puts into the wheel. `FK_KERNELS` picks modules and
//! `FK_ARCHS` architectures (scripts/kernel_compare.sh compares two revisions' images).

#[test]
fn every_kernel_module_compiles_for_sm80_and_sm90() {
    if let Err(e) =
        fusekit::testing::load_nvrtc().and_then(|_| fusekit::testing::cuda_include_dir())
    {
        if std::env::var("FK_REQUIRE_NVRTC").as_deref() == Ok("1") {
            panic!(
                "NVRTC is required (FK_REQUIRE_NVRTC=1) but unavailable: {}",
                e.message
            );
        }
        eprintln!("SKIPPED: NVRTC unavailable: {}", e.message);
        return;
    }
    let (maj, min) = fusekit::testing::nvrtc_version().unwrap();
    // FK_KERNELS=optim,geodesic_christoffel compiles only those modules (for quick
    // iteration): a module whose name is one of the list or starts with one of them
    // followed by '_' (a family: `geodesic` is all 104 geodesic modules). A filter
    // that matches nothing fails rather than passing on zero modules.
    let only = std::env::var("FK_KERNELS").unwrap_or_default();
    let selected = |name: &str| {
        only.split(',')
            .any(|m| !m.is_empty() && (name == m || name.starts_with(&format!("{m}_"))))
    };
    // FK_ARCHS=sm_90 compiles for those architectures only (scripts/kernel_compare.sh)
    let archs = std::env::var("FK_ARCHS").unwrap_or_else(|_| "sm_80,sm_90".into());
    let archs: Vec<&str> = archs.split(',').filter(|a| !a.is_empty()).collect();
    assert!(!archs.is_empty(), "FK_ARCHS names no architecture");
    let prebuilt_out = std::env::var_os("FK_PREBUILT_OUT").map(std::path::PathBuf::from);
    let mut compiled = 0;
    for (name, source) in fusekit::testing::modules() {
        if !only.is_empty() && !selected(name) {
            continue;
        }
        compiled += 1;
        for &arch in &archs {
            let t = std::time::Instant::now();
            let image = fusekit::testing::compile(name, &source(), arch)
                .unwrap_or_else(|e| panic!("{name} for {arch}: {}", e.message));
            // A CUBIN is an ELF file.
            assert_eq!(&image[..4], b"\x7fELF", "{name} for {arch} is not a CUBIN");
            if let Some(dir) = &prebuilt_out {
                fusekit::testing::store_prebuilt(dir, name, &source(), arch, &image)
                    .unwrap_or_else(|e| panic!("{}", e.message));
            }
            eprintln!(
                "{name} {arch}: {} bytes in {:.1}s (NVRTC {maj}.{min})",
                image.len(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    assert!(compiled > 0, "FK_KERNELS={only:?} matched no kernel module");
}
