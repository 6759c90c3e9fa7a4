//! Fails when the committed include/fusekit.h differs from what cbindgen generates
//! from the sources. Regenerate with `FUSEKIT_BLESS=1 cargo test --test header`.

use std::path::PathBuf;

#[test]
fn header_is_fresh() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    // FK_VERSION: Cargo.toml's version, the one source (a version bump makes this
    // test fail until the header is regenerated).
    config.after_includes = Some(format!(
        "\n/**\n * The fusekit version of this header: Cargo.toml's version, the one \
         `fk_version_string()`\n * reports as \"fusekit <version>\".\n */\n#define FK_VERSION \"{}\"",
        env!("CARGO_PKG_VERSION")
    ));
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen failed to generate the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let path = root.join("include/fusekit.h");
    if std::env::var_os("FUSEKIT_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/fusekit.h is stale: run `FUSEKIT_BLESS=1 cargo test --test header` and commit the result"
    );
}

#[test]
fn every_symbol_is_prefixed() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let h = std::fs::read_to_string(root.join("include/fusekit.h")).unwrap();
    for line in h.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap();
            assert!(
                name.starts_with("FK_") || name == "FUSEKIT_H",
                "unprefixed macro {name}"
            );
        }
        let closes_typedef = t.starts_with('}') && t.ends_with(';') && t.len() > 2;
        if (t.starts_with("typedef") && !t.ends_with('{')) || closes_typedef {
            let name = t.trim_end_matches(';').split_whitespace().last().unwrap();
            assert!(name.starts_with("fk_"), "unprefixed type {name}");
        }
        // function declarations start at column 0 and contain '('
        if !line.starts_with(' ')
            && !line.starts_with('#')
            && !line.starts_with('/')
            && line.contains('(')
        {
            let before = &line[..line.find('(').unwrap()];
            let name = before
                .rsplit(|c: char| c == ' ' || c == '*')
                .next()
                .unwrap();
            assert!(
                name.starts_with("fk_"),
                "unprefixed function {name} in: {line}"
            );
        }
    }
}
