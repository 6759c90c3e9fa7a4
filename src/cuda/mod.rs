//! The CUDA backend of each op family: one launcher module per family, over the
//! CUDA runtime (`gpu`). A launcher turns a plan (`plan`) into kernel launches and
//! library calls; `launch` holds the helpers they share and the module catalogue.

pub mod elementwise;
#[cfg(test)]
mod emu_build;
pub mod gaussian;
pub mod geodesic;
pub mod launch;
pub mod linalg;
pub mod optim;

use crate::gpu::ModuleSource;

/// Every kernel module: `(name, source)`; sources are embedded in the library.
/// A new op family chains its launcher's `MODULES` here.
pub fn modules() -> impl Iterator<Item = &'static ModuleSource> {
    elementwise::MODULES
        .iter()
        .chain(gaussian::MODULES.iter())
        .chain(linalg::MODULES.iter())
        .chain(geodesic::MODULES.iter())
        .chain(optim::MODULES.iter())
}

/// The source of the module named `name` (the runtime's `Catalog`).
pub fn source_of(name: &str) -> Option<fn() -> String> {
    modules().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
