// Gives the shared library an ELF SONAME, libfusekit.so.<major> (the major of Cargo.toml's
// version), so that programs linked against an installed fusekit (scripts/install.sh)
// record the ABI-compatible name. Programs linked against the build tree record the same
// name, so the profile folder (target/release) also gets the link
// libfusekit.so.<major> -> libfusekit.so.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let major = env::var("CARGO_PKG_VERSION_MAJOR").expect("CARGO_PKG_VERSION_MAJOR");
    let soname = format!("libfusekit.so.{major}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");

    // OUT_DIR is <profile folder>/build/fusekit-<hash>/out
    #[cfg(unix)]
    if let Some(profile) = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"))
        .ancestors()
        .nth(3)
    {
        let link = profile.join(&soname);
        if std::fs::symlink_metadata(&link).is_err() {
            let _ = std::os::unix::fs::symlink("libfusekit.so", &link);
        }
    }
}
